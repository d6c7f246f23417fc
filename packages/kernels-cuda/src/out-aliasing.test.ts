/**
 * `out` over the memory of q, k or v on CUDA (stand-in driver, no GPU): a sliceRows view of an
 * input, or rows of a packed tensor that overlap an input's rows, are refused with
 * INVALID_ARGUMENT naming the input, by the pipeline's entries before any primitive and by the
 * backend's own attention calls before any launch. Rows of one tensor that share no byte with
 * an input are an ordinary output: the attention kernel is handed their address. (The kernels'
 * arithmetic on such outputs is the conformance suite's, on a GPU.)
 */
import {
  type DeviceTensor,
  densePolicy,
  denseRows,
  planPrefill,
  runPlan,
  sparsePrefill,
  varlenPrefill,
} from '@crisp/core';
import { crisp } from '@crisp/presets';
import { createReferenceBackend } from '@crisp/reference';
import { describe, expect, it } from 'vitest';
import { TENSOR_CALLS, countedCalls, outcomesOf, typedErrorOf } from '../../../tooling/counted-calls.js';
import { CudaBackend, type CudaTensor } from './index.js';
import { standInDriver } from './stand-in-driver.js';

const [n, m, H, D, B] = [512, 512, 2, 64, 128];



/** q allocated; k the first n rows of a packed [n + m] tensor; v the last n rows of a packed [m + n] one. */
function problem(be: CudaBackend) {
  const kPacked = be.allocate('bf16', [n + m, H, D]);
  const vPacked = be.allocate('bf16', [m + n, H, D]);
  const q = be.allocate('bf16', [m, H, D]);
  const k = be.sliceRows(kPacked, 0, n);
  const v = be.sliceRows(vPacked, m, n);
  return { kPacked, vPacked, q, k, v };
}

describe('out sharing memory with an input (CUDA, stand-in driver)', () => {
  type Problem = ReturnType<typeof problem>;
  const aliases: [string, 'q' | 'k' | 'v', (be: CudaBackend, x: Problem) => DeviceTensor][] = [
    ['a sliceRows view of all of q', 'q', (be, x) => be.sliceRows(x.q, 0, m)],
    ["rows of k's packed tensor that overlap k's last 8 rows", 'k', (be, x) => be.sliceRows(x.kPacked, n - 8, m)],
    ["rows of v's packed tensor that overlap v's first 8 rows", 'v', (be, x) => be.sliceRows(x.vPacked, 8, m)],
  ];

  for (const [what, input, make] of aliases) {
    it(`${what}: INVALID_ARGUMENT naming inputs.${input}, before any primitive or launch`, async () => {
      const s = standInDriver({ heads: H });
      const be = new CudaBackend(s.libs, { cacheDir: null });
      const x = problem(be);
      const out = make(be, x);
      const inputs = { q: x.q, k: x.k, v: x.v };
      const plan = await planPrefill(be, inputs, densePolicy);
      const c = countedCalls(be, TENSOR_CALLS);
      s.log.length = 0;
      for (const line of await outcomesOf([
        () => sparsePrefill(c.proxy, inputs, crisp, { minSparseLength: 0, out }),
        () => runPlan(c.proxy, plan, inputs, { out }),
        () => varlenPrefill(c.proxy, inputs, { cuSeqlensQ: [0, m] }, crisp, { minSparseLength: 0, out }),
      ])) {
        expect(line, what).toMatch(new RegExp(`^INVALID_ARGUMENT: (sparsePrefill|runPlan|varlenPrefill): options\\.out shares memory with inputs\\.${input} `));
      }
      expect(c.calls(), `${what}: backend primitives called`).toBe(0);
      // the backend's own calls refuse it too
      const mask = { heads: H, numBlocks: n / B, blockSize: B, rows: denseRows(H, n / B) };
      const batch = { blockSize: B, segments: [{ qStart: 0, queries: m, kStart: 0, keys: n }], masks: [mask] };
      for (const line of await outcomesOf([
        () => be.denseAttention(x.q, x.k, x.v, { out }),
        () => be.sparseAttention(x.q, x.k, x.v, mask, { out }),
        () => be.varlenAttention(x.q, x.k, x.v, batch, { out }),
      ])) {
        expect(line, what).toMatch(new RegExp(`^INVALID_ARGUMENT: opts\\.out shares memory with ${input} `));
      }
      expect(s.log.filter((e) => e.kind === 'launch'), `${what}: launches`).toEqual([]);
      be.dispose();
    });
  }

  it("the rows of k's packed tensor after k: accepted, the attention kernel writes at their address", async () => {
    const s = standInDriver({ heads: H, decodeArgs: 4 });
    const be = new CudaBackend(s.libs, { cacheDir: null });
    const x = problem(be);
    const out = be.sliceRows(x.kPacked, n, m) as CudaTensor;
    expect(out.ptr).toBe((x.k as CudaTensor).ptr + n * H * D * 2);
    s.log.length = 0;
    const r = await sparsePrefill(be, { q: x.q, k: x.k, v: x.v }, crisp, { minSparseLength: 0, out });
    expect(r.output).toBe(out);
    const dense = await be.denseAttention(x.q, x.k, x.v, { out });
    expect(dense.output).toBe(out);
    const attention = s.log.filter((e) => e.kind === 'launch' && /^attn|attention/.test(e.name ?? ''));
    expect(attention.length).toBeGreaterThan(0);
    // (q, k, v, out: the first four arguments)
    for (const a of attention) expect(a.args![3][0] + a.args![3][1] * 2 ** 32).toBe(out.ptr);
    be.dispose();
  });

  it('memoryRange: a slice lies inside its parent; another backend’s tensor is WRONG_BACKEND', async () => {
    const s = standInDriver({ heads: H });
    const be = new CudaBackend(s.libs, { cacheDir: null });
    const x = problem(be);
    const whole = be.memoryRange(x.kPacked);
    const k = be.memoryRange(x.k);
    expect(k.resource).toBe(whole.resource);
    expect([k.start, k.end]).toEqual([whole.start, whole.start + n * H * D * 2]);
    const ref = createReferenceBackend();
    expect((await typedErrorOf(() => be.memoryRange(ref.allocate('f32', [1]))))?.code).toBe('WRONG_BACKEND');
    be.dispose();
  });
});
