/** (d) The crisp-preset sparse pipeline with the best plain variant vs its own dense at the --sparse sizes. */
import { attentionShape, sparsePrefill } from '@crisp/core';
import { crisp } from '@crisp/presets';
import { D, H, HKV, SPARSE } from './args.js';
import { causalFlops, left, log, median, result, save, timeIt } from './harness.js';
import { checkRows, synth } from './tensors.js';
import type { Variant } from './variants.js';

export async function sparsePhase(bestPlain: Variant | undefined): Promise<void> {
  const sparse: unknown[] = [];
  result.sparse = sparse;
  let lastDense: { n: number; ms: number } | undefined = bestPlain?.lastN ? { n: bestPlain.lastN, ms: bestPlain.lastMs! } : undefined;
  for (const n of SPARSE) {
    if (!bestPlain) break;
    const r = n >= 131072 ? 2 : 3;
    const denseGuess = lastDense ? lastDense.ms * (n / lastDense.n) ** 2 : 1000;
    // dense (warm-up + reps), sparse pipeline (warm-up + reps) and attention alone, at ~0.7 density
    const projected = denseGuess * (r + 1) * (1 + 2 * 0.75) + 4000 + n / 10;
    if (projected > left(0.95)) {
      sparse.push({ n, skipped: `time budget: projected ${(projected / 1000).toFixed(1)} s, ${(left(0.95) / 1000).toFixed(1)} s left for the sparse phase` });
      log('sparse skip', n, sparse[sparse.length - 1]);
      save();
      continue;
    }
    const b = bestPlain.b;
    const g = { b };
    try {
      const q = await synth(g, n, H, 0, 11);
      const k = await synth(g, n, HKV, 1, 12);
      const v = await synth(g, n, HKV, 2, 13);
      const out = b.allocate('f16', [n, H, D]);
      attentionShape(q, k, v);
      const denseTs = await timeIt(g, () => b.denseAttention(q, k, v, { out }), r);
      const runs: { planMs: number; attentionMs: number; totalMs: number }[] = [];
      let last: Awaited<ReturnType<typeof sparsePrefill>> | undefined;
      for (let i = 0; i <= r; i++) {
        const t0 = performance.now();
        const res = await sparsePrefill(b, { q, k, v }, crisp, { minSparseLength: 0, out });
        const total = performance.now() - t0;
        if (i > 0) runs.push({ ...res.timings, totalMs: total });
        last = res;
      }
      const plan = last!.plan;
      const attTs = plan.mask ? await timeIt(g, () => b.sparseAttention(q, k, v, plan.mask!, { out }), r) : [];
      const check = await checkRows(g, q, k, v, out, plan.mask, 4);
      const denseMs = median(denseTs);
      lastDense = { n, ms: denseMs };
      const attMs = attTs.length ? median(attTs) : Number.NaN;
      const totalMs = median(runs.map((x) => x.totalMs));
      const planMs = median(runs.map((x) => x.planMs));
      const routes = plan.routing?.routes ?? [];
      const row = {
        n,
        variant: bestPlain.label,
        active: b.attentionKernel,
        policy: plan.policy,
        density: plan.overallDensity,
        vsHeads: routes.filter((x) => x === 'vs').length,
        peHeads: routes.filter((x) => x === 'pe').length,
        denseMs,
        denseTflops: causalFlops(n) / denseMs / 1e9,
        denseRunsMs: denseTs,
        sparseTotalMs: totalMs,
        sparsePlanMs: planMs,
        sparseAttentionMs: attMs,
        sparseRuns: runs,
        speedup: denseMs / totalMs,
        attentionVsDensityTimesDense: attMs / (plan.overallDensity * denseMs),
        totalVsBound: totalMs / (plan.overallDensity * denseMs + planMs),
        check,
      };
      log('sparse', row);
      sparse.push(row);
      for (const t of [q, k, v, out]) t.dispose();
    } catch (e) {
      sparse.push({ n, error: String(e instanceof Error ? (e.stack ?? e.message) : e) });
      log('sparse error', n, String(e));
    }
    save();
  }
}
