/** (e) The TF.js peer at the --tfjs sizes. */
import { timeTfjsDenseAttention } from '@crisp/kernels-webgpu/tfjs-peer';
import { D, H, HKV } from './args.js';
import { causalFlops, left, log, result, save } from './harness.js';
import type { Variant } from './variants.js';

/**
 * The peer: dense causal attention as a TensorFlow.js user writes it on the WebGPU backend
 * (@crisp/kernels-webgpu/tfjs-peer), H/HKV heads of D, 1 warm-up and 3 timed runs per size, checked
 * against float64 rows before it is timed; the ratio is to the best variant's dense time.
 */
export async function tfjsPeer(sizes: number[], best: Variant | undefined): Promise<unknown> {
  const rows: unknown[] = [];
  const dense = (result.dense as Record<string, unknown>[]) ?? [];
  for (const n of sizes) {
    if (left(1) < 15000) {
      rows.push({ n, skipped: 'time budget' });
      continue;
    }
    try {
      const r = await timeTfjsDenseAttention({ n, heads: H, kvHeads: HKV, headDim: D, reps: 3, warmup: 1 });
      if ('medianMs' in r) {
        const ours = dense.find((x) => x.n === n && x.variant === best?.label && typeof x.ms === 'number');
        const row = {
          n,
          ms: r.medianMs,
          runsMs: r.runs,
          tflops: causalFlops(n) / r.medianMs / 1e9,
          dtype: r.dtype,
          check: r.check,
          oursVariant: best?.label,
          oursMs: ours?.ms,
          tfjsOverOurs: ours ? r.medianMs / (ours.ms as number) : undefined,
        };
        rows.push(row);
        log('tfjs', row);
      } else {
        rows.push({ n, error: 'absent' in r ? r.absent : r.failed });
        log('tfjs error', n, r);
      }
    } catch (e) {
      rows.push({ n, error: String(e) });
      log('tfjs error', n, String(e));
    }
    result.tfjs = rows;
    save();
  }
  return rows;
}
