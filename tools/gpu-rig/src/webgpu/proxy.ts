/**
 * (f) The proxy statistics (`proxyStats`, the plan's first and longest part) per variant at
 * the --proxy sizes: each variant's score tiles (the tensor-core ones where the tensor-core
 * attention runs, else FMA), wall time per call (median; the statistics read back), the GPU
 * time per program where the adapter has timestamp queries, and the statistics' largest
 * difference from the first variant's on the same generated inputs (C_struct, the vertical
 * and slash block scores, the row entropy).
 */
import type { ProxyStats, ProxyStatsOptions } from '@crisp/core';
import { D, H, HKV, list, smoke } from './args.js';
import { left, log, median, result, save, timeIt } from './harness.js';
import { synth } from './tensors.js';
import type { Variant } from './variants.js';

/** FLOPs of the two passes over every key: Q̂ Kᵀ twice for b proxy rows. */
const proxyFlops = (n: number, b: number) => 2 * 2 * b * n * H * D;

function maxDiff(a: Float64Array, b: Float64Array): number {
  let e = 0;
  for (let i = 0; i < a.length; i++) e = Math.max(e, Math.abs(a[i] - b[i]));
  return e;
}

export async function proxyPhase(variants: Variant[]): Promise<void> {
  const sizes = list('proxy', smoke ? '512' : '8192,32768,65536');
  const rows: unknown[] = [];
  result.proxy = rows;
  const first = new Map<number, ProxyStats>();
  const opts: ProxyStatsOptions = { blockSize: 128, wSink: 128, wLocal: 128 };
  for (const vr of variants.filter((v) => v.correct && !v.without)) {
    for (const n of sizes) {
      if (left(0.9) < 20000) {
        rows.push({ n, variant: vr.label, skipped: 'time budget' });
        save();
        continue;
      }
      const b = vr.b;
      const g = { b };
      try {
        const q = await synth(g, n, H, 0, 21);
        const k = await synth(g, n, HKV, 1, 22);
        const ts = await timeIt(g, () => b.proxyStats(q, k, opts), n >= 32768 ? 5 : 9);
        const stats = await b.proxyStats(q, k, opts);
        let gpu: { name: string; ms: number }[] | string;
        try {
          const prof = await b.profile(() => b.proxyStats(q, k, opts));
          gpu = prof.profile.kernels.map((x) => ({ name: x.name, ms: x.ms }));
        } catch (e) {
          gpu = `no GPU timestamps: ${e instanceof Error ? e.message : String(e)}`;
        }
        const ms = median(ts);
        const base = first.get(n);
        if (!base) first.set(n, stats);
        const row = {
          n,
          variant: vr.label,
          scoreTiles: b.statisticsKernelFor('f16', D),
          ms,
          runsMs: ts,
          passTflops: Array.isArray(gpu)
            ? proxyFlops(n, stats.proxyRows) / gpu.filter((x) => /^(rowStats|scores)/.test(x.name)).reduce((s, x) => s + x.ms, 0) / 1e9
            : undefined,
          gpu,
          vsFirst: base
            ? {
                cStruct: maxDiff(stats.cStruct, base.cStruct),
                verticalBlocks: maxDiff(stats.verticalBlocks, base.verticalBlocks),
                slashBlocks: maxDiff(stats.slashBlocks, base.slashBlocks),
                rowEntropy: maxDiff(stats.rowEntropy, base.rowEntropy),
              }
            : undefined,
        };
        log('proxy', row);
        rows.push(row);
        for (const t of [q, k]) t.dispose();
      } catch (e) {
        rows.push({ n, variant: vr.label, error: String(e instanceof Error ? (e.stack ?? e.message) : e) });
        log('proxy error', n, vr.label, String(e));
      }
      save();
    }
  }
}
