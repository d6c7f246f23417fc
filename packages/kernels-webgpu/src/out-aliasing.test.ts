/**
 * `out` in the buffer of q, k or v on WebGPU: a second wrapBuffer of an input's buffer, a
 * sliceRows view of an input, rows of a packed tensor that overlap an input's rows, and rows
 * of an input's buffer that share no byte with it (WebGPU refuses a dispatch that writes a
 * buffer it also reads, wherever the bytes lie) are refused with INVALID_ARGUMENT naming the
 * input, by the pipeline's entries before any primitive runs and by the backend's own
 * attention calls. Inputs that share a buffer with one another, and an output in a buffer of
 * its own, run as usual, equal to the float64 reference.
 */
import { type DeviceTensor, hostTensor, planPrefill, runPlan, sparsePrefill, toFloat32, varlenPrefill } from '@crisp/core';
import { attentionRows, createReferenceBackend } from '@crisp/reference';
import { describe, expect, it } from 'vitest';
import { TENSOR_CALLS, callsWithOut, countedCalls, outcomesOf, typedErrorOf } from '../../../tooling/counted-calls.js';
import type { WebGpuBackend } from './backend.js';
import { Usage } from './runtime/gpu-context.js';
import { conformancePolicies, freshSeed, seededValues, sharedBackend } from './test-support.js';

const { backend, reason } = await sharedBackend();
const [n, m, H, d] = [128, 128, 2, 64];
const policy = conformancePolicies()[0];
const ALL_ROWS = Array.from({ length: m }, (_, i) => i);



/**
 * q uploaded; k the first n rows of a packed tensor [n + m, H, d] (a view at offset 0) whose
 * last m rows are free; v wrapped from a buffer made outside the backend (as TF.js's are).
 */
function problem(b: WebGpuBackend, seed: number) {
  const host = { q: seededValues(seed, m * H * d), k: seededValues(seed + 1, n * H * d), v: seededValues(seed + 2, n * H * d) };
  const packed = b.allocate('f32', [n + m, H, d]);
  b.write(packed, 0, host.k);
  const vBuf = b.gpu.device.createBuffer({ size: host.v.byteLength, usage: Usage.STORAGE | Usage.COPY_SRC | Usage.COPY_DST });
  b.gpu.device.queue.writeBuffer(vBuf, 0, host.v);
  const q = b.upload(hostTensor('f32', [m, H, d], host.q));
  const k = b.sliceRows(packed, 0, n);
  const v = b.wrapBuffer(vBuf, 'f32', [n, H, d]);
  const dispose = () => {
    for (const t of [q, k, v, packed]) t.dispose();
    vBuf.destroy();
  };
  return { host, packed, vBuf, q, k, v, dispose };
}

describe.skipIf(!backend)(`out sharing memory with an input (${reason ?? 'webgpu'})`, () => {
  type Problem = ReturnType<typeof problem>;
  // [what, the input named, the message's form, the output]
  const aliases: [string, 'q' | 'k' | 'v', string, (b: WebGpuBackend, x: Problem) => DeviceTensor][] = [
    ["a second wrapBuffer of q's buffer", 'q', 'shares memory with', (b, x) => b.wrapBuffer(b.bufferOf(x.q), 'f32', [m, H, d])],
    ['a sliceRows view of all of q', 'q', 'shares memory with', (b, x) => b.sliceRows(x.q, 0, m)],
    ["rows of k's packed tensor that overlap k's last 8 rows", 'k', 'shares memory with', (b, x) => b.sliceRows(x.packed, n - 8, m)],
    ["a wrapBuffer of v's buffer", 'v', 'shares memory with', (b, x) => b.wrapBuffer(x.vBuf, 'f32', [m, H, d])],
    ["the rows of k's packed tensor after k (a view: no byte shared)", 'k', 'is in the same buffer as', (b, x) => b.sliceRows(x.packed, n, m)],
  ];

  for (const [what, input, form, make] of aliases) {
    it(`${what}: INVALID_ARGUMENT naming inputs.${input} before any primitive, inputs unchanged`, async () => {
      const b = backend!;
      const x = problem(b, freshSeed());
      const out = make(b, x);
      const inputs = { q: x.q, k: x.k, v: x.v };
      const plan = await planPrefill(b, inputs, policy, { minSparseLength: 0 });
      await b.synchronize();
      const c = countedCalls(b, TENSOR_CALLS);
      for (const line of await outcomesOf([
        () => sparsePrefill(c.proxy, inputs, policy, { minSparseLength: 0, out }),
        () => runPlan(c.proxy, plan, inputs, { out }),
        () => varlenPrefill(c.proxy, inputs, { cuSeqlensQ: [0, m] }, policy, { minSparseLength: 0, out }),
      ])) {
        expect(line, what).toMatch(new RegExp(`^INVALID_ARGUMENT: (sparsePrefill|runPlan|varlenPrefill): options\\.out ${form} inputs\\.${input} `));
      }
      expect(c.calls(), `${what}: backend primitives called`).toBe(0);
      // the backend's own calls refuse it too
      const mask = plan.mask;
      const batch = { blockSize: plan.blockSize, segments: [{ qStart: 0, queries: m, kStart: 0, keys: n }], masks: [mask] };
      const calls = [() => b.denseAttention(x.q, x.k, x.v, { out }), () => b.varlenAttention(x.q, x.k, x.v, batch, { out })];
      if (mask) calls.push(() => b.sparseAttention(x.q, x.k, x.v, mask, { out }));
      for (const line of await outcomesOf(calls)) {
        expect(line, what).toMatch(new RegExp(`^INVALID_ARGUMENT: out ${form} ${input} `));
      }
      for (const t of ['q', 'k', 'v'] as const) {
        expect(Array.from(toFloat32(await b.download(x[t]))), `${what}: ${t}`).toEqual(Array.from(x.host[t]));
      }
      out.dispose();
      x.dispose();
    });
  }

  it('q and k views of one buffer, out a buffer of its own: accepted, the float64 reference\'s values, inputs unchanged', async () => {
    const b = backend!;
    const seed = freshSeed();
    const host = { q: seededValues(seed, m * H * d), k: seededValues(seed + 1, n * H * d), v: seededValues(seed + 2, n * H * d) };
    const packed = b.allocate('f32', [m + n, H, d]);
    b.write(packed, 0, host.q);
    b.write(packed, m * H * d, host.k);
    const q = b.sliceRows(packed, 0, m);
    const k = b.sliceRows(packed, m, n);
    const v = b.upload(hostTensor('f32', [n, H, d], host.v));
    const out = b.allocate('f32', [m, H, d]);
    const hq = hostTensor('f32', [m, H, d], host.q);
    const hk = hostTensor('f32', [n, H, d], host.k);
    const hv = hostTensor('f32', [n, H, d], host.v);
    const close = async (want: Float64Array, what: string) => {
      const got = toFloat32(await b.download(out));
      let err = 0;
      for (let i = 0; i < want.length; i++) err = Math.max(err, Math.abs(got[i] - want[i]));
      expect(err, `${what}, seed ${seed}`).toBeLessThan(2e-5);
    };
    const r = await sparsePrefill(b, { q, k, v }, policy, { minSparseLength: 0, out });
    expect(r.output).toBe(out);
    await close(attentionRows(hq, hk, hv, ALL_ROWS, r.plan.mask).output, 'sparsePrefill');
    const dense = await b.denseAttention(q, k, v, { out });
    expect(dense.output).toBe(out);
    await close(attentionRows(hq, hk, hv, ALL_ROWS).output, 'denseAttention');
    expect(Array.from(toFloat32(await b.download(packed)))).toEqual([...host.q, ...host.k]);
    for (const t of [q, k, v, out, packed]) t.dispose();
  });

  it('memoryRange: views lie inside their parent, the whole buffer in conflict; another backend’s tensor is WRONG_BACKEND', async () => {
    const b = backend!;
    const x = problem(b, 1);
    const whole = b.memoryRange(x.packed);
    const k = b.memoryRange(x.k);
    expect(k.resource).toBe(whole.resource);
    expect([k.start, k.end]).toEqual([0, n * H * d * 4]);
    expect(k.wholeResource).toBe(true);
    expect(b.memoryRange(b.sliceRows(x.packed, n, m))).toEqual({ resource: whole.resource, start: n * H * d * 4, end: (n + m) * H * d * 4, wholeResource: true });
    const ref = createReferenceBackend();
    expect((await typedErrorOf(() => b.memoryRange(ref.allocate('f32', [1]))))?.code).toBe('WRONG_BACKEND');
    x.dispose();
  });
});

/** f16 rows of one head at d 64: 128 bytes, so a slice at row 1 is a copy where the offset alignment is larger */
const ROW_BYTES = d * 2;

describe.skipIf(!backend)(`a row slice as out (${reason ?? 'webgpu'})`, () => {
  const b = backend!;
  const align = b.gpu.limits.minStorageBufferOffsetAlignment;
  const viewStart = Math.max(1, align / ROW_BYTES);
  const f16 = (rows: number, seed: number) => hostTensor('f16', [rows, 1, d], seededValues(seed, rows * d));
  const bits = async (t: DeviceTensor) => Array.from((await b.download(t)).data as Uint16Array);
  // blocks of 64: each query block attends to its own (diagonal) block only
  const mask = { heads: 1, numBlocks: n / 64, blockSize: 64, rows: { rowPtr: Int32Array.from({ length: n / 64 + 1 }, (_, i) => i), cols: Int32Array.from({ length: n / 64 }, (_, i) => i) } };

  it.skipIf(align <= ROW_BYTES)('a copy (rows at an unaligned offset) as out of every attention entry and as write target: INVALID_ARGUMENT, the parent bit for bit as before', async () => {
    const seed = freshSeed();
    const [q, k, v] = [f16(m, seed), f16(n, seed + 1), f16(n, seed + 2)].map((t) => b.upload(t));
    const inputs = { q, k, v };
    const parent = b.upload(f16(m + 1, seed + 3));
    const before = await bits(parent);
    expect(before.every((x) => (x & 0x7fff) !== 0), `seed ${seed}: non-zero values`).toBe(true);
    const out = b.sliceRows(parent, 1, m);
    expect(b.memoryRange(out).resource === b.memoryRange(parent).resource, 'a copy, not a view').toBe(false);
    const plan = await planPrefill(b, inputs, policy, { minSparseLength: 0 });
    const lines = await outcomesOf(callsWithOut(b, { sparsePrefill, runPlan, varlenPrefill }, { inputs, mask, blockSize: 64, plan, policy }, out));
    expect(lines).toHaveLength(6);
    for (const line of lines) expect(line, `seed ${seed}`).toMatch(/^INVALID_ARGUMENT: out is a copy of rows of another tensor \(sliceRows, .*so what is written to it would not reach that tensor/);
    const e = await typedErrorOf(() => b.write(out, 0, Uint16Array.of(0x3c00, 0x3c00)));
    expect(e?.code).toBe('INVALID_ARGUMENT');
    expect(e?.message).toMatch(/^the write target is a copy of rows of another tensor/);
    await b.synchronize();
    expect(await bits(parent), `seed ${seed}: the parent`).toEqual(before);
    for (const t of [out, parent, q, k, v]) t.dispose();
  });

  it('a view (rows at an aligned offset) as out writes its parent\'s rows: the output of a tensor of its own, the other rows as before', async () => {
    const seed = freshSeed();
    const [q, k, v] = [f16(m, seed), f16(n, seed + 1), f16(n, seed + 2)].map((t) => b.upload(t));
    const rows = viewStart + m + 1;
    const parent = b.upload(f16(rows, seed + 3));
    const before = await bits(parent);
    const out = b.sliceRows(parent, viewStart, m);
    expect(b.memoryRange(out).resource === b.memoryRange(parent).resource, 'a view').toBe(true);
    for (const [call, run] of [
      ['denseAttention', (o?: DeviceTensor) => b.denseAttention(q, k, v, o ? { out: o } : {})],
      ['sparseAttention', (o?: DeviceTensor) => b.sparseAttention(q, k, v, mask, o ? { out: o } : {})],
    ] as const) {
      const alone = await run();
      const want = await bits(alone.output);
      expect((await run(out)).output).toBe(out);
      const after = await bits(parent);
      const msg = `${call}, seed ${seed}`;
      expect(after.slice(viewStart * d, (viewStart + m) * d), msg).toEqual(want);
      expect(after.slice(0, viewStart * d), msg).toEqual(before.slice(0, viewStart * d));
      expect(after.slice((viewStart + m) * d), msg).toEqual(before.slice((viewStart + m) * d));
      alone.output.dispose();
    }
    // write through the view lands in the parent too
    b.write(out, 0, Uint16Array.of(0x3c00, 0x4000));
    expect((await bits(parent)).slice(viewStart * d, viewStart * d + 2)).toEqual([0x3c00, 0x4000]);
    for (const t of [out, parent, q, k, v]) t.dispose();
  });
});
