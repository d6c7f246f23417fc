/**
 * Typed errors and limits: bad input gets the right CrispError before any GPU work, NaN and
 * Inf never come back as a finite answer, and the binding limit names the largest n.
 */
import { hostTensor, isCrispError, mulberry32, toFloat32 } from '@crisp/core';
import { describe, expect, it } from 'vitest';
import { coverageCut, fixedGamma, fixedMass } from './coverage.js';
import { createWebGpuBackend } from './backend.js';
import { createNodeWebGpuBackend } from './node.js';
import { freshSeed, seededValues, sharedBackend } from './test-support.js';

const { backend, reason } = await sharedBackend();

async function code(p: Promise<unknown> | (() => unknown)): Promise<string | undefined> {
  try {
    await (typeof p === 'function' ? p() : p);
  } catch (e) {
    return isCrispError(e) ? e.code : `not a CrispError: ${String(e)}`;
  }
  return undefined;
}

describe('coverageCut (the PE cut on the host; the device cut keeps the same)', () => {
  it('keeps the entries at or above the largest threshold that holds gamma, equal values all kept', () => {
    // Nb = 3: rows I=0 [1], I=1 [a, b], I=2 [c, d, e]; values per row sum to 1.
    const vals = new Float32Array([1, 0.5, 0.5, 0.25, 0.5, 0.25]);
    const active = new Uint8Array([1, 1, 1]);
    // normalised by 3 rows: 1/3, 1/6, 1/6, 1/12, 1/6, 1/12: 1/3 alone is short of 0.6, so the
    // threshold is 1/6, and all three entries of 1/6 are kept
    expect(Array.from(coverageCut(vals.slice(), 3, active, 3, 0.6))).toEqual([1, 1, 1, 0, 1, 0]);
    expect(Array.from(coverageCut(vals.slice(), 3, active, 3, 0.3))).toEqual([1, 0, 0, 0, 0, 0]);
    // γ = 1: the floors leave the mass short of it, every active entry is kept
    expect(Array.from(coverageCut(vals.slice(), 3, active, 3, 1))).toEqual([1, 1, 1, 1, 1, 1]);
  });
  it('never keeps entries of inactive query blocks', () => {
    const vals = new Float32Array([0, 0.5, 0.5, 0.2, 0.3, 0.5]);
    const keep = coverageCut(vals.slice(), 3, new Uint8Array([0, 1, 1]), 2, 1);
    expect(keep[0]).toBe(0);
    expect(Array.from(keep.slice(1))).toEqual([1, 1, 1, 1, 1]);
  });
  it('counts mass as floor(v 2^31 / A) from the bits, exactly', () => {
    const f = new Float32Array(1);
    const u = new Uint32Array(f.buffer);
    for (const [v, A] of [[1, 1], [1, 3], [0.5, 7], [2 ** -20, 1], [2 ** -31, 1], [2 ** -32, 1], [0.123456, 4096], [0, 5]] as const) {
      f[0] = v;
      // exact: f32 value times 2^31 is a dyadic rational; BigInt floor division
      const scaled = BigInt(Math.round(f[0] * 2 ** 40)) * 2n ** 31n;
      const want = Number(scaled / (BigInt(A) * 2n ** 40n));
      expect(fixedMass(u[0], A), `v=${v} A=${A}`).toBe(want);
    }
    expect(fixedGamma(1)).toBe(2 ** 31);
    expect(fixedGamma(0.9)).toBe(Math.ceil(0.9 * 2 ** 31));
  });
  it('equals a sort-based cut on random maps (ties, zeros, inactive rows)', () => {
    const seed = freshSeed();
    const r = mulberry32(seed);
    for (let trial = 0; trial < 60; trial++) {
      const Nb = 1 + Math.floor(r() * 40);
      const entries = (Nb * (Nb + 1)) / 2;
      const vals = new Float32Array(entries);
      const coarse = r() < 0.4;
      for (let I = 0, e = 0; I < Nb; e += I + 1, I++) {
        let s = 0;
        for (let J = 0; J <= I; J++) {
          vals[e + J] = coarse ? Math.floor(r() * 3) : Math.exp(-12 * r());
          s += vals[e + J];
        }
        for (let J = 0; J <= I; J++) vals[e + J] = s > 0 ? vals[e + J] / s : 0;
      }
      const active = Uint8Array.from({ length: Nb }, () => (r() < 0.85 ? 1 : 0));
      const A = Math.max(1, active.reduce((a, b) => a + b, 0));
      const gamma = [0.3, 0.8, 0.9, 0.95, 1][trial % 5];
      const bits = new Uint32Array(vals.buffer);
      // oracle: distinct values descending, the first at which the mass of entries >= it reaches γ
      const activeAt: boolean[] = [];
      for (let I = 0; I < Nb; I++) for (let J = 0; J <= I; J++) activeAt.push(active[I] === 1);
      const w = Array.from(bits, (b, e) => (activeAt[e] ? fixedMass(b, A) : 0));
      const distinct = [...new Set(Array.from(bits).filter((_b, e) => activeAt[e] && w[e] > 0))].sort((a, b) => b - a);
      let T = -1;
      for (const t of distinct) {
        let mass = 0;
        for (let e = 0; e < entries; e++) if (bits[e] >= t) mass += w[e];
        if (mass >= fixedGamma(gamma)) {
          T = t;
          break;
        }
      }
      const want = Array.from(bits, (b, e) => (activeAt[e] && (T < 0 || b >= T) ? 1 : 0));
      expect(Array.from(coverageCut(vals.slice(), Nb, active, A, gamma)), `seed ${seed} trial ${trial}`).toEqual(want);
    }
  });
});

describe('createWebGpuBackend without WebGPU', () => {
  it('gives BACKEND_UNAVAILABLE when there is no navigator.gpu and no adapter', async () => {
    expect(await code(createWebGpuBackend({}))).toBe('BACKEND_UNAVAILABLE');
  });
  it('gives BACKEND_UNAVAILABLE when the GPU object finds no adapter', async () => {
    const gpu = { requestAdapter: async () => null } as unknown as GPU;
    expect(await code(createWebGpuBackend({ gpu }))).toBe('BACKEND_UNAVAILABLE');
  });
});

describe.skipIf(!backend)(`WebGPU typed errors${reason ? ` (skipped: ${reason})` : ''}`, () => {
  const b = backend!;
  const t = (dtype: 'f32' | 'f16', shape: number[], seed: number) =>
    b.upload(hostTensor(dtype, shape, seededValues(seed, shape.reduce((x, y) => x * y, 1))));

  it('head dim 80 is UNSUPPORTED, bf16 is UNSUPPORTED, block size 32 is INVALID_ARGUMENT', async () => {
    const s = freshSeed();
    const q = t('f32', [64, 2, 80], s);
    const k = t('f32', [64, 1, 80], s + 1);
    expect(await code(b.denseAttention(q, k, k))).toBe('UNSUPPORTED');
    expect(await code(() => b.allocate('bf16', [4, 4]))).toBe('UNSUPPORTED');
    const q2 = t('f32', [64, 2, 64], s);
    const k2 = t('f32', [64, 1, 64], s + 1);
    expect(await code(b.proxyStats(q2, k2, { blockSize: 32, wSink: 64, wLocal: 64 }))).toBe('INVALID_ARGUMENT');
    expect(await code(b.peBlockRows(q2, k2, { blockSize: 64, gamma: 1.5, heads: [0] }))).toBe('INVALID_ARGUMENT');
    expect(await code(b.peBlockRows(q2, k2, { blockSize: 64, gamma: 0.9, heads: [1, 0] }))).toBe('INVALID_ARGUMENT');
    expect(await code(b.denseAttention(q2, k2, k2, { scale: -1 }))).toBe('INVALID_ARGUMENT');
  });

  it('shape, dtype, ownership and disposal errors', async () => {
    const s = freshSeed();
    const q = t('f32', [64, 3, 64], s);
    const k = t('f32', [64, 2, 64], s + 1);
    expect(await code(b.denseAttention(q, k, k))).toBe('SHAPE_MISMATCH'); // 3 % 2 != 0
    const k16 = t('f16', [64, 1, 64], s + 2);
    const q2 = t('f32', [64, 2, 64], s);
    expect(await code(b.denseAttention(q2, k16, k16))).toBe('DTYPE_MISMATCH');
    const foreign = { backend: 'other', dtype: 'f32', shape: [64, 1, 64], disposed: false } as never;
    expect(await code(b.denseAttention(q2, foreign, foreign))).toBe('WRONG_BACKEND');
    const k1 = t('f32', [64, 1, 64], s + 3);
    k1.dispose();
    expect(await code(b.denseAttention(q2, k1, k1))).toBe('DISPOSED');
    const out = b.allocate('f32', [64, 2, 32]);
    const k2 = t('f32', [64, 1, 64], s + 4);
    expect(await code(b.denseAttention(q2, k2, k2, { out }))).toBe('SHAPE_MISMATCH');
    expect(await code(() => b.write(k2, 64 * 64 - 2, new Float32Array(4)))).toBe('INVALID_ARGUMENT');
    expect(await code(() => b.write(k2, 0, new Uint16Array(4)))).toBe('DTYPE_MISMATCH');
    const bad = { heads: 2, numBlocks: 1, blockSize: 64, rows: { rowPtr: Int32Array.from([0, 1, 2]), cols: Int32Array.from([0, 1]) } };
    expect(await code(b.sparseAttention(q2, k2, k2, bad))).toBe('INVALID_MASK');
  });

  it('binding limit: LIMIT_EXCEEDED names maxStorageBufferBindingSize and the largest n', async () => {
    const lim = b.gpu.limits.maxStorageBufferBindingSize;
    // A q whose bytes exceed the binding limit, allocated as a shape only (never filled).
    const H = 64;
    const d = 128;
    const n = Math.floor(lim / (H * d * 4)) + 64;
    if (n * H * d * 4 > b.gpu.limits.maxBufferSize) return; // cannot even allocate: covered by maxBufferSize
    const q = b.allocate('f32', [n, H, d]);
    const k = b.allocate('f32', [n, 1, d]);
    try {
      await b.denseAttention(q, k, k);
      expect.unreachable('expected LIMIT_EXCEEDED');
    } catch (e) {
      expect(isCrispError(e, 'LIMIT_EXCEEDED')).toBe(true);
      const details = (e as { details: { limit: string; max: number } }).details;
      expect(details.limit).toBe('maxStorageBufferBindingSize');
      expect(details.max).toBe(Math.floor(lim / (H * d * 4)));
    } finally {
      q.dispose();
      k.dispose();
    }
  });

  it('NaN/Inf inputs: NON_FINITE from proxyStats, non-finite attention output', async () => {
    const s = freshSeed();
    const n = 128;
    const kv = seededValues(s, n * 1 * 64);
    kv[5 * 64 + 3] = Number.NaN;
    const q = t('f32', [n, 2, 64], s + 1);
    const k = b.upload(hostTensor('f32', [n, 1, 64], kv));
    expect(await code(b.proxyStats(q, k, { blockSize: 64, wSink: 64, wLocal: 64 }))).toBe('NON_FINITE');
    const vv = seededValues(s + 2, n * 64);
    vv[3 * 64] = Number.POSITIVE_INFINITY;
    const v = b.upload(hostTensor('f32', [n, 1, 64], vv));
    const good = t('f32', [n, 1, 64], s + 3);
    const out = toFloat32(await b.download((await b.denseAttention(q, good, v)).output));
    expect(out.every(Number.isFinite), `seed ${s}`).toBe(false);
    // SwiftShader compiles the proxy and attention pipelines for this shape first: 83 s in a
    // clean 2-core CI run, over 120 s on a loaded machine.
  }, 300_000);

  it('device loss: pending and later calls fail with DEVICE_LOST instead of hanging', async () => {
    const lost = await createNodeWebGpuBackend();
    const s = freshSeed();
    const x = lost.upload(hostTensor('f32', [256, 4], seededValues(s, 1024)));
    const pending = lost.download(x);
    lost.gpu.device.destroy();
    const codes = await Promise.all([code(pending), code(lost.synchronize())]);
    expect(codes.every((c) => c === 'DEVICE_LOST' || c === undefined), String(codes)).toBe(true);
    // once the loss is seen, every call is DEVICE_LOST
    await new Promise((r) => setTimeout(r, 50));
    expect(await code(lost.download(x))).toBe('DEVICE_LOST');
    expect(await code(() => lost.upload(hostTensor('f32', [4], [1, 2, 3, 4])))).toBe('DEVICE_LOST');
  });

  it('unaligned f16 writes keep the neighbouring halves', async () => {
    const s = freshSeed();
    const vals = seededValues(s, 11);
    const base = hostTensor('f16', [11], vals);
    const x = b.upload(base);
    const patch = hostTensor('f16', [3], [7, 8, 9]);
    b.write(x, 3, patch.data);
    const got = toFloat32(await b.download(x));
    const exp = toFloat32(base).slice();
    exp.set([7, 8, 9], 3);
    expect(Array.from(got), `seed ${s}`).toEqual(Array.from(exp));
  });
});
