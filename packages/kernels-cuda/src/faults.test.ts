/**
 * The backend under faults, on the stand-in driver (no GPU): an allocation that fails at any
 * point of a call, a launch the driver refuses at any point, a context a kernel fault left
 * unusable, a cached cubin the driver rejects. Each ends in its typed error, frees what the
 * call took (the pool's and the driver's counters back at their baseline) and leaves the
 * backend serving the following call; a faulted context refuses everything with DEVICE_LOST until
 * disposed, and a new backend works once every holder let go (the stand-in's rule; NVIDIA's
 * driver keeps a kernel fault for the rest of the process, see the README's fault table).
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { type BlockMask, type DeviceTensor, type Policy, planPrefill, releasePlan, runPlan, sparsePrefill, vsListsFromArrays } from '@crisp/core';
import { crisp } from '@crisp/presets';
import { describe, expect, it } from 'vitest';
import { CudaBackend, CudaFaults, type CudaTensor } from './index.js';
import { standInDriver } from './stand-in-driver.js';

const H = 8;
const Hkv = 2;
const D = 128;
const n = 8192;
const B = 128;
const Nb = n / B;

/** A host-planned policy (the stand-in's zero statistics suit it): odd heads PE, every head's VS lists the sink block and the diagonal; token scores asked for. */
const hostPlanned: Policy = {
  name: 'parity',
  blockSize: B,
  kMin: 256,
  router: {
    name: 'parity',
    needs: { tokenScores: true },
    route: (s) => ({ routes: Array.from({ length: s.heads }, (_, h) => (h % 2 ? 'pe' : 'vs')), scores: new Float64Array(s.heads), scoreName: 'parity' }),
  },
  vs: { name: 'sink', select: () => Int32Array.from([0]) },
  pe: { name: 'coverage', gamma: 0.9, kMin: 256 },
};

function userMask(): BlockMask {
  const rowPtr = new Int32Array(H * Nb + 1);
  const cols: number[] = [];
  for (let r = 0; r < H * Nb; r++) {
    const I = r % Nb;
    cols.push(...(I > 2 ? [1, I - 1] : [I]));
    rowPtr[r + 1] = cols.length;
  }
  const none = Array.from({ length: H }, () => [] as number[]);
  return { heads: H, numBlocks: Nb, blockSize: B, vs: vsListsFromArrays(none.map(() => [0]), none.map(() => [0])), rows: { rowPtr, cols: Int32Array.from(cols) } };
}

function setup(total?: number) {
  const s = standInDriver({ heads: H, ...(total ? { totalMemory: total } : {}) });
  const faults = new CudaFaults();
  const be = new CudaBackend(s.libs, { cacheDir: null, faults });
  const inputs = { q: be.allocate('bf16', [n, H, D]), k: be.allocate('bf16', [n, Hkv, D]), v: be.allocate('bf16', [n, Hkv, D]) };
  return { ...s, faults, be, inputs };
}

type Setup = ReturnType<typeof setup>;

/** Each call kind: its output disposed (a failing call must leave nothing behind on its own). */
const CALLS: Record<string, (x: Setup) => Promise<unknown>> = {
  devicePlan: async ({ be, inputs }) => (await sparsePrefill(be, inputs, crisp, { minSparseLength: 0 })).output.dispose(),
  hostPlan: async ({ be, inputs }) => (await sparsePrefill(be, inputs, hostPlanned, { minSparseLength: 0 })).output.dispose(),
  planThenRun: async ({ be, inputs }) => {
    const plan = await planPrefill(be, inputs, crisp, { minSparseLength: 0 });
    try {
      const r = await runPlan(be, plan, inputs, { returnLse: true });
      r.output.dispose();
      r.lse?.dispose();
    } finally {
      releasePlan(plan);
    }
  },
  userMask: async ({ be, inputs }) => (await be.sparseAttention(inputs.q, inputs.k, inputs.v, userMask())).output.dispose(),
  dense: async ({ be, inputs }) => {
    const r = await be.denseAttention(inputs.q, inputs.k, inputs.v, { returnLse: true });
    r.output.dispose();
    r.lse?.dispose();
  },
};

/** What the backend and the stand-in hold once the backend gave back what it keeps between calls. */
function held(x: Setup) {
  x.be.trimMemory();
  return { live: x.be.poolStats().liveBytes, driver: x.memory.bytes, blocks: x.memory.blocks, badFrees: x.memory.badFrees };
}

async function codeOf(p: () => Promise<unknown>): Promise<string> {
  try {
    await p();
    return 'ok';
  } catch (e) {
    return (e as { code?: string }).code ?? `untyped ${String(e)}`;
  }
}

describe('an allocation that fails at any point of a call (stand-in driver)', () => {
  for (const [name, call] of Object.entries(CALLS)) {
    it(`${name}: OUT_OF_MEMORY, nothing left allocated, the following call runs`, async () => {
      const x = setup();
      await call(x); // kernels loaded, q, k and v checked once
      const base = held(x);
      let k = 1;
      for (; k < 200; k++) {
        held(x); // every allocation of the call is a driver allocation
        x.faults.failAlloc({ at: k });
        const code = await codeOf(() => call(x));
        x.faults.clear();
        expect(held(x), `${name}, allocation ${k}`).toEqual(base);
        if (code === 'ok') break;
        expect(code, `${name}, allocation ${k}`).toBe('OUT_OF_MEMORY');
        expect(await codeOf(() => call(x)), `${name}, the call after allocation ${k} failed`).toBe('ok');
      }
      // every allocation point of the call was tried
      expect(k, name).toBeGreaterThan(name === 'dense' ? 2 : 5);
      expect(x.memory.badFrees).toBe(0);
      x.be.dispose();
      expect(x.memory.bytes).toBe(0);
    });
  }
});

describe('a launch the driver refuses at any point of a call (stand-in driver)', () => {
  for (const [name, call] of Object.entries(CALLS)) {
    it(`${name}: BACKEND_ERROR naming the launch, nothing left allocated, the following call runs`, async () => {
      const x = setup();
      await call(x);
      const base = held(x);
      let j = 1;
      for (; j < 200; j++) {
        // alternately a refused launch the injector answers and one the driver itself refuses (4096 threads)
        x.faults.failLaunch({ at: j, mode: j % 2 ? 'code' : 'invalid' });
        let message = '';
        const code = await codeOf(() =>
          call(x).catch((e) => {
            message = (e as Error).message;
            throw e;
          }),
        );
        x.faults.clear();
        expect(held(x), `${name}, launch ${j}`).toEqual(base);
        if (code === 'ok') break;
        expect(code, `${name}, launch ${j}`).toBe('BACKEND_ERROR');
        expect(message).toMatch(/cuLaunchKernel(Ex)?\(\w+\) failed: CUDA_ERROR_INVALID_VALUE/);
        expect(await codeOf(() => call(x)), `${name}, the call after launch ${j} failed`).toBe('ok');
      }
      expect(j, name).toBeGreaterThan(1);
      expect(x.memory.badFrees).toBe(0);
      x.be.dispose();
    });
  }
});

describe('a kernel fault that leaves the context unusable (stand-in driver)', () => {
  it('DEVICE_LOST from the fault on, every call refused at once, dispose clean, a new backend works once all let go', async () => {
    const x = setup();
    await CALLS.devicePlan(x);
    // the fourth launch of the following plan faults: the driver reports it at the first later call that needs the context
    x.faults.fault({ at: 4 });
    const err = await sparsePrefill(x.be, x.inputs, crisp, { minSparseLength: 0 }).catch((e) => e);
    expect(err).toMatchObject({ code: 'DEVICE_LOST', details: { cudaError: 'CUDA_ERROR_ILLEGAL_ADDRESS', code: 700 } });
    expect((err as Error).message).toMatch(/restart the process/);
    x.log.length = 0;
    for (const [name, call] of Object.entries(CALLS)) {
      const e = await call(x).catch((c) => c);
      expect(e, name).toMatchObject({ code: 'DEVICE_LOST' });
      expect((e as Error).message, name).toMatch(/lost to CUDA_ERROR_ILLEGAL_ADDRESS .*restart the process/);
    }
    expect(() => x.be.allocate('bf16', [4, 4])).toThrow(expect.objectContaining({ code: 'DEVICE_LOST' }));
    await expect(x.be.download(x.inputs.q)).rejects.toMatchObject({ code: 'DEVICE_LOST' });
    expect(() => x.be.memoryInfo()).toThrow(expect.objectContaining({ code: 'DEVICE_LOST' }));
    // refused before reaching the driver
    expect(x.log.filter((e) => e.kind === 'launch' || e.kind === 'read')).toEqual([]);
    // a second backend while the first still holds the faulted context: refused, naming the holder
    const second = (() => {
      try {
        return new CudaBackend(x.libs, { cacheDir: null, faults: x.faults });
      } catch (e) {
        return e;
      }
    })();
    expect(second).toMatchObject({ code: 'DEVICE_LOST', details: { openBackends: 1 } });
    expect((second as Error).message).toMatch(/1 CUDA backend\(s\) of this process still hold it/);
    // tensors of the lost backend can still be disposed; the backend itself disposes cleanly
    x.inputs.q.dispose();
    expect(() => x.be.dispose()).not.toThrow();
    expect(x.faults.faulted).toBe(false);
    const fresh = new CudaBackend(x.libs, { cacheDir: null, faults: x.faults });
    const q = fresh.allocate('bf16', [n, H, D]);
    const k = fresh.allocate('bf16', [n, Hkv, D]);
    expect(await codeOf(async () => (await fresh.denseAttention(q, k, k)).output.dispose())).toBe('ok');
    fresh.dispose();
  });
});

describe('user errors before any work (stand-in driver)', () => {
  it('the output aliasing an input, the wrong dtype or shape, a bad scale: typed, with no launch and nothing allocated', async () => {
    const x = setup();
    for (const t of Object.values(x.inputs)) (t as CudaTensor).markWritten(); // unchecked: a NaN check would launch
    const kv = { q: x.be.allocate('bf16', [n, Hkv, D]), k: x.inputs.k, v: x.inputs.v };
    const outF16 = x.be.allocate('f16', [n, H, D]);
    const outD64 = x.be.allocate('bf16', [n, H, 64]);
    x.log.length = 0;
    const before = { ...x.be.poolStats(), driver: x.memory.bytes };
    const { q, k, v } = x.inputs;
    const cases: [string, string, () => Promise<unknown>][] = [
      ['out is q', 'INVALID_ARGUMENT', () => x.be.denseAttention(q, k, v, { out: q })],
      ['out is v (H = Hkv)', 'INVALID_ARGUMENT', () => x.be.denseAttention(kv.q, kv.k, kv.v, { out: kv.v })],
      ['out is q, sparse', 'INVALID_ARGUMENT', () => x.be.sparseAttention(q, k, v, userMask(), { out: q })],
      ['out of another dtype', 'DTYPE_MISMATCH', () => x.be.denseAttention(q, k, v, { out: outF16 })],
      ['out of another shape', 'SHAPE_MISMATCH', () => x.be.denseAttention(q, k, v, { out: outD64 })],
      ['scale NaN', 'INVALID_ARGUMENT', () => x.be.denseAttention(q, k, v, { scale: Number.NaN })],
      ['scale as a string', 'INVALID_ARGUMENT', () => x.be.denseAttention(q, k, v, { scale: '0.1' as unknown as number })],
      ['no mask', 'INVALID_MASK', () => x.be.sparseAttention(q, k, v, null as unknown as BlockMask)],
      ['null q', 'SHAPE_MISMATCH', () => x.be.denseAttention(null as unknown as DeviceTensor, k, v)],
    ];
    for (const [what, code, fn] of cases) {
      expect(await codeOf(fn), what).toBe(code);
    }
    expect(x.log.filter((e) => e.kind === 'launch')).toEqual([]);
    expect({ ...x.be.poolStats(), driver: x.memory.bytes }).toEqual(before);
    x.be.dispose();
  });

  it("a tensor of another CUDA backend is WRONG_BACKEND; host data of the wrong array type is DTYPE_MISMATCH; nothing reaches the device", async () => {
    const x = setup();
    const other = new CudaBackend(standInDriver({ heads: H }).libs, { cacheDir: null });
    const foreign = other.allocate('bf16', [n, Hkv, D]);
    x.log.length = 0;
    expect(await codeOf(() => x.be.denseAttention(x.inputs.q, foreign, x.inputs.v))).toBe('WRONG_BACKEND');
    expect(await codeOf(() => x.be.download(foreign))).toBe('WRONG_BACKEND');
    const t = x.be.allocate('bf16', [4, 4]);
    for (const data of [new Float64Array(16), new Int16Array(16), new Float32Array(16), [1, 2, 3]] as unknown as Uint16Array[]) {
      expect(() => x.be.write(t, 0, data), data.constructor.name).toThrow(expect.objectContaining({ code: 'DTYPE_MISMATCH' }));
    }
    expect(() => x.be.write(t, 10, new Uint16Array(8))).toThrow(expect.objectContaining({ code: 'INVALID_ARGUMENT' }));
    expect(() => x.be.upload(null as never)).toThrow(expect.objectContaining({ code: 'INVALID_ARGUMENT' }));
    expect(x.log).toEqual([]);
    other.dispose();
    x.be.dispose();
  });

  it('an allocation beyond the whole device fails at once (no driver call, the pool kept); one beyond what is free fails in the driver, the pool consistent', async () => {
    const x = setup(2 ** 32);
    await CALLS.dense(x);
    const pooled = x.be.poolStats().pooledBytes;
    expect(pooled).toBeGreaterThan(0);
    const misses = x.be.poolStats().misses;
    const err = (() => {
      try {
        return x.be.allocate('bf16', [1 << 20, 64, 128]);
      } catch (e) {
        return e;
      }
    })();
    expect(err).toMatchObject({ code: 'OUT_OF_MEMORY' });
    expect((err as Error).message).toMatch(/needs 16\.00 GiB; stand-in H200 has 4\.00 GiB in all/);
    expect(x.be.poolStats()).toMatchObject({ pooledBytes: pooled, misses });
    // 2 GiB twice does not fit beside the inputs (25 MB): the pool is emptied, then the driver refuses
    const ballast = x.be.allocate('bf16', [2 ** 30]);
    expect(() => x.be.allocate('bf16', [2 ** 30])).toThrow(expect.objectContaining({ code: 'OUT_OF_MEMORY' }));
    expect(x.be.poolStats().pooledBytes).toBe(0);
    ballast.dispose();
    const base = held(x);
    expect(base.driver).toBe(base.live);
    // once the ballast is gone: fine
    x.be.allocate('bf16', [2 ** 30]).dispose();
    await CALLS.devicePlan(x);
    expect(held(x)).toEqual(base);
    expect(x.memory.badFrees).toBe(0);
    x.be.dispose();
  });
});

describe('a cached cubin the driver refuses (stand-in driver)', () => {
  it('is compiled again and replaced; the call runs', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'crisp-cubin-'));
    try {
      const s = standInDriver({ heads: H });
      const first = new CudaBackend(s.libs, { cacheDir: dir });
      const q = first.allocate('bf16', [n, H, D]);
      const k = first.allocate('bf16', [n, Hkv, D]);
      (await first.denseAttention(q, k, k)).output.dispose();
      expect(first.compileMs['attention/attention-wgmma.cu']?.cached).toBe(false);
      first.dispose();
      const faults = new CudaFaults();
      const again = new CudaBackend(s.libs, { cacheDir: dir, faults });
      const q2 = again.allocate('bf16', [n, H, D]);
      const k2 = again.allocate('bf16', [n, Hkv, D]);
      faults.failModuleLoad(1);
      (await again.denseAttention(q2, k2, k2)).output.dispose();
      expect(faults.fired).toEqual([{ kind: 'moduleLoad', code: 200 }]);
      // the first file loaded from the cache was refused and compiled anew; the other came from the cache
      const files = Object.entries(again.compileMs);
      expect(files.length).toBe(2);
      expect(files.filter(([, c]) => !c.cached).length).toBe(1);
      // a freshly compiled module the driver refuses: BACKEND_ERROR, and the following call loads it
      faults.failModuleLoad(1);
      expect(await codeOf(async () => (await again.proxyStats(q2, k2, { blockSize: B, wSink: B, wLocal: B })).cStruct)).toBe('BACKEND_ERROR');
      expect(await codeOf(async () => (await again.proxyStats(q2, k2, { blockSize: B, wSink: B, wLocal: B })).cStruct)).toBe('ok');
      again.dispose();
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('random attention calls (fast-check, stand-in driver)', () => {
  it('end in the code the validation order predicts, and a refused one launches nothing and allocates nothing', async () => {
    const fc = await import('fast-check');
    const s = standInDriver({ heads: 4 });
    const be = new CudaBackend(s.libs, { cacheDir: null });
    const dtype = fc.constantFrom('bf16', 'f16', 'f32');
    const call = fc.record({
      m: fc.integer({ min: 1, max: 160 }),
      n: fc.integer({ min: 1, max: 160 }),
      H: fc.constantFrom(1, 2, 3, 4),
      Hkv: fc.constantFrom(1, 2, 4),
      d: fc.constantFrom(32, 64, 96, 128),
      dk: fc.constantFrom(64, 128),
      vRows: fc.constantFrom(0, 1),
      dtypes: fc.tuple(dtype, dtype, dtype),
      scale: fc.constantFrom(undefined, 0.1, Number.NaN, -1, 0, Number.POSITIVE_INFINITY),
      out: fc.constantFrom('none', 'fresh', 'q', 'shape', 'dtype'),
    });
    await fc.assert(
      fc.asyncProperty(call, async (c) => {
        const [dq, dk, dv] = c.dtypes;
        const q = be.allocate(dq, [c.m, c.H, c.d]);
        const k = be.allocate(dk, [c.n, c.Hkv, c.dk]);
        const v = be.allocate(dv, [c.n + c.vRows, c.Hkv, c.dk]);
        const outs = { fresh: be.allocate(dq, [c.m, c.H, c.d]), q, shape: be.allocate(dq, [c.m + 1, c.H, c.d]), dtype: be.allocate(dq === 'bf16' ? 'f16' : 'bf16', [c.m, c.H, c.d]) };
        const out = c.out === 'none' ? undefined : outs[c.out];
        // core's attentionShape, then the backend's support, then the options, in that order
        const expected =
          dq !== dk || dq !== dv
            ? 'DTYPE_MISMATCH'
            : c.vRows !== 0 || c.d !== c.dk || c.H % c.Hkv !== 0 || c.m > c.n
              ? 'SHAPE_MISMATCH'
              : dq === 'f32' || (c.d !== 64 && c.d !== 128)
                ? 'UNSUPPORTED'
                : c.scale !== undefined && !(c.scale > 0 && Number.isFinite(c.scale))
                  ? 'INVALID_ARGUMENT'
                  : c.out === 'dtype'
                    ? 'DTYPE_MISMATCH'
                    : c.out === 'shape'
                      ? 'SHAPE_MISMATCH'
                      : c.out === 'q'
                        ? 'INVALID_ARGUMENT'
                        : 'ok';
        s.log.length = 0;
        const before = { live: be.poolStats().liveBytes, driver: s.memory.bytes };
        let got = 'ok';
        try {
          const r = await be.denseAttention(q, k, v, { ...(c.scale === undefined ? {} : { scale: c.scale }), ...(out ? { out } : {}) });
          if (r.output !== out) r.output.dispose();
        } catch (e) {
          got = (e as { code?: string }).code ?? String(e);
        }
        const after = { live: be.poolStats().liveBytes, driver: s.memory.bytes };
        const launched = s.log.some((e) => e.kind === 'launch');
        for (const t of new Set([q, k, v, ...Object.values(outs)])) t.dispose();
        expect(got).toBe(expected);
        if (got !== 'ok') {
          expect(launched).toBe(false);
          expect(after).toEqual(before);
        }
      }),
      { numRuns: 300, seed: 37 },
    );
    be.dispose();
    expect(s.memory.bytes).toBe(0);
  });
});
