/**
 * Example (f): chunked prefill against the KV cache. A 2048-token @crisp/synth layer is
 * prefilled in three chunks, as a runtime does with a long prompt: chunk [p, e) passes its own
 * queries with every key and value up to e, and gets its own plan (proxy rows: the chunk's
 * last block; selection over all its keys), with each row's log-sum-exp. With the dense policy
 * the chunks' rows are exactly the rows of one dense prefill of the whole sequence.
 *
 * Run: pnpm --filter @crisp/examples example chunked-prefill
 */
import { type HostTensor, type Policy, sparsePrefill } from '@crisp/core';
import { crisp, dense } from '@crisp/presets';
import { createReferenceBackend } from '@crisp/reference';
import { scenario } from '@crisp/synth';

export interface ChunkedResult {
  readonly cuts: readonly number[];
  /** per chunk of the crisp run: its plan's density (1 for a dense plan) and why dense, if so */
  readonly chunks: readonly { readonly queries: number; readonly keys: number; readonly density: number; readonly denseReason?: string; readonly lseShape: readonly number[] }[];
  /** largest |dense chunk row − the same row of one dense prefill| */
  readonly denseChunksVsWhole: number;
}

/** rows [r0, r1) of a [rows, heads, d] host tensor, sharing its storage */
function rows(t: HostTensor, r0: number, r1: number): HostTensor {
  const per = t.shape[1] * t.shape[2];
  return { dtype: t.dtype, shape: [r1 - r0, t.shape[1], t.shape[2]], data: t.data.subarray(r0 * per, r1 * per) };
}

export async function main(log: (line: string) => void = console.log): Promise<ChunkedResult> {
  const n = 2048;
  const all = scenario('llama-like', { n, heads: 8, kvHeads: 2, headDim: 32, dtype: 'f32', seed: 3 }).rows(0, n);
  const cuts = [0, 700, 1500, n];
  const backend = createReferenceBackend();
  try {
    const run = async (policy: Policy) => {
      const parts = [];
      for (let c = 0; c + 1 < cuts.length; c++) {
        const [p, e] = [cuts[c], cuts[c + 1]];
        // the chunk's queries; the cache's keys and values up to the chunk's end
        const chunk = { q: backend.upload(rows(all.q, p, e)), k: backend.upload(rows(all.k, 0, e)), v: backend.upload(rows(all.v, 0, e)) };
        const res = await sparsePrefill(backend, chunk, policy, { returnLse: true });
        parts.push({ p, e, res, out: (await backend.download(res.output)).data as Float32Array });
      }
      return parts;
    };
    const sparse = await run(crisp);
    for (const { p, e, res } of sparse) {
      log(`chunk [${p}, ${e}): ${e - p} queries over ${e} keys, ${res.plan.denseReason ? `dense (${res.plan.denseReason})` : `density ${res.plan.overallDensity.toFixed(3)}`}, lse [${res.lse?.shape}]`);
    }
    const whole = await sparsePrefill(backend, { q: backend.upload(all.q), k: backend.upload(all.k), v: backend.upload(all.v) }, dense);
    const wholeOut = (await backend.download(whole.output)).data as Float32Array;
    let diff = 0;
    const rowElems = 8 * 32;
    for (const { p, out } of await run(dense)) {
      for (let i = 0; i < out.length; i++) diff = Math.max(diff, Math.abs(out[i] - wholeOut[p * rowElems + i]));
    }
    log(`dense chunks against one dense prefill: largest difference ${diff}`);
    return {
      cuts,
      chunks: sparse.map(({ p, e, res }) => ({
        queries: e - p,
        keys: e,
        density: res.plan.overallDensity,
        ...(res.plan.denseReason ? { denseReason: res.plan.denseReason } : {}),
        lseShape: res.lse?.shape ?? [],
      })),
      denseChunksVsWhole: diff,
    };
  } finally {
    backend.dispose();
  }
}
