/**
 * Faults and misuse on the WebGPU backend: limits refused before anything is allocated,
 * tensors and `out` misused, hostile masks, and out-of-memory and launch failures injected
 * into a real device. Each case asserts the exact code, that the backend answers the call
 * after it, and that the live buffer count is back where it started.
 */
import { type BlockMask, expandToRows, hostTensor, type Policy, planPrefill, releasePlan, toFloat32, validateMask, vsListsFromArrays } from '@crisp/core';
import { crisp } from '@crisp/presets';
import { globalCoverage, noiseFloor } from '@crisp/select';
import { createReferenceBackend } from '@crisp/reference';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { type WebGpuBackend, createWebGpuBackend } from './backend.js';
import { type Faults, code, faultyDevice, freshSeed, seededValues, sharedBackend } from './test-support.js';

const { backend, reason } = await sharedBackend();
const ref = createReferenceBackend();

/** Every buffer made since `before` is gone once the queue has drained. */
async function expectNoLeak(b: WebGpuBackend, before: number): Promise<void> {
  await b.synchronize();
  expect(b.gpu.liveBuffers.buffers).toBe(before);
}

const vsMask = (H: number, Nb: number, B: number): BlockMask => ({
  heads: H,
  numBlocks: Nb,
  blockSize: B,
  vs: vsListsFromArrays(
    Array.from({ length: H }, (_, h) => [0, h % Nb]),
    Array.from({ length: H }, () => [0, Math.min(1, Nb - 1)]),
  ),
});

describe.skipIf(!backend)(`WebGPU faults and misuse${reason ? ` (skipped: ${reason})` : ''}`, () => {
  const b = backend!;
  /** seeded values of `shape` uploaded to `on` */
  const seeded = (on: WebGpuBackend, shape: number[], seed: number, dtype: 'f32' | 'f16' = 'f32') =>
    on.upload(hostTensor(dtype, shape, seededValues(seed, shape.reduce((x, y) => x * y, 1))));
  const t = (shape: number[], seed: number, dtype: 'f32' | 'f16' = 'f32') => seeded(b, shape, seed, dtype);

  it('limits: oversized tensors and masks are LIMIT_EXCEEDED before anything is allocated', async () => {
    await b.synchronize();
    const before = b.gpu.liveBuffers.buffers;
    const max = b.gpu.limits.maxBufferSize;
    const e = await code(() => b.allocate('f32', [Math.floor(max / 4) + 4]));
    expect(e).toBe('LIMIT_EXCEEDED');
    expect(await code(() => b.allocate('f32', [2 ** 20, 2 ** 20, 2 ** 10]))).toBe('LIMIT_EXCEEDED');
    expect(await code(() => b.allocate('f32', [2 ** 30, 2 ** 30, 2 ** 30]))).toBe('SHAPE_MISMATCH'); // over 2^53 elements
    // a mask of a billion rows with empty lists: refused at once, not looped over
    const t0 = performance.now();
    expect(await code(b.expandMask(vsMask(1, 2 ** 30, 64)))).toBe('LIMIT_EXCEEDED');
    expect(performance.now() - t0).toBeLessThan(1000);
    expect(b.gpu.liveBuffers.buffers).toBe(before);
  });

  it('limits: proxyStats and peBlockRows buffers past the binding size are LIMIT_EXCEEDED before any work', async () => {
    await b.synchronize();
    const before = b.gpu.liveBuffers.buffers;
    // q [64, 256, 64] and k [2^21, 1, 64] f16 fit; the per-head token scores (256 x 2^21 x 4
    // bytes) and one head's PE map (2^15 blocks: 2 GiB) do not. Never filled.
    const n = 2 ** 21;
    const q = b.allocate('f16', [64, 256, 64]);
    const k = b.allocate('f16', [n, 1, 64]);
    const err = await b.proxyStats(q, k, { blockSize: 64, wSink: 64, wLocal: 64 }).catch((x: unknown) => x);
    expect((err as { code?: string }).code).toBe('LIMIT_EXCEEDED');
    expect((err as { details?: { limit?: string } }).details?.limit).toBe('maxStorageBufferBindingSize');
    expect(await code(b.peBlockRows(q, k, { blockSize: 64, gamma: 0.9, heads: [0] }))).toBe('LIMIT_EXCEEDED');
    // nothing beyond the two tensors was made
    expect(b.gpu.liveBuffers.buffers).toBe(before + 2);
    q.dispose();
    k.dispose();
    await expectNoLeak(b, before);
  });

  it('hostile shapes and dtypes: SHAPE_MISMATCH, DTYPE_MISMATCH, UNSUPPORTED; nothing allocated', async () => {
    await b.synchronize();
    const before = b.gpu.liveBuffers.buffers;
    for (const shape of [[1.5], [-1], [Number.NaN], 'x', [2 ** 60, 'a'], null]) {
      expect(await code(() => b.allocate('f32', shape as never)), JSON.stringify(shape)).toBe('SHAPE_MISMATCH');
    }
    for (const dtype of ['f64', '__proto__', 'constructor', '', 3]) {
      expect(await code(() => b.allocate(dtype as never, [4])), String(dtype)).toBe('DTYPE_MISMATCH');
    }
    expect(await code(() => b.allocate('bf16', [4]))).toBe('UNSUPPORTED');
    expect(await code(() => b.upload(null as never))).toBe('INVALID_ARGUMENT');
    expect(await code(() => b.upload({ dtype: 'f32', shape: [4], data: new Uint16Array(4) }))).toBe('DTYPE_MISMATCH');
    expect(b.gpu.liveBuffers.buffers).toBe(before);
  });

  it('tensor misuse: null, foreign, disposed, another backend on the same device', async () => {
    const s = freshSeed();
    const q = t([64, 2, 64], s);
    const k = t([64, 1, 64], s + 1);
    for (const bad of [null, undefined, 7, 'q']) {
      expect(await code(b.denseAttention(bad as never, k, k)), String(bad)).toBe('INVALID_ARGUMENT');
      expect(await code(b.download(bad as never)), String(bad)).toBe('INVALID_ARGUMENT');
      expect(await code(() => b.write(bad as never, 0, new Float32Array(1))), String(bad)).toBe('INVALID_ARGUMENT');
      expect(await code(b.proxyStats(q, bad as never, { blockSize: 64, wSink: 64, wLocal: 64 }))).toBe('INVALID_ARGUMENT');
    }
    expect(await code(() => b.write(q, 0, null as never))).toBe('INVALID_ARGUMENT');
    expect(await code(() => b.write(q, 0.5, new Float32Array(1)))).toBe('INVALID_ARGUMENT');
    const other = await createWebGpuBackend({ device: b.gpu.device });
    const theirs = other.upload(hostTensor('f32', [64, 1, 64], seededValues(s, 64 * 64)));
    expect(await code(b.denseAttention(q, theirs, theirs))).toBe('WRONG_BACKEND');
    other.dispose();
    expect(await code(other.denseAttention(theirs, theirs, theirs))).toBe('DISPOSED');
    const gone = t([64, 1, 64], s + 2);
    gone.dispose();
    expect(await code(b.denseAttention(q, k, gone))).toBe('DISPOSED');
    q.dispose();
    k.dispose();
  });

  it('out: aliasing an input, wrong dtype, disposed, other options; inputs left as they were', async () => {
    const s = freshSeed();
    const qv = seededValues(s, 64 * 2 * 64);
    const q = b.upload(hostTensor('f32', [64, 2, 64], qv));
    const kv = t([64, 2, 64], s + 1); // Hkv = H: k and v have out's shape
    expect(await code(b.denseAttention(q, kv, kv, { out: q }))).toBe('INVALID_ARGUMENT');
    expect(await code(b.denseAttention(q, kv, kv, { out: kv }))).toBe('INVALID_ARGUMENT');
    const mask = vsMask(2, 1, 64);
    expect(await code(b.sparseAttention(q, kv, kv, mask, { out: q }))).toBe('INVALID_ARGUMENT');
    expect(Array.from(toFloat32(await b.download(q)))).toEqual(Array.from(qv));
    const o16 = b.allocate('f16', [64, 2, 64]);
    expect(await code(b.denseAttention(q, kv, kv, { out: o16 }))).toBe('DTYPE_MISMATCH');
    const o = b.allocate('f32', [64, 2, 64]);
    o.dispose();
    expect(await code(b.denseAttention(q, kv, kv, { out: o }))).toBe('DISPOSED');
    expect(await code(b.denseAttention(q, kv, kv, { returnLse: 'yes' as never }))).toBe('INVALID_ARGUMENT');
    expect(await code(b.denseAttention(q, kv, kv, null as never))).toBe('INVALID_ARGUMENT');
    expect(await code(b.denseAttention(q, kv, kv, { scale: Number.NaN }))).toBe('INVALID_ARGUMENT');
    const prepared = { backend: 'cuda', heads: 2, numBlocks: 1, blockSize: 64, released: false } as never;
    expect(await code(b.sparseAttention(q, kv, kv, mask, { prepared }))).toBe('WRONG_BACKEND');
    for (const x of [q, kv, o16]) x.dispose();
  });

  it('property: corrupted masks are INVALID_MASK (or INVALID_ARGUMENT for the block size) before any GPU work', async () => {
    const H = 2;
    const n = 256;
    const B = 64;
    const Nb = n / B;
    const s = freshSeed();
    const q = t([n, H, 64], s);
    const k = t([n, 1, 64], s + 1);
    await b.synchronize();
    const before = b.gpu.liveBuffers.buffers;
    // a valid mask: every causal block of every head
    const full = (): { rowPtr: number[]; cols: number[] } => {
      const rowPtr = [0];
      const cols: number[] = [];
      for (let h = 0; h < H; h++) {
        for (let I = 0; I < Nb; I++) {
          for (let J = 0; J <= I; J++) cols.push(J);
          rowPtr.push(cols.length);
        }
      }
      return { rowPtr, cols };
    };
    const corruption = fc.oneof(
      fc.record({ kind: fc.constant('col'), at: fc.nat(), value: fc.oneof(fc.integer({ min: -5, max: -1 }), fc.integer({ min: Nb, max: 2 ** 31 - 1 })) }),
      fc.record({ kind: fc.constant('future'), at: fc.nat() }),
      fc.record({ kind: fc.constant('duplicate'), at: fc.nat() }),
      fc.record({ kind: fc.constant('rowPtr'), at: fc.nat(), value: fc.integer({ min: -3, max: 100 }) }),
      fc.record({ kind: fc.constant('rowPtrLength'), at: fc.integer({ min: -2, max: 2 }).filter((x) => x !== 0) }),
      fc.record({ kind: fc.constant('heads'), value: fc.oneof(fc.integer({ min: -1, max: 8 }), fc.double()).filter((x) => x !== H) }),
      fc.record({ kind: fc.constant('numBlocks'), value: fc.integer({ min: 0, max: 9 }).filter((x) => x !== Nb) }),
      fc.record({ kind: fc.constant('blockSize'), value: fc.constantFrom(0, 32, 100, 256, Number.NaN) }),
      fc.record({ kind: fc.constant('colsType'), value: fc.constantFrom('array', 'float') }),
      fc.record({ kind: fc.constant('vertical'), at: fc.nat(), value: fc.oneof(fc.integer({ min: Nb, max: 1000 }), fc.constant(-1)) }),
      fc.record({ kind: fc.constant('empty') }),
    );
    let tried = 0;
    await fc.assert(
      fc.asyncProperty(corruption, async (c) => {
        tried++;
        const { rowPtr, cols } = full();
        let mask: Record<string, unknown> = { heads: H, numBlocks: Nb, blockSize: B };
        let colsArr: unknown;
        const at = 'at' in c ? c.at : 0;
        switch (c.kind) {
          case 'col':
            cols[at % cols.length] = c.value as number;
            break;
          case 'future': {
            // the last entry of a row one past its query block
            const r = 1 + (at % (rowPtr.length - 1));
            cols[rowPtr[r] - 1] = ((r - 1) % Nb) + 1;
            break;
          }
          case 'duplicate': {
            // inside a row of two or more entries (query block I >= 1)
            const rowsWithTwo = Array.from({ length: H * Nb }, (_, r) => r).filter((r) => r % Nb >= 1);
            const r = rowsWithTwo[at % rowsWithTwo.length];
            cols[rowPtr[r] + 1] = cols[rowPtr[r]];
            break;
          }
          case 'rowPtr': {
            const i = at % rowPtr.length;
            if (rowPtr[i] === c.value) rowPtr[i] = -1;
            else rowPtr[i] = c.value as number;
            break;
          }
          case 'rowPtrLength':
            if ((c.at as number) > 0) rowPtr.push(cols.length);
            else rowPtr.splice(1, -(c.at as number));
            break;
          case 'heads':
          case 'numBlocks':
          case 'blockSize':
            mask = { ...mask, [c.kind]: c.value };
            break;
          case 'colsType':
            colsArr = c.value === 'array' ? [...cols] : Float32Array.from(cols);
            break;
          case 'vertical': {
            const v = [[0, 1], [0]];
            v[at % 2].push(c.value as number);
            mask.vs = {
              verticalPtr: Int32Array.from([0, v[0].length, v[0].length + v[1].length]),
              vertical: Int32Array.from([...v[0], ...v[1]]),
              slashPtr: Int32Array.from([0, 0, 0]),
              slash: new Int32Array(0),
            };
            break;
          }
          case 'empty':
            break;
        }
        if (c.kind !== 'vertical' && c.kind !== 'empty') {
          mask.rows = { rowPtr: Int32Array.from(rowPtr), cols: colsArr ?? Int32Array.from(cols) };
        }
        const want = c.kind === 'blockSize' ? 'INVALID_ARGUMENT' : 'INVALID_MASK';
        // core's own check agrees that the mask is broken (the corruption is real)
        let coreSays = 'valid';
        try {
          validateMask(mask as never);
          if (mask.blockSize !== B || mask.heads !== H || mask.numBlocks !== Nb) coreSays = 'mismatch';
        } catch {
          coreSays = 'invalid';
        }
        expect(coreSays).not.toBe('valid');
        expect(await code(b.sparseAttention(q, k, k, mask as never)), JSON.stringify(c)).toBe(want);
        expect(b.gpu.liveBuffers.buffers).toBe(before);
      }),
      { numRuns: 150 },
    );
    expect(tried).toBe(150);
    q.dispose();
    k.dispose();
  });

  it('masks missing their arrays or of the wrong array types: INVALID_MASK, never a TypeError', async () => {
    const q = t([128, 2, 64], freshSeed());
    const k = t([128, 1, 64], freshSeed());
    const base = { heads: 2, numBlocks: 2, blockSize: 64 };
    const hostile: unknown[] = [
      { ...base },
      { ...base, vs: {} },
      { ...base, vs: null },
      { ...base, vs: { verticalPtr: [0, 0, 0], vertical: [], slashPtr: [0, 0, 0], slash: [] } },
      { ...base, rows: {} },
      { ...base, rows: { rowPtr: new Int32Array(5) } },
      { ...base, rows: { rowPtr: new Float64Array(5), cols: new Int32Array(0) } },
      { ...base, rows: 'rows' },
    ];
    for (const mask of hostile) {
      expect(await code(b.sparseAttention(q, k, k, mask as never)), JSON.stringify(mask)).toBe('INVALID_MASK');
      expect(await code(b.expandMask(mask as never)), JSON.stringify(mask)).toBe('INVALID_MASK');
    }
    expect(await code(b.sparseAttention(q, k, k, null as never))).toBe('INVALID_ARGUMENT');
    expect(await code(b.expandMask(null as never))).toBe('INVALID_MASK');
    q.dispose();
    k.dispose();
  });

  it('a query block that selects nothing is INVALID_MASK, as on the reference; in chunked prefill the blocks before the chunk may stay empty', async () => {
    const s = freshSeed();
    const n = 128;
    const hq = hostTensor('f32', [n, 2, 64], seededValues(s, n * 2 * 64));
    const hk = hostTensor('f32', [n, 1, 64], seededValues(s + 1, n * 64));
    // head 0 row 1 empty: its output would be zeros, which no attention gives
    const empty: BlockMask = {
      heads: 2,
      numBlocks: 2,
      blockSize: 64,
      rows: { rowPtr: Int32Array.from([0, 1, 1, 2, 3]), cols: Int32Array.from([0, 0, 1]) },
    };
    expect(await code(b.sparseAttention(b.upload(hq), b.upload(hk), b.upload(hk), empty))).toBe('INVALID_MASK');
    expect(await code(ref.sparseAttention(ref.upload(hq), ref.upload(hk), ref.upload(hk), empty))).toBe('INVALID_MASK');
    // a chunk of the last 64 queries against all 128 keys: query block 0 has no queries,
    // so its empty rows are fine; head 1 keeps only the diagonal
    const chunk: BlockMask = {
      heads: 2,
      numBlocks: 2,
      blockSize: 64,
      rows: { rowPtr: Int32Array.from([0, 0, 2, 2, 3]), cols: Int32Array.from([0, 1, 1]) },
    };
    const hc = hostTensor('f32', [64, 2, 64], hq.data.subarray(64 * 2 * 64));
    const r = await b.sparseAttention(b.upload(hc), b.upload(hk), b.upload(hk), chunk, { returnLse: true });
    const rr = await ref.sparseAttention(ref.upload(hc), ref.upload(hk), ref.upload(hk), chunk, { returnLse: true });
    const o = toFloat32(await b.download(r.output));
    const ro = toFloat32(await ref.download(rr.output));
    const l = toFloat32(await b.download(r.lse!));
    const rl = toFloat32(await ref.download(rr.lse!));
    expect(o.every(Number.isFinite) && l.every(Number.isFinite), `seed ${s}`).toBe(true);
    let err = 0;
    for (let i = 0; i < o.length; i++) err = Math.max(err, Math.abs(o[i] - ro[i]));
    for (let i = 0; i < l.length; i++) err = Math.max(err, Math.abs(l[i] - rl[i]));
    expect(err, `seed ${s}`).toBeLessThan(2e-5);
  });

  describe('injected faults on a real device', () => {
    const faults: Faults = { injected: 0 };
    let fb: WebGpuBackend;
    const arm = (label: string, times = 1) => {
      // a buffer the reserve hands out again is no allocation: empty it, so the armed one is
      fb.gpu.trimPool();
      let left = times;
      faults.oom = (d) => {
        if (left > 0 && String(d.label ?? '').startsWith(label)) {
          left--;
          return true;
        }
        return false;
      };
    };

    it('out of memory at upload: the tensor reports OUT_OF_MEMORY on every use, the backend goes on', async () => {
      fb = await createWebGpuBackend({ device: faultyDevice(b.gpu.device, faults) });
      const base = fb.gpu.liveBuffers.buffers;
      arm('tensor[');
      const x = fb.upload(hostTensor('f32', [256, 4], new Float32Array(1024).fill(1)));
      expect(await code(fb.download(x))).toBe('OUT_OF_MEMORY');
      expect(await code(() => fb.write(x, 0, new Float32Array(4)))).toBe('OUT_OF_MEMORY');
      expect(await code(fb.denseAttention(x, x, x))).toBe('OUT_OF_MEMORY');
      x.dispose();
      const y = fb.upload(hostTensor('f32', [4], [1, 2, 3, 4]));
      expect(Array.from((await fb.download(y)).data)).toEqual([1, 2, 3, 4]);
      y.dispose();
      expect(faults.injected).toBe(1);
      await expectNoLeak(fb, base);
    });

    it('out of memory for the attention output: OUT_OF_MEMORY before any attention pipeline is built, nothing left', async () => {
      const base = fb.gpu.liveBuffers.buffers;
      const s = freshSeed();
      const q = seeded(fb, [64, 2, 64], s);
      const k = seeded(fb, [64, 1, 64], s + 1);
      // (seen at the device, not timed: an attention pipeline takes seconds to build on a CPU
      // adapter, and so can anything on a loaded machine)
      const built = () => faults.pipelines?.length ?? 0;
      const before = built();
      arm('tensor[');
      expect(await code(fb.denseAttention(q, k, k, { returnLse: true }))).toBe('OUT_OF_MEMORY');
      expect(faults.pipelines?.slice(before) ?? []).toEqual([]);
      arm('tensor[2,64]');
      expect(await code(fb.sparseAttention(q, k, k, vsMask(2, 1, 64), { returnLse: true }))).toBe('OUT_OF_MEMORY');
      // sparse attention expands its mask on the device before it allocates the output: only
      // those small pipelines, no attention one
      expect((faults.pipelines?.slice(before) ?? []).filter((label) => !['expandCount', 'expandFill', 'scan'].includes(label))).toEqual([]);
      q.dispose();
      k.dispose();
      await expectNoLeak(fb, base);
    });

    it('out of memory for a read-back buffer or a mask expansion: OUT_OF_MEMORY, the call after answers correctly', async () => {
      const base = fb.gpu.liveBuffers.buffers;
      const x = fb.upload(hostTensor('f32', [8], [1, 2, 3, 4, 5, 6, 7, 8]));
      arm('staging');
      expect(await code(fb.download(x))).toBe('OUT_OF_MEMORY');
      expect(Array.from((await fb.download(x)).data)).toEqual([1, 2, 3, 4, 5, 6, 7, 8]);
      const mask = vsMask(3, 4, 64);
      arm('cols');
      expect(await code(fb.expandMask(mask))).toBe('OUT_OF_MEMORY');
      const rows = await fb.expandMask(mask);
      const exp = expandToRows(mask);
      expect(Array.from(rows.rowPtr)).toEqual(Array.from(exp.rowPtr));
      expect(Array.from(rows.cols)).toEqual(Array.from(exp.cols));
      x.dispose();
      await expectNoLeak(fb, base);
    });

    it("out of memory in the device plan's PE cut: OUT_OF_MEMORY, nothing left, the plan after it is whole", async () => {
      const base = fb.gpu.liveBuffers.buffers;
      const s = freshSeed();
      const q = seeded(fb, [320, 2, 64], s);
      const k = seeded(fb, [320, 1, 64], s + 1);
      // crisp's rules at a scale this shape has (B 64, kMin 128 tokens): a device plan
      const policy: Policy = { ...crisp, blockSize: 64, kMin: 128, vs: noiseFloor({ alpha: 1, kMin: 128 }), pe: globalCoverage({ gamma: 0.6, kMin: 128 }) };
      const injected = faults.injected;
      arm('peMap');
      expect(await code(planPrefill(fb, { q, k, v: k }, policy, { minSparseLength: 0 })), `seed ${s}`).toBe('OUT_OF_MEMORY');
      expect(faults.injected).toBe(injected + 1);
      const plan = await planPrefill(fb, { q, k, v: k }, policy, { minSparseLength: 0 });
      // the device path, its mask whole: every query block keeps blocks
      expect(plan.prepared).toBeDefined();
      const counts = await plan.prepared!.readBlockCounts();
      expect(Array.from(counts).every((c) => c >= 5)).toBe(true);
      releasePlan(plan);
      q.dispose();
      k.dispose();
      await expectNoLeak(fb, base);
    });

    it('a launch failure (invalid bind group): BACKEND_ERROR from that call only, the call after answers correctly', async () => {
      const base = fb.gpu.liveBuffers.buffers;
      faults.oom = undefined;
      let left = 1;
      faults.badBindGroup = () => left-- > 0;
      const mask = vsMask(2, 5, 64);
      const e = await fb.expandMask(mask).catch((x: unknown) => x);
      expect((e as { code?: string }).code).toBe('BACKEND_ERROR');
      expect((e as { details?: { native?: string } }).details?.native).toBe('GPUValidationError');
      const rows = await fb.expandMask(mask);
      expect(Array.from(rows.cols)).toEqual(Array.from(expandToRows(mask).cols));
      await fb.synchronize();
      await expectNoLeak(fb, base);
      fb.dispose();
    });
  });
});
