/**
 * The CUDA backend's tests. Without a driver (CPU machines, CI) the GPU tests skip and
 * print why; the availability probe and the typed BACKEND_UNAVAILABLE error are checked
 * on every machine.
 */
import { CrispError, type HostTensor, hostTensor, toFloat32, mulberry32 as seeded } from '@crisp/core';
import { createReferenceBackend } from '@crisp/reference';
import { describe, expect, it } from 'vitest';
import {
  ATTENTION_VARIANTS,
  type AttentionVariant,
  PROXY_LAYOUTS,
  type ProxyLayout,
  cudaAvailability,
  createCudaBackend,
  defaultAttentionVariant,
} from './index.js';
import { sizeClass } from './runtime/pool.js';

const avail = cudaAvailability();
if (!avail.available) console.log(`kernels-cuda: GPU tests skipped: ${avail.reason}`);

describe('defaultAttentionVariant', () => {
  it('picks the wgmma layout only on compute capability 9.0 (wgmma is sm_90a-only)', () => {
    expect(defaultAttentionVariant([9, 0])).toBe('wg3');
    for (const cc of [[8, 0], [8, 6], [8, 9], [10, 0], [12, 0]] as const) expect(defaultAttentionVariant(cc)).toBe('w32');
  });
});

describe('availability', () => {
  it('answers without throwing, with a reason when unavailable', () => {
    const a = cudaAvailability();
    expect(typeof a.available).toBe('boolean');
    if (!a.available) expect(a.reason).toMatch(/\w{8,}/);
  });
  it.skipIf(avail.available)('createCudaBackend rejects with BACKEND_UNAVAILABLE', async () => {
    const err = await createCudaBackend().catch((e: unknown) => e);
    expect(err).toBeInstanceOf(CrispError);
    expect((err as CrispError).code).toBe('BACKEND_UNAVAILABLE');
    expect((err as CrispError).message).toBe(avail.reason);
  });
  it('checks its options before it looks for a driver, so a bad option is reported as such everywhere', async () => {
    const bad: [unknown, RegExp][] = [
      [{ device: 'x' }, /device must be a CUDA device ordinal \(an integer >= 0\); got 'x'/],
      [{ device: -1 }, /device must be a CUDA device ordinal/],
      [{ cachedir: '/tmp' }, /unknown option 'cachedir' \(did you mean 'cacheDir'\?\)/],
      [{ checkFinite: 'no' }, /checkFinite must be true or false/],
      [{ kernelDir: 3 }, /kernelDir must be a folder path; got 3/],
      [{ sparseCrossover: Number.NaN }, /sparseCrossover must be a finite number/],
    ];
    for (const [opts, message] of bad) {
      const err = await createCudaBackend(opts as never).catch((e: unknown) => e);
      expect(err, String(message)).toBeInstanceOf(CrispError);
      expect((err as CrispError).code, String(message)).toBe('INVALID_ARGUMENT');
      expect((err as CrispError).message).toMatch(message);
    }
  });
});

describe('memory pool size classes', () => {
  it('rounds small sizes to 256 bytes and large ones to 2 MiB', () => {
    expect(sizeClass(1)).toBe(256);
    expect(sizeClass(257)).toBe(512);
    expect(sizeClass(1 << 20)).toBe(1 << 20);
    expect(sizeClass((1 << 20) + 1)).toBe(2 << 20);
    expect(sizeClass((5 << 20) + 7)).toBe(6 << 20);
  });
});

function randomTensor(r: () => number, shape: number[], amp: number): HostTensor {
  const n = shape.reduce((a, b) => a * b, 1);
  return hostTensor('bf16', shape, Float32Array.from({ length: n }, () => (r() * 2 - 1) * amp));
}

describe.skipIf(!avail.available)('cuda backend on a GPU', () => {
  it('dense attention matches the float64 reference (GQA, d = 128, n = 300)', async () => {
    const seed = (Date.now() ^ 0x5eed) >>> 0;
    const r = seeded(seed);
    const be = await createCudaBackend();
    const ref = createReferenceBackend();
    try {
      const [n, H, Hkv, d] = [300, 4, 2, 128];
      const q = randomTensor(r, [n, H, d], 2);
      const k = randomTensor(r, [n, Hkv, d], 2);
      const v = randomTensor(r, [n, Hkv, d], 1);
      const out = be.allocate('bf16', [n, H, d]);
      be.poison(out);
      await be.denseAttention(be.upload(q), be.upload(k), be.upload(v), { out });
      const got = toFloat32(await be.download(out));
      const want = toFloat32(
        await ref.download((await ref.denseAttention(ref.upload(q), ref.upload(k), ref.upload(v))).output),
      );
      let e = 0;
      let w = 0;
      for (let i = 0; i < got.length; i++) {
        e += (got[i] - want[i]) ** 2;
        w += want[i] ** 2;
      }
      expect(Math.sqrt(e / w), `seed ${seed}`).toBeLessThan(1e-2);
    } finally {
      be.dispose();
      ref.dispose();
    }
  });
});

describe.skipIf(!avail.available)('every attention variant on a GPU', () => {
  it('launches the fastest measured layout for the GPU by default, and rejects unknown names', async () => {
    const be = await createCudaBackend();
    try {
      expect(be.attentionVariant).toBe(defaultAttentionVariant(be.info.computeCapability));
      expect(be.attentionVariantFallback).toBeUndefined();
      const err = (() => {
        try {
          be.attentionVariant = 'wgx' as AttentionVariant;
        } catch (e) {
          return e;
        }
      })();
      expect(err).toBeInstanceOf(CrispError);
      expect((err as CrispError).code).toBe('INVALID_ARGUMENT');
      expect(be.attentionVariant).toBe(defaultAttentionVariant(be.info.computeCapability));
    } finally {
      be.dispose();
    }
  });

  it('matches the float64 reference, dense and chunked (or falls back off Hopper with a reason)', async () => {
    const seed = (Date.now() ^ 0xa77e) >>> 0;
    const r = seeded(seed);
    const be = await createCudaBackend();
    const ref = createReferenceBackend();
    try {
      const [n, m, H, Hkv, d] = [333, 200, 4, 2, 128];
      const q = randomTensor(r, [m, H, d], 2);
      const k = randomTensor(r, [n, Hkv, d], 2);
      const v = randomTensor(r, [n, Hkv, d], 1);
      const want = toFloat32(
        await ref.download((await ref.denseAttention(ref.upload(q), ref.upload(k), ref.upload(v))).output),
      );
      const hopper = be.info.computeCapability[0] === 9 && be.info.computeCapability[1] === 0;
      for (const name of Object.keys(ATTENTION_VARIANTS) as AttentionVariant[]) {
        be.attentionVariant = name;
        if (ATTENTION_VARIANTS[name].sm90a && !hopper) expect(be.attentionVariantFallback).toMatch(/needs a Hopper GPU/);
        else expect(be.attentionVariantFallback).toBeUndefined();
        const out = be.allocate('bf16', [m, H, d]);
        be.poison(out);
        await be.denseAttention(be.upload(q), be.upload(k), be.upload(v), { out });
        const got = toFloat32(await be.download(out));
        let e = 0;
        let w = 0;
        for (let i = 0; i < got.length; i++) {
          e += (got[i] - want[i]) ** 2;
          w += want[i] ** 2;
        }
        expect(Math.sqrt(e / w), `${name}, seed ${seed}`).toBeLessThan(1e-2);
      }
    } finally {
      be.dispose();
      ref.dispose();
    }
  });
});

describe.skipIf(!avail.available)('every proxy statistics layout on a GPU', () => {
  it('matches the float64 reference and the other layouts bit for bit (n < B, partial parts, B 64 and 128)', async () => {
    const seed = (Date.now() ^ 0x9e0c) >>> 0;
    const r = seeded(seed);
    const be = await createCudaBackend();
    const ref = createReferenceBackend();
    const fields = ['cStruct', 'rowEntropy', 'verticalBlocks', 'slashBlocks', 'pooledEstimate', 'verticalTokens', 'slashTokens'] as const;
    try {
      for (const [n, H, Hkv, d, B] of [
        [100, 4, 2, 128, 128],
        [1333, 4, 2, 64, 64],
        [1333, 4, 1, 128, 128],
      ]) {
        const q = randomTensor(r, [n, H, d], 3);
        const k = randomTensor(r, [n, Hkv, d], 3);
        const opts = { blockSize: B, wSink: B - 7, wLocal: B + 5, tokenScores: true };
        const want = await ref.proxyStats(ref.upload(q), ref.upload(k), opts);
        const dq = be.upload(q);
        const dk = be.upload(k);
        const got: Partial<Record<ProxyLayout, Awaited<ReturnType<typeof be.proxyStats>>>> = {};
        for (const layout of Object.keys(PROXY_LAYOUTS) as ProxyLayout[]) {
          be.proxyLayout = layout;
          const s = await be.proxyStats(dq, dk, opts);
          got[layout] = s;
          for (const f of fields) {
            const a = s[f] as ArrayLike<number>;
            const e = want[f] as ArrayLike<number>;
            expect(a.length, `${f} length, ${layout} n ${n}`).toBe(e.length);
            let worst = 0;
            for (let i = 0; i < e.length; i++) worst = Math.max(worst, Math.abs(a[i] - e[i]) / Math.max(1, Math.abs(e[i])));
            expect(worst, `${f}, ${layout}, n ${n} B ${B} d ${d}, seed ${seed}`).toBeLessThan(2e-5);
          }
        }
        for (const f of fields) {
          expect(Array.from(got.w32?.[f] as ArrayLike<number>), `${f} w32 vs w16, n ${n}`).toEqual(Array.from(got.w16?.[f] as ArrayLike<number>));
        }
        // block level (no token scores): the fused pass and the two-pass form, every layout
        const blockFields = ['cStruct', 'rowEntropy', 'verticalBlocks', 'slashBlocks', 'pooledEstimate'] as const;
        for (const layout of Object.keys(PROXY_LAYOUTS) as ProxyLayout[]) {
          for (const fused of [true, false]) {
            be.proxyLayout = layout;
            be.proxyFused = fused;
            const s = await be.proxyStats(dq, dk, { ...opts, tokenScores: false });
            for (const f of blockFields) {
              let worst = 0;
              for (let i = 0; i < want[f].length; i++) worst = Math.max(worst, Math.abs(s[f][i] - want[f][i]) / Math.max(1, Math.abs(want[f][i])));
              expect(worst, `${f}, ${layout}, fused ${fused}, n ${n} B ${B} d ${d}, seed ${seed}`).toBeLessThan(2e-5);
            }
          }
        }
        be.proxyFused = true;
        dq.dispose();
        dk.dispose();
      }
    } finally {
      be.dispose();
      ref.dispose();
    }
  });
});

// The cross-backend suite against @crisp/reference, on GPU machines only.
if (avail.available) {
  const { defineConformanceSuite } = await import('@crisp/conformance/vitest');
  defineConformanceSuite('cuda', () => createCudaBackend(), { dtypes: ['bf16', 'f16'] });
} else {
  describe.skip(`conformance (cuda): ${avail.reason}`, () => {
    it('needs a CUDA driver', () => {
      throw new Error('unreachable: skipped without a driver');
    });
  });
}
