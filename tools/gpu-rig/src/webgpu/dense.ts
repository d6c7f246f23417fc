/** (c) Dense TFLOP/s per variant over --dense, the choice of the best (plain) variant, then --best-dense with it. */
import { BEST_DENSE, D, DENSE, H, HKV } from './args.js';
import { causalFlops, left, log, median, reps, result, save, timeIt, withTimeout } from './harness.js';
import { checkRows, synth } from './tensors.js';
import { type Variant, bestVariant } from './variants.js';

/** Returns the best plain variant: the fastest correct one with Dawn's default toggles, `rolled` excluded. */
export async function densePhase(variants: Variant[]): Promise<Variant | undefined> {
  const dense: Record<string, unknown>[] = [];
  result.dense = dense;
  const denseOne = async (vr: Variant, n: number, frac: number) => {
    if (vr.stopped) {
      dense.push({ n, variant: vr.label, skipped: vr.stopped });
      return;
    }
    const r = reps(n);
    const callMs = (vr.lastMs ?? 1000) * ((n / (vr.lastN ?? n)) ** 2);
    const projected = callMs * (r + 1) + 1500 + n / 20;
    if (projected > left(frac)) {
      dense.push({ n, variant: vr.label, skipped: `time budget: projected ${(projected / 1000).toFixed(1)} s, ${(left(frac) / 1000).toFixed(1)} s left for the dense phase` });
      log('dense skip', n, vr.label, dense[dense.length - 1].skipped);
      save();
      return;
    }
    const g = { b: vr.b };
    try {
      const q = await synth(g, n, H, 0, 1);
      const k = await synth(g, n, HKV, 1, 2);
      const v = await synth(g, n, HKV, 2, 3);
      const out = vr.b.allocate('f16', [n, H, D]);
      const ts = await withTimeout(timeIt(g, () => vr.b.denseAttention(q, k, v, { out }), r), Math.max(60000, 4 * projected), `dense ${vr.label} n=${n}`);
      const ms = median(ts);
      vr.lastMs = ms;
      vr.lastN = n;
      const check = await checkRows(g, q, k, v, out, undefined, 4);
      const row = { n, variant: vr.label, active: vr.b.attentionKernel, H, Hkv: HKV, d: D, dtype: 'f16', ms, runsMs: ts, tflops: causalFlops(n) / ms / 1e9, check };
      log('dense', row);
      dense.push(row);
      for (const t of [q, k, v, out]) t.dispose();
    } catch (e) {
      vr.stopped = `error at n=${n}`;
      dense.push({ n, variant: vr.label, error: String(e instanceof Error ? (e.stack ?? e.message) : e) });
      log('dense error', n, vr.label, String(e));
    }
    save();
  };
  for (const n of DENSE) for (const vr of variants) await denseOne(vr, n, 0.5);
  const best = bestVariant(variants, dense);
  // What a browser can run: Dawn's default toggles (robustness on).
  const bestPlain = bestVariant(variants.filter((v) => v.form !== 'rolled' && !v.toggles), dense);
  result.bestVariant = best?.label ?? null;
  result.bestPlainVariant = bestPlain?.label ?? null;
  log('best variant', best?.label ?? 'none', 'best plain variant', bestPlain?.label ?? 'none');
  if (bestPlain) for (const n of BEST_DENSE) await denseOne(bestPlain, n, 0.6);
  return bestPlain;
}
