/** (b) Correctness of every variant at --check n, dense and sparse, against float64 on sampled (row, head) pairs. */
import { CHECK_N, D, ERR_OK, H, HKV, smoke } from './args.js';
import { log, result, save, withTimeout } from './harness.js';
import { checkMask, checkRows, synth } from './tensors.js';
import type { Variant } from './variants.js';

export async function correctnessPhase(variants: Variant[]): Promise<void> {
  const checks: unknown[] = [];
  result.correctness = checks;
  for (const vr of variants) {
    const g = { b: vr.b };
    const n = CHECK_N;
    const row: Record<string, unknown> = { variant: vr.label, n };
    if (vr.stopped) {
      row.skipped = vr.stopped;
      vr.correct = false;
      checks.push(row);
      log('check', row);
      save();
      continue;
    }
    try {
      await withTimeout(
        (async () => {
          const q = await synth(g, n, H, 0, 31);
          const k = await synth(g, n, HKV, 1, 32);
          const v = await synth(g, n, HKV, 2, 33);
          const out = vr.b.allocate('f16', [n, H, D]);
          await vr.b.denseAttention(q, k, v, { out });
          await vr.b.synchronize();
          vr.active = vr.b.attentionKernel;
          row.active = vr.active;
          row.note = vr.b.kernelNote;
          const t0 = performance.now();
          await vr.b.denseAttention(q, k, v, { out });
          await vr.b.synchronize();
          vr.lastMs = performance.now() - t0;
          vr.lastN = n;
          row.denseMs = vr.lastMs;
          row.dense = await checkRows(g, q, k, v, out, undefined, 8);
          // Block-sparse path of the same kernel: a fixed mask with sink, diagonal and about
          // half of the other blocks (the crisp plan at this n may route every head to dense).
          const mask = checkMask(n);
          await vr.b.sparseAttention(q, k, v, mask, { out });
          row.sparse = await checkRows(g, q, k, v, out, mask, 8);
          const worst = Math.max((row.dense as { maxError: number }).maxError, (row.sparse as { maxError?: number }).maxError ?? 0);
          vr.correct = worst < ERR_OK && vr.active === vr.kernel;
          row.correct = vr.correct;
          for (const t of [q, k, v, out]) t.dispose();
        })(),
        smoke ? 300000 : 60000,
        `check ${vr.label}`,
      );
    } catch (e) {
      row.error = String(e instanceof Error ? (e.stack ?? e.message) : e);
      vr.correct = false;
      vr.stopped = 'the correctness run failed (see correctness)';
    }
    if (!vr.stopped && vr.active !== vr.kernel) vr.stopped = `runs ${vr.active}, not ${vr.kernel}: ${vr.b.kernelNote ?? 'not eligible on this adapter'}`;
    log('check', row);
    checks.push(row);
    save();
  }
}
