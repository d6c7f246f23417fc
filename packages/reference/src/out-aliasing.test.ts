/**
 * `out` over the memory of q, k or v on the reference backend: a view made by sliceRows, or a
 * ReferenceTensor over the same ArrayBuffer, is refused with INVALID_ARGUMENT naming the input,
 * by the pipeline's entries before any primitive runs and by the backend's own attention
 * calls; rows of one buffer that share no byte with an input are an ordinary output.
 */
import {
  type Backend,
  type BlockMask,
  type DeviceTensor,
  type Policy,
  type ProxyStats,
  hostTensor,
  mulberry32,
  planPrefill,
  runPlan,
  sparsePrefill,
  toFloat32,
  varlenPrefill,
} from '@crisp/core';
import { describe, expect, it } from 'vitest';
import { TENSOR_CALLS, countedCalls, outcomesOf, typedErrorOf } from '../../../tooling/counted-calls.js';
import { ReferenceTensor, attentionRows, createReferenceBackend } from './index.js';

const [n, m, H, d, B] = [64, 64, 2, 16, 16];
const ALL_ROWS = Array.from({ length: m }, (_, i) => i);

/** Every head VS, block 0 and the diagonal: a sparse plan at this small n. */
const policy: Policy = {
  name: 'sink-and-diagonal',
  blockSize: B,
  wSink: B,
  wLocal: B,
  kMin: B,
  router: {
    name: 'allVs',
    route: (s: ProxyStats) => ({ routes: Array.from({ length: s.cStruct.length }, () => 'vs' as const), scores: Float64Array.from(s.cStruct), scoreName: 'cStruct' }),
  },
  vs: { name: 'firstBlock', select: () => Int32Array.of(0) },
  pe: { name: 'pe', gamma: 0.9, kMin: B },
};

function values(rows: number, seed: number): Float32Array {
  const r = mulberry32(seed);
  return Float32Array.from({ length: rows * H * d }, () => r() * 2 - 1);
}



/** q, k, v and k's rows inside a packed tensor [n + m, H, d] whose last m rows are free. */
function problem(be: Backend) {
  const host = { q: values(m, 1), k: values(n, 2), v: values(n, 3) };
  const packed = be.allocate('f32', [n + m, H, d]);
  be.write(packed, 0, host.k);
  const q = be.upload(hostTensor('f32', [m, H, d], host.q));
  const k = be.sliceRows!(packed, 0, n);
  const v = be.upload(hostTensor('f32', [n, H, d], host.v));
  return { host, packed, q, k, v };
}

describe('out sharing memory with an input (reference backend)', () => {
  const be = createReferenceBackend();
  const data = (t: DeviceTensor) => (t as ReferenceTensor).data as Float32Array;
  type Problem = ReturnType<typeof problem>;
  const aliases: [string, 'q' | 'k' | 'v', (x: Problem) => DeviceTensor][] = [
    ['a sliceRows view of all of q', 'q', (x) => be.sliceRows!(x.q, 0, m)],
    ["rows of k's packed tensor that overlap k's last 8 rows", 'k', (x) => be.sliceRows!(x.packed, n - 8, m)],
    ["a ReferenceTensor over v's ArrayBuffer", 'v', (x) => new ReferenceTensor(be, 'f32', [m, H, d], new Float32Array(data(x.v).buffer))],
  ];

  for (const [what, input, make] of aliases) {
    it(`${what}: INVALID_ARGUMENT naming inputs.${input} before any primitive, inputs unchanged`, async () => {
      const x = problem(be);
      const out = make(x);
      const inputs = { q: x.q, k: x.k, v: x.v };
      const plan = await planPrefill(be, inputs, policy, { minSparseLength: 0 });
      const c = countedCalls(be, TENSOR_CALLS);
      const layout = { cuSeqlensQ: [0, m] };
      for (const line of await outcomesOf([
        () => sparsePrefill(c.proxy, inputs, policy, { minSparseLength: 0, out }),
        () => runPlan(c.proxy, plan, inputs, { out }),
        () => varlenPrefill(c.proxy, inputs, layout, policy, { minSparseLength: 0, out }),
      ])) {
        expect(line, what).toMatch(new RegExp(`^INVALID_ARGUMENT: (sparsePrefill|runPlan|varlenPrefill): options\\.out shares memory with inputs\\.${input} `));
      }
      expect(c.calls(), `${what}: backend primitives called`).toBe(0);
      // the backend's own calls refuse it too
      const mask = plan.mask as BlockMask;
      const batch = { blockSize: B, segments: [{ qStart: 0, queries: m, kStart: 0, keys: n }], masks: [mask] };
      for (const line of await outcomesOf([
        () => be.denseAttention(x.q, x.k, x.v, { out }),
        () => be.sparseAttention(x.q, x.k, x.v, mask, { out }),
        () => be.varlenAttention!(x.q, x.k, x.v, batch, { out }),
      ])) {
        expect(line, what).toMatch(new RegExp(`^INVALID_ARGUMENT: out shares memory with ${input} `));
      }
      for (const t of ['q', 'k', 'v'] as const) expect(Array.from(data(x[t])), `${what}: ${t}`).toEqual(Array.from(x.host[t]));
    });
  }

  it('out is the same handle as q: still INVALID_ARGUMENT naming inputs.q', async () => {
    const x = problem(be);
    const e = await typedErrorOf(() => sparsePrefill(be, { q: x.q, k: x.k, v: x.v }, policy, { out: x.q }));
    expect(e?.code).toBe('INVALID_ARGUMENT');
    expect(e?.message).toMatch(/options\.out is inputs\.q:/);
  });

  it("the rows of k's packed tensor after k: accepted, the reference's values, k unchanged", async () => {
    const x = problem(be);
    const out = be.sliceRows!(x.packed, n, m);
    const inputs = { q: x.q, k: x.k, v: x.v };
    const r = await sparsePrefill(be, inputs, policy, { minSparseLength: 0, out });
    expect(r.output).toBe(out);
    expect(r.plan.mask).toBeDefined();
    const want = attentionRows(
      hostTensor('f32', [m, H, d], x.host.q),
      hostTensor('f32', [n, H, d], x.host.k),
      hostTensor('f32', [n, H, d], x.host.v),
      ALL_ROWS,
      r.plan.mask,
    ).output;
    const got = toFloat32(await be.download(out));
    for (let i = 0; i < got.length; i++) expect(Math.abs(got[i] - want[i])).toBeLessThan(1e-5);
    // the same values as a run into a fresh output, and as the packed tensor's last rows
    const fresh = await sparsePrefill(be, inputs, policy, { minSparseLength: 0 });
    expect(Array.from(got)).toEqual(Array.from(toFloat32(await be.download(fresh.output))));
    expect(Array.from(data(x.packed).subarray(n * H * d))).toEqual(Array.from(got));
    expect(Array.from(data(x.k))).toEqual(Array.from(x.host.k));
    // dense, through the backend itself
    const dense = await be.denseAttention(x.q, x.k, x.v, { out });
    expect(dense.output).toBe(out);
    const wantDense = attentionRows(
      hostTensor('f32', [m, H, d], x.host.q),
      hostTensor('f32', [n, H, d], x.host.k),
      hostTensor('f32', [n, H, d], x.host.v),
      ALL_ROWS,
    ).output;
    const gotDense = toFloat32(await be.download(out));
    for (let i = 0; i < gotDense.length; i++) expect(Math.abs(gotDense[i] - wantDense[i])).toBeLessThan(1e-5);
  });

  it('memoryRange: a slice lies inside its parent; tensors of other backends are WRONG_BACKEND', async () => {
    const x = problem(be);
    const whole = be.memoryRange!(x.packed);
    const k = be.memoryRange!(x.k);
    expect(k.resource).toBe(whole.resource);
    expect([k.start, k.end]).toEqual([whole.start, whole.start + n * H * d * 4]);
    expect(be.memoryRange!(x.q).resource).not.toBe(whole.resource);
    const other = createReferenceBackend();
    expect((await typedErrorOf(() => other.memoryRange!(x.q)))?.code).toBe('WRONG_BACKEND');
  });
});
