/**
 * Example (e): a ragged batch. Three requests of different lengths (@crisp/synth llama-like
 * layers) are packed along the first axis, as a runtime batches prompts, and prefilled in one
 * `varlenPrefill` call: each request gets its own routes and blocks (the short one goes dense,
 * its plan's reason 'min-length': too short to skip anything), and the batch's attention runs
 * in one backend call. Each request's rows equal a `sparsePrefill` of that request alone.
 *
 * Run: pnpm --filter @crisp/examples example varlen-batch
 */
import { type HostTensor, sparsePrefill, varlenPrefill } from '@crisp/core';
import { crisp } from '@crisp/presets';
import { createReferenceBackend } from '@crisp/reference';
import { scenario } from '@crisp/synth';

export interface VarlenBatchResult {
  readonly lengths: readonly number[];
  readonly cuSeqlens: readonly number[];
  /** per request: 'dense' (its plan's reason) or its routes */
  readonly plans: readonly string[];
  readonly densities: readonly number[];
  /** largest |batch row − the request prefilled alone| over every request */
  readonly maxDiffFromAlone: number;
  readonly outputShape: readonly number[];
}

/** Concatenate tensors along the first axis. */
function pack(parts: readonly HostTensor[]): HostTensor {
  const rows = parts.reduce((a, p) => a + p.shape[0], 0);
  const data = new Float32Array(parts.reduce((a, p) => a + p.data.length, 0));
  let at = 0;
  for (const p of parts) {
    data.set(p.data as Float32Array, at);
    at += p.data.length;
  }
  return { dtype: 'f32', shape: [rows, ...parts[0].shape.slice(1)], data };
}

export async function main(log: (line: string) => void = console.log): Promise<VarlenBatchResult> {
  const [H, Hkv, d] = [8, 2, 32];
  // the preset plans sparsely above max(2B, kMin) = 1024 tokens; 300 goes dense
  const lengths = [2048, 300, 1536];
  const requests = lengths.map((n, i) => scenario('llama-like', { n, heads: H, kvHeads: Hkv, headDim: d, dtype: 'f32', seed: 10 + i }).rows(0, n));
  const cuSeqlens = [0];
  for (const n of lengths) cuSeqlens.push(cuSeqlens[cuSeqlens.length - 1] + n);
  const backend = createReferenceBackend();
  try {
    const q = backend.upload(pack(requests.map((r) => r.q)));
    const k = backend.upload(pack(requests.map((r) => r.k)));
    const v = backend.upload(pack(requests.map((r) => r.v)));
    // FlashAttention's cu_seqlens: request s holds rows cuSeqlens[s] .. cuSeqlens[s + 1]
    const res = await varlenPrefill(backend, { q, k, v }, { cuSeqlensQ: cuSeqlens }, crisp);
    const out = (await backend.download(res.output)).data as Float32Array;
    const plans = res.plans.map((p) => (p.denseReason ? `dense (${p.denseReason})` : (p.routing?.routes.join(' ') ?? '')));
    let maxDiff = 0;
    for (let s = 0; s < lengths.length; s++) {
      const r = requests[s];
      const alone = await sparsePrefill(backend, { q: backend.upload(r.q), k: backend.upload(r.k), v: backend.upload(r.v) }, crisp);
      const mine = (await backend.download(alone.output)).data as Float32Array;
      const base = cuSeqlens[s] * H * d;
      for (let i = 0; i < mine.length; i++) maxDiff = Math.max(maxDiff, Math.abs(out[base + i] - mine[i]));
      log(`request ${s}: ${lengths[s]} tokens, ${plans[s]}, density ${res.plans[s].overallDensity.toFixed(3)}`);
    }
    log(`batch: ${cuSeqlens[cuSeqlens.length - 1]} tokens, density ${res.overallDensity.toFixed(3)}, largest difference from each request alone ${maxDiff}`);
    return {
      lengths,
      cuSeqlens,
      plans,
      densities: res.plans.map((p) => p.overallDensity),
      maxDiffFromAlone: maxDiff,
      outputShape: res.output.shape,
    };
  } finally {
    backend.dispose();
  }
}
