/**
 * Every primitive against @crisp/reference (float64) on fresh seeded inputs, on whatever
 * adapter Dawn finds (SwiftShader in CI). Sizes are small: SwiftShader runs on the CPU.
 */
import {
  type Backend,
  type BlockMask,
  type DType,
  type HostTensor,
  expandToRows,
  hostTensor,
  toFloat32,
  vsListsFromArrays,
} from '@crisp/core';
import { createReferenceBackend } from '@crisp/reference';
import { describe, expect, it } from 'vitest';
import { freshSeed, seededValues, sharedBackend } from './test-support.js';

const { backend, reason } = await sharedBackend();
const ref = createReferenceBackend();

interface Case {
  n: number;
  m: number;
  H: number;
  Hkv: number;
  d: number;
  dtype: DType;
  B: number;
}

function inputs(seed: number, c: Case): { q: HostTensor; k: HostTensor; v: HostTensor } {
  // Structured enough to give non-uniform attention: a shared direction in q and k.
  const q = seededValues(seed, c.m * c.H * c.d, 1.5);
  const k = seededValues(seed + 1, c.n * c.Hkv * c.d, 1.5);
  for (let r = 0; r < c.n; r++) if (r % 37 === 0) for (let x = 0; x < c.Hkv * c.d; x += 3) k[r * c.Hkv * c.d + x] += 1;
  const v = seededValues(seed + 2, c.n * c.Hkv * c.d);
  return {
    q: hostTensor(c.dtype, [c.m, c.H, c.d], q),
    k: hostTensor(c.dtype, [c.n, c.Hkv, c.d], k),
    v: hostTensor(c.dtype, [c.n, c.Hkv, c.d], v),
  };
}

function maxAbsDiff(a: ArrayLike<number>, b: ArrayLike<number>): number {
  let e = 0;
  for (let i = 0; i < a.length; i++) e = Math.max(e, Math.abs(a[i] - b[i]));
  return e;
}

function both(b: Backend, t: { q: HostTensor; k: HostTensor; v: HostTensor }) {
  return { q: b.upload(t.q), k: b.upload(t.k), v: b.upload(t.v) };
}

function randomMask(seed: number, H: number, Nb: number, B: number): BlockMask {
  const r = seededValues(seed, H * Nb * 4);
  const vertical: number[][] = [];
  const slash: number[][] = [];
  for (let h = 0; h < H; h++) {
    vertical.push([0, ...Array.from({ length: Nb }, (_, J) => J).filter((J) => r[h * Nb + J] > 0.4)]);
    slash.push([0, ...Array.from({ length: Nb }, (_, O) => O).filter((O) => r[H * Nb + h * Nb + O] > 0.5)]);
  }
  // A few explicit rows on top (union semantics), including an empty row for head 0.
  const rowPtr = new Int32Array(H * Nb + 1);
  const cols: number[] = [];
  for (let h = 0; h < H; h++) {
    for (let I = 0; I < Nb; I++) {
      if (h > 0 && r[2 * H * Nb + h * Nb + I] > 0.6) cols.push(Math.floor((I + 1) / 2));
      rowPtr[h * Nb + I + 1] = cols.length;
    }
  }
  return {
    heads: H,
    numBlocks: Nb,
    blockSize: B,
    vs: vsListsFromArrays(vertical, slash),
    rows: { rowPtr, cols: Int32Array.from(cols) },
  };
}

const cases: Case[] = [
  { n: 300, m: 300, H: 4, Hkv: 2, d: 64, dtype: 'f32', B: 64 },
  { n: 260, m: 260, H: 2, Hkv: 1, d: 128, dtype: 'f16', B: 128 },
];

describe.skipIf(!backend)(`WebGPU primitives vs reference${reason ? ` (skipped: ${reason})` : ''}`, () => {
  const b = backend!;
  for (const c of cases) {
    const tag = `${c.dtype} n=${c.n} H=${c.H}/${c.Hkv} d=${c.d} B=${c.B}`;
    const tol = c.dtype === 'f16' ? 2e-3 : 2e-5;

    it(`dense attention + LSE, ${tag}`, async () => {
      const seed = freshSeed();
      const t = inputs(seed, c);
      const g = both(b, t);
      const out = b.allocate(c.dtype, [c.m, c.H, c.d]);
      b.write(out, 0, c.dtype === 'f32' ? new Float32Array(c.m * c.H * c.d).fill(Number.NaN) : new Uint16Array(c.m * c.H * c.d).fill(0x7e00));
      const r = await b.denseAttention(g.q, g.k, g.v, { returnLse: true, out });
      expect(r.output).toBe(out);
      const rr = await ref.denseAttention(ref.upload(t.q), ref.upload(t.k), ref.upload(t.v), { returnLse: true });
      const got = toFloat32(await b.download(r.output));
      const exp = toFloat32(await ref.download(rr.output));
      const err = maxAbsDiff(got, exp);
      expect(err, `seed ${seed}`).toBeLessThan(c.dtype === 'f16' ? 2e-3 : 1e-5);
      const lse = maxAbsDiff(toFloat32(await b.download(r.lse!)), toFloat32(await ref.download(rr.lse!)));
      expect(lse, `seed ${seed}`).toBeLessThan(1e-4);
    });

    it(`sparse attention over VS lists + rows, ${tag}`, async () => {
      const seed = freshSeed();
      const t = inputs(seed, c);
      const g = both(b, t);
      const Nb = Math.ceil(c.n / c.B);
      const mask = randomMask(seed + 7, c.H, Nb, c.B);
      const r = await b.sparseAttention(g.q, g.k, g.v, mask, { returnLse: true });
      const rr = await ref.sparseAttention(ref.upload(t.q), ref.upload(t.k), ref.upload(t.v), mask, { returnLse: true });
      const got = toFloat32(await b.download(r.output));
      const exp = toFloat32(await ref.download(rr.output));
      expect(maxAbsDiff(got, exp), `seed ${seed}`).toBeLessThan(c.dtype === 'f16' ? 2e-3 : 1e-5);
      const l1 = toFloat32(await b.download(r.lse!));
      const l2 = toFloat32(await ref.download(rr.lse!));
      for (let i = 0; i < l1.length; i++) {
        if (l2[i] === Number.NEGATIVE_INFINITY) expect(l1[i]).toBe(Number.NEGATIVE_INFINITY);
        else expect(Math.abs(l1[i] - l2[i]), `seed ${seed} lse ${i}`).toBeLessThan(1e-4);
      }
    });

    it(`expandMask equals the host expansion, ${tag}`, async () => {
      const seed = freshSeed();
      const Nb = Math.ceil(c.n / c.B);
      const mask = randomMask(seed, c.H, Nb, c.B);
      const got = await b.expandMask(mask);
      const exp = expandToRows(mask);
      expect(Array.from(got.rowPtr), `seed ${seed}`).toEqual(Array.from(exp.rowPtr));
      expect(Array.from(got.cols), `seed ${seed}`).toEqual(Array.from(exp.cols));
    });

    it(`proxyStats, ${tag}`, async () => {
      const seed = freshSeed();
      const t = inputs(seed, c);
      const g = both(b, t);
      const opts = { blockSize: c.B, wSink: 64, wLocal: 64, tokenScores: true };
      const s = await b.proxyStats(g.q, g.k, opts);
      const r = await ref.proxyStats(ref.upload(t.q), ref.upload(t.k), opts);
      expect(s.proxyRows).toBe(r.proxyRows);
      expect(s.numBlocks).toBe(r.numBlocks);
      const stol = c.dtype === 'f16' ? 1e-4 : 1e-5;
      expect(maxAbsDiff(s.cStruct, r.cStruct), `seed ${seed}`).toBeLessThan(stol);
      expect(maxAbsDiff(s.verticalBlocks, r.verticalBlocks), `seed ${seed}`).toBeLessThan(stol);
      expect(maxAbsDiff(s.slashBlocks, r.slashBlocks), `seed ${seed}`).toBeLessThan(stol);
      expect(maxAbsDiff(s.pooledEstimate, r.pooledEstimate), `seed ${seed}`).toBeLessThan(stol);
      expect(maxAbsDiff(s.rowEntropy, r.rowEntropy), `seed ${seed}`).toBeLessThan(1e-3);
      expect(maxAbsDiff(s.verticalTokens!, r.verticalTokens!), `seed ${seed}`).toBeLessThan(stol);
      expect(maxAbsDiff(s.slashTokens!, r.slashTokens!), `seed ${seed}`).toBeLessThan(stol);
    });

    it(`peBlockRows, ${tag}`, async () => {
      const seed = freshSeed();
      const t = inputs(seed, c);
      const g = both(b, t);
      const heads = c.H > 2 ? [0, 2, 3] : [1];
      for (const gamma of [0.5, 0.9]) {
        const opts = { blockSize: c.B, gamma, heads };
        const got = await b.peBlockRows(g.q, g.k, opts);
        const exp = await ref.peBlockRows(ref.upload(t.q), ref.upload(t.k), opts);
        expect(Array.from(got.rowPtr), `seed ${seed} gamma ${gamma}`).toEqual(Array.from(exp.rowPtr));
        expect(Array.from(got.cols), `seed ${seed} gamma ${gamma}`).toEqual(Array.from(exp.cols));
      }
    });
    void tol;
  }
});
