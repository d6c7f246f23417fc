/**
 * Phase kernels: a self-check of every attention layout against w32 at a small size, then
 * the dense and sparse timing sweep of the layouts that passed.
 */
import { type DeviceTensor, numBlocks, toFloat32 } from '@crisp/core';
import { budget, reps, sweepNs, layouts, checkN } from './args.js';
import { be, variant, timeIt } from './backend.js';
import { elapsed, log, step, median, causalFlops } from './harness.js';
import { H, Hkv, D, B, patternMask } from './shapes.js';

/** why a layout failed its self-check (build error, launch error, wrong output); absent when it passed */
const layoutFailed = new Map<string, string>();

/** Max |a − b| over max |b| (host, float64 sums), plus the device's norm-relative error and NaN/Inf count. */
async function compareOutputs(a: DeviceTensor, ref: DeviceTensor) {
  const x = toFloat32(await be.download(a));
  const y = toFloat32(await be.download(ref));
  let maxDiff = 0;
  let maxRef = 0;
  let worst = -1;
  for (let i = 0; i < x.length; i++) {
    const d = Math.abs(x[i] - y[i]);
    if (!(d <= maxDiff)) {
      maxDiff = Number.isNaN(d) ? Number.POSITIVE_INFINITY : d;
      worst = i;
    }
    maxRef = Math.max(maxRef, Math.abs(y[i]));
  }
  return { maxRelErr: maxDiff / maxRef, worstIndex: worst, ...be.relError(a, ref) };
}

export async function kernelsCheckPhase(): Promise<void> {
  // Self-check before any timing: every layout against w32 at a small size, dense (bf16 and
  // f16, and chunked prefill with a partial last block), sparse at block sizes 128 and 64. A
  // layout that does not build, fails to launch or differs is reported and not timed.
  await step(`check_${checkN}`, async () => {
    const n = checkN;
    const out: Record<string, unknown> = { n };
    const mc = 1000;
    const nc = n + 37;
    const t = {
      q: be.allocate('bf16', [n, H, D]),
      k: be.allocate('bf16', [n, Hkv, D]),
      v: be.allocate('bf16', [n, Hkv, D]),
      qh: be.allocate('f16', [n, H, D]),
      kh: be.allocate('f16', [n, Hkv, D]),
      vh: be.allocate('f16', [n, Hkv, D]),
      qc: be.allocate('bf16', [mc, H, D]),
      kc: be.allocate('bf16', [nc, Hkv, D]),
      vc: be.allocate('bf16', [nc, Hkv, D]),
    };
    const outShape = (c: string) => (c === 'chunk' ? [mc, H, D] : [n, H, D]);
    const outType = (c: string) => (c === 'f16' ? 'f16' : 'bf16');
    const outs = Object.fromEntries(
      ['dense', 'f16', 'chunk', 'sp128', 'sp64'].map((c) => [c, [0, 1].map(() => be.allocate(outType(c), outShape(c)))]),
    );
    try {
      be.fillHash(t.q, 11, 2);
      be.fillHash(t.k, 12, 2);
      be.fillHash(t.v, 13, 1);
      be.fillHash(t.qc, 14, 2);
      be.fillHash(t.kc, 15, 2);
      be.fillHash(t.vc, 16, 1);
      be.fillHash(t.qh, 17, 2);
      be.fillHash(t.kh, 18, 2);
      be.fillHash(t.vh, 19, 1);
      const m128 = patternMask(numBlocks(n, 128), 7, 5, 128);
      const m64 = patternMask(numBlocks(n, 64), 7, 5, 64);
      const cases: Record<string, (o: DeviceTensor) => Promise<unknown>> = {
        dense: (o) => be.denseAttention(t.q, t.k, t.v, { out: o }),
        f16: (o) => be.denseAttention(t.qh, t.kh, t.vh, { out: o }),
        chunk: (o) => be.denseAttention(t.qc, t.kc, t.vc, { out: o }),
        sp128: (o) => be.sparseAttention(t.q, t.k, t.v, m128, { out: o }),
        sp64: (o) => be.sparseAttention(t.q, t.k, t.v, m64, { out: o }),
      };
      be.attentionVariant = 'w32';
      for (const [c, run] of Object.entries(cases)) {
        be.poison(outs[c][0]);
        await run(outs[c][0]);
      }
      // lse (natural log, f32 [H, n]) of the dense case, the same math in another order
      const lseOf = async (o: DeviceTensor) => {
        const res = await be.denseAttention(t.q, t.k, t.v, { out: o, returnLse: true });
        const l = res.lse as DeviceTensor;
        try {
          return toFloat32(await be.download(l));
        } finally {
          l.dispose();
        }
      };
      const lseRef = await lseOf(outs.dense[0]);
      await be.synchronize();
      for (const name of layouts) {
        const r: Record<string, unknown> = {};
        out[name] = r;
        try {
          be.attentionVariant = name;
          r.fallback = be.attentionVariantFallback;
          for (const [c, run] of Object.entries(cases)) {
            be.poison(outs[c][1]);
            await run(outs[c][1]);
            await be.synchronize();
            const e = await compareOutputs(outs[c][1], outs[c][0]);
            r[c] = e;
            // bf16 rounding of another f32 summation order differs by ~1e-3
            if (!(e.maxRelErr < 2e-2 && e.relErr < 5e-3 && e.nonFinite === 0)) {
              layoutFailed.set(name, `${c}: maxRelErr ${e.maxRelErr} relErr ${e.relErr} nonFinite ${e.nonFinite} (worst index ${e.worstIndex})`);
            }
          }
          const l = await lseOf(outs.dense[1]);
          let lseMaxAbs = 0;
          for (let i = 0; i < l.length; i++) {
            const d = Math.abs(l[i] - lseRef[i]);
            lseMaxAbs = Number.isNaN(d) ? Number.POSITIVE_INFINITY : Math.max(lseMaxAbs, d);
          }
          r.lseMaxAbsDiff = lseMaxAbs;
          if (!(lseMaxAbs < 1e-3)) layoutFailed.set(name, `lse: max |Δ| ${lseMaxAbs}`);
        } catch (e) {
          const err = e as Error & { details?: { log?: string } };
          r.error = String(err?.stack ?? e);
          if (err?.details?.log) r.buildLog = err.details.log;
          layoutFailed.set(name, `error: ${err?.message ?? e}`.slice(0, 2000));
        }
        log(`check ${name} n=${n}: ${layoutFailed.get(name) ?? 'ok'} ${JSON.stringify(Object.fromEntries(Object.keys(cases).map((c) => [c, (r[c] as { maxRelErr?: number })?.maxRelErr])))}`);
      }
      be.attentionVariant = variant;
      out.failed = Object.fromEntries(layoutFailed);
      return out;
    } finally {
      for (const x of [...Object.values(t), ...Object.values(outs).flat()]) x.dispose();
    }
  });
}

export async function kernelsPhase(): Promise<void> {
  // Every attention layout on the same inputs: dense time, TFLOP/s, output vs the w32 layout
  // (same math, f32 sums in another order), and a regular sparse mask's per-block cost.
  for (const n of sweepNs) {
    await step(`layouts_${n}`, async () => {
      const Nb = numBlocks(n, B);
      const q = be.allocate('bf16', [n, H, D]);
      const k = be.allocate('bf16', [n, Hkv, D]);
      const v = be.allocate('bf16', [n, Hkv, D]);
      const ref = be.allocate('bf16', [n, H, D]);
      const o = be.allocate('bf16', [n, H, D]);
      const out: Record<string, unknown> = { n };
      try {
        be.fillHash(q, 1, 2);
        be.fillHash(k, 2, 2);
        be.fillHash(v, 3, 1);
        be.attentionVariant = 'w32';
        be.poison(ref);
        await be.denseAttention(q, k, v, { out: ref });
        const pm = patternMask(Nb, 16, 64);
        const rows = await be.expandMask(pm);
        const blocks = rows.rowPtr[rows.rowPtr.length - 1];
        const causal = H * ((Nb * (Nb + 1)) / 2);
        const big = n >= 262144;
        // the sparse reference: w32 on the same pattern mask
        const refSp = be.allocate('bf16', [n, H, D]);
        be.poison(refSp);
        await be.sparseAttention(q, k, v, pm, { out: refSp });
        try {
          for (const name of layouts) {
            if (elapsed() > budget) break;
            if (layoutFailed.has(name)) {
              out[name] = { skipped: `failed its self-check: ${layoutFailed.get(name)}` };
              continue;
            }
            try {
              be.attentionVariant = name;
              be.poison(o);
              const dense = await timeIt(() => be.denseAttention(q, k, v, { out: o }), big ? 2 : reps, 1);
              const err = be.relError(o, ref);
              be.poison(o);
              const sp = await timeIt(() => be.sparseAttention(q, k, v, pm, { out: o }), big ? 2 : reps, 1);
              const spErr = be.relError(o, refSp);
              const dMs = median(dense);
              const sMs = median(sp);
              out[name] = {
                fallback: be.attentionVariantFallback,
                denseMs: dense,
                denseTflops: causalFlops(n, H, D) / (dMs * 1e-3) / 1e12,
                vsV1: err,
                sparseVsV1: spErr,
                sparsePatternMs: sp,
                patternDensity: blocks / causal,
                perBlockSparseOverDense: sMs / blocks / (dMs / causal),
              };
              log(
                `layout ${name} n=${n}: dense ${dMs.toFixed(2)} ms (${(causalFlops(n, H, D) / (dMs * 1e-3) / 1e12).toFixed(0)} TFLOP/s) vs w32 relErr ${err.relErr.toExponential(2)} nonfinite ${err.nonFinite}; pattern ${sMs.toFixed(2)} ms per-block ${(sMs / blocks / (dMs / causal)).toFixed(3)}x dense, vs w32 relErr ${spErr.relErr.toExponential(2)} nonfinite ${spErr.nonFinite}`,
              );
            } catch (e) {
              out[name] = { error: String((e as Error)?.stack ?? e) };
              log(`layout ${name} n=${n}: ERROR ${(e as Error)?.message ?? e}`);
            }
          }
        } finally {
          refSp.dispose();
        }
        be.attentionVariant = variant;
        return out;
      } finally {
        for (const t of [q, k, v, ref, o]) t.dispose();
      }
    });
  }
}
