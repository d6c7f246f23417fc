/**
 * varlenAttention and sliceRows against @crisp/reference (float64) on whatever adapter Dawn
 * finds (SwiftShader in CI): a ragged batch of lengths 1, 63, 64, 65, 300 and a chunked
 * sequence (70 queries over 190 keys), with VS, row, mixed and no masks, written into
 * NaN-poisoned outputs; the same batch split into many dispatches; a non-finite input kept
 * inside its sequence; bad batches refused with typed errors before any dispatch; slices
 * (views and copies) read back and attended over.
 */
import {
  type BlockMask,
  type DType,
  type DeviceTensor,
  type HostTensor,
  type VarlenBatch,
  type VarlenSegment,
  expandToRows,
  hostTensor,
  numBlocks,
  toFloat32,
  vsListsFromArrays,
} from '@crisp/core';
import { createReferenceBackend } from '@crisp/reference';
import { afterAll, describe, expect, it, vi } from 'vitest';
import { createWebGpuBackend, type WebGpuBackend } from './backend.js';
import { code, freshSeed, seededValues, sharedBackend } from './test-support.js';

const { backend, reason } = await sharedBackend();
const ref = createReferenceBackend();

const H = 4;
const Hkv = 2;
const D = 64;
const B = 64;
const QUERIES = [1, 63, 64, 65, 300, 70];
const KEYS = [1, 63, 64, 65, 300, 190];

function segmentsOf(queries: readonly number[], keys: readonly number[]): VarlenSegment[] {
  let qs = 0;
  let ks = 0;
  return queries.map((m, i) => {
    const g = { qStart: qs, queries: m, kStart: ks, keys: keys[i] };
    qs += m;
    ks += keys[i];
    return g;
  });
}

/** A mask over Nb blocks: 'vs' (vertical 0 and a few stripes, slash 0 and one more), 'rows' (its expansion), 'mixed' (both). */
function maskOf(seed: number, form: 'vs' | 'rows' | 'mixed', Nb: number): BlockMask {
  const r = seededValues(seed, H * Nb * 2);
  const vertical: number[][] = [];
  const slash: number[][] = [];
  for (let h = 0; h < H; h++) {
    vertical.push([0, ...Array.from({ length: Nb }, (_, J) => J).filter((J) => J > 0 && r[h * Nb + J] > 0.3)]);
    slash.push(Nb > 2 ? [0, 2] : [0]);
  }
  const vsMask: BlockMask = { heads: H, numBlocks: Nb, blockSize: B, vs: vsListsFromArrays(vertical, slash) };
  if (form === 'vs') return vsMask;
  const rows = expandToRows(vsMask);
  if (form === 'rows') return { heads: H, numBlocks: Nb, blockSize: B, rows };
  // mixed: a sparser VS part (vertical 0 only) plus the rows of the first one
  const v0 = vsListsFromArrays(Array.from({ length: H }, () => [0]), Array.from({ length: H }, () => []));
  return { heads: H, numBlocks: Nb, blockSize: B, vs: v0, rows };
}

function packed(seed: number, dtype: DType, queries: readonly number[], keys: readonly number[]) {
  const Mq = queries.reduce((a, b) => a + b, 0);
  const Nk = keys.reduce((a, b) => a + b, 0);
  const k = seededValues(seed + 1, Nk * Hkv * D, 1.5);
  for (let r = 0; r < Nk; r++) if (r % 29 === 0) for (let x = 0; x < Hkv * D; x += 3) k[r * Hkv * D + x] += 1;
  return {
    q: hostTensor(dtype, [Mq, H, D], seededValues(seed, Mq * H * D, 1.5)),
    k: hostTensor(dtype, [Nk, Hkv, D], k),
    v: hostTensor(dtype, [Nk, Hkv, D], seededValues(seed + 2, Nk * Hkv * D)),
  };
}

function maxAbsDiff(a: ArrayLike<number>, b: ArrayLike<number>): number {
  let e = 0;
  for (let i = 0; i < a.length; i++) e = Math.max(e, Number.isFinite(a[i]) ? Math.abs(a[i] - b[i]) : Number.POSITIVE_INFINITY);
  return e;
}

function nanFilled(be: WebGpuBackend, dtype: DType, shape: number[]): DeviceTensor {
  const len = shape.reduce((x, y) => x * y, 1);
  const t = be.allocate(dtype, shape);
  be.write(t, 0, dtype === 'f32' ? new Float32Array(len).fill(Number.NaN) : new Uint16Array(len).fill(0x7e00));
  return t;
}

async function runBatch(be: WebGpuBackend, dtype: DType, seed: number, queries = QUERIES, keys = KEYS) {
  const x = packed(seed, dtype, queries, keys);
  const segments = segmentsOf(queries, keys);
  const forms = ['vs', 'rows', undefined, 'mixed'] as const;
  const masks = segments.map((g, i) => (forms[i % 4] ? maskOf(seed + 10 + i, forms[i % 4]!, numBlocks(g.keys, B)) : undefined));
  const batch: VarlenBatch = { blockSize: B, segments, masks };
  const d = { q: be.upload(x.q), k: be.upload(x.k), v: be.upload(x.v) };
  const out = nanFilled(be, dtype, [...x.q.shape]);
  const r = { q: ref.upload(x.q), k: ref.upload(x.k), v: ref.upload(x.v) };
  try {
    const got = await be.varlenAttention(d.q, d.k, d.v, batch, { out, returnLse: true });
    expect(got.output).toBe(out);
    const want = await ref.varlenAttention!(r.q, r.k, r.v, batch, { returnLse: true });
    const o = toFloat32(await be.download(got.output));
    const l = toFloat32(await be.download(got.lse!));
    got.lse!.dispose();
    return {
      out: o,
      lse: l,
      wantOut: toFloat32(await ref.download(want.output)),
      wantLse: toFloat32(await ref.download(want.lse!)),
    };
  } finally {
    for (const t of [d.q, d.k, d.v, out]) t.dispose();
  }
}

describe.skipIf(!backend)('varlenAttention on WebGPU', () => {
  const be = backend!;
  const seed = freshSeed();
  let split: WebGpuBackend | undefined;
  afterAll(() => split?.dispose());

  for (const dtype of ['f32', 'f16'] as const) {
    it(`writes every row of a poisoned output, equal to the reference per sequence (${dtype}, seed ${seed})`, async () => {
      const r = await runBatch(be, dtype, seed);
      expect(r.out.every(Number.isFinite)).toBe(true);
      expect(r.lse.every(Number.isFinite)).toBe(true);
      expect(maxAbsDiff(r.out, r.wantOut)).toBeLessThan(dtype === 'f32' ? 2e-5 : 2 ** -9);
      expect(maxAbsDiff(r.lse, r.wantLse)).toBeLessThan(dtype === 'f32' ? 2e-5 : 1e-4);
    });
  }

  it('gives the same answer split into many small dispatches (work bound per dispatch)', async () => {
    split = await createWebGpuBackend({ device: be.gpu.device, maxDispatchWork: 64 * 64 * D * 3 });
    const dispatch = vi.spyOn(split.gpu, 'dispatch');
    const r = await runBatch(split, 'f32', seed + 5);
    // (the mask expansions dispatch three programs each; the attention alone needs many)
    expect(dispatch.mock.calls.length).toBeGreaterThan(20);
    dispatch.mockRestore();
    expect(r.out.every(Number.isFinite)).toBe(true);
    expect(maxAbsDiff(r.out, r.wantOut)).toBeLessThan(2e-5);
    expect(maxAbsDiff(r.lse, r.wantLse)).toBeLessThan(2e-5);
  });

  it('keeps a non-finite input inside its own sequence: that sequence NaN, the others exact', async () => {
    const queries = [65, 40, 1];
    const keys = [65, 100, 1];
    const x = packed(seed + 9, 'f32', queries, keys);
    const segments = segmentsOf(queries, keys);
    // key row 0 of sequence 1 in every kv head (every one of its queries sees it); the reference (which
    // refuses non-finite input) gets the clean keys
    const bad = Float32Array.from(x.k.data as Float32Array);
    for (let g = 0; g < Hkv; g++) bad[(segments[1].kStart * Hkv + g) * D] = Number.POSITIVE_INFINITY;
    const batch: VarlenBatch = { blockSize: B, segments, masks: [undefined, undefined, undefined] };
    const d = { q: be.upload(x.q), k: be.upload({ ...x.k, data: bad }), v: be.upload(x.v) };
    const r = { q: ref.upload(x.q), k: ref.upload(x.k), v: ref.upload(x.v) };
    try {
      const got = await be.varlenAttention(d.q, d.k, d.v, batch);
      const o = toFloat32(await be.download(got.output));
      got.output.dispose();
      const want = toFloat32(await ref.download((await ref.varlenAttention!(r.q, r.k, r.v, batch)).output));
      const row = H * D;
      for (const [i, g] of segments.entries()) {
        const part = o.subarray(g.qStart * row, (g.qStart + g.queries) * row);
        if (i === 1) expect(part.every(Number.isNaN), 'sequence 1').toBe(true);
        else expect(maxAbsDiff(part, want.subarray(g.qStart * row, (g.qStart + g.queries) * row)), `sequence ${i}`).toBeLessThan(2e-5);
      }
    } finally {
      for (const t of [d.q, d.k, d.v]) t.dispose();
    }
  });

  it('refuses bad batches with typed errors before any dispatch', async () => {
    const x = packed(seed, 'f32', [2, 3], [4, 3]);
    const d = { q: be.upload(x.q), k: be.upload(x.k), v: be.upload(x.v) };
    const segments = segmentsOf([2, 3], [4, 3]);
    const ok: VarlenBatch = { blockSize: B, segments, masks: [undefined, undefined] };
    const dispatch = vi.spyOn(be.gpu, 'dispatch');
    try {
      const bad: [string, unknown, string][] = [
        ['no batch', undefined, 'INVALID_ARGUMENT'],
        ['an unsupported block size', { ...ok, blockSize: 32 }, 'INVALID_ARGUMENT'],
        ['no segments', { ...ok, segments: [], masks: [] }, 'INVALID_ARGUMENT'],
        ['masks of the wrong length', { ...ok, masks: [undefined] }, 'INVALID_ARGUMENT'],
        ['more queries than keys', { ...ok, segments: [{ qStart: 0, queries: 2, kStart: 0, keys: 1 }, segments[1]] }, 'SHAPE_MISMATCH'],
        ['overlapping query ranges', { ...ok, segments: [segments[0], { ...segments[1], qStart: 1 }] }, 'SHAPE_MISMATCH'],
        ['keys past the end of k', { ...ok, segments: [segments[0], { ...segments[1], kStart: 5 }] }, 'SHAPE_MISMATCH'],
        ['a fractional row', { ...ok, segments: [{ ...segments[0], qStart: 0.5 }, segments[1]] }, 'INVALID_ARGUMENT'],
        ['a mask over the wrong block count', { ...ok, masks: [maskOf(1, 'vs', 3), undefined] }, 'INVALID_MASK'],
        ['a prepared mask', { ...ok, prepared: [{ backend: 'cuda', released: false, release() {} }, undefined] }, 'WRONG_BACKEND'],
      ];
      for (const [what, batch, want] of bad) {
        expect(await code(() => be.varlenAttention(d.q, d.k, d.v, batch as VarlenBatch)), what).toBe(want);
      }
      const other = ref.upload(x.q);
      expect(await code(() => be.varlenAttention(other, d.k, d.v, ok))).toBe('WRONG_BACKEND');
      expect(await code(() => be.varlenAttention(d.q, d.k, d.v, ok, { out: d.q }))).toBe('INVALID_ARGUMENT');
      expect(await code(() => be.varlenAttention(d.q, d.k, d.v, ok, { scale: -1 }))).toBe('INVALID_ARGUMENT');
      expect(dispatch).not.toHaveBeenCalled();
      // and the good batch runs
      const res = await be.varlenAttention(d.q, d.k, d.v, ok);
      expect(dispatch).toHaveBeenCalled();
      res.output.dispose();
    } finally {
      dispatch.mockRestore();
      for (const t of [d.q, d.k, d.v]) t.dispose();
    }
  });
});

describe.skipIf(!backend)('sliceRows on WebGPU', () => {
  const be = backend!;
  const seed = freshSeed();

  async function rowsOf(t: HostTensor, start: number, rows: number): Promise<Float32Array> {
    const per = t.shape.slice(1).reduce((a, b) => a * b, 1);
    return toFloat32(t).slice(start * per, (start + rows) * per);
  }

  it(`reads back the rows of views (aligned) and copies (unaligned), and of a slice of a slice (seed ${seed})`, async () => {
    for (const [dtype, shape] of [
      ['f32', [40, 4, 64]],
      ['f16', [40, 1, 64]],
      ['f32', [40, 3]],
    ] as const) {
      const h = hostTensor(dtype, [...shape], seededValues(seed, shape.reduce((a: number, b: number) => a * b, 1)));
      const t = be.upload(h);
      try {
        for (const [start, rows] of [
          [0, 40],
          [0, 1],
          [1, 7],
          [2, 38],
          [39, 1],
        ]) {
          const s = be.sliceRows(t, start, rows);
          expect(s.shape).toEqual([rows, ...shape.slice(1)]);
          expect(toFloat32(await be.download(s))).toEqual(await rowsOf(h, start, rows));
          const inner = be.sliceRows(s, 0, 1);
          expect(toFloat32(await be.download(inner))).toEqual(await rowsOf(h, start, 1));
          inner.dispose();
          s.dispose();
        }
        // disposing the slices left the parent whole
        expect(toFloat32(await be.download(t))).toEqual(toFloat32(h));
      } finally {
        t.dispose();
      }
    }
  });

  it('attends over slices exactly as over the same rows uploaded on their own', async () => {
    // f16 rows of one head are 128 bytes: odd starts are copies, even ones (256) views or copies by the device's alignment
    for (const [start, rows] of [
      [3, 70],
      [4, 130],
    ]) {
      const h = packed(seed, 'f16', [200], [200]);
      const k1 = { ...h.k, shape: [200 * Hkv, 1, D] };
      const whole = { k: be.upload(k1), v: be.upload({ ...h.v, shape: [200 * Hkv, 1, D] }) };
      const own = toFloat32(k1).slice(start * D, (start + rows) * D);
      const ownV = toFloat32({ ...h.v, shape: [200 * Hkv, 1, D] }).slice(start * D, (start + rows) * D);
      const alone = { k: be.upload(hostTensor('f16', [rows, 1, D], own)), v: be.upload(hostTensor('f16', [rows, 1, D], ownV)) };
      const q = be.upload(hostTensor('f16', [rows, 1, D], seededValues(seed + 7, rows * D, 1.5)));
      const sk = be.sliceRows(whole.k, start, rows);
      const sv = be.sliceRows(whole.v, start, rows);
      try {
        const a = await be.denseAttention(q, sk, sv);
        const b = await be.denseAttention(q, alone.k, alone.v);
        expect(toFloat32(await be.download(a.output))).toEqual(toFloat32(await be.download(b.output)));
        a.output.dispose();
        b.output.dispose();
      } finally {
        for (const t of [sk, sv, q, whole.k, whole.v, alone.k, alone.v]) t.dispose();
      }
    }
  });

  it('refuses bad ranges, disposed and foreign tensors with typed errors', async () => {
    const t = be.upload(hostTensor('f32', [8, 4], seededValues(seed, 32)));
    try {
      for (const [start, rows] of [
        [-1, 2],
        [0, 0],
        [7, 2],
        [0.5, 1],
        [0, Number.NaN],
      ]) {
        expect(await code(() => be.sliceRows(t, start, rows)), `${start}, ${rows}`).toBe('INVALID_ARGUMENT');
      }
      expect(await code(() => be.sliceRows(ref.upload(hostTensor('f32', [8, 4], new Float32Array(32))), 0, 1))).toBe('WRONG_BACKEND');
      const s = be.sliceRows(t, 4, 4);
      s.dispose();
      expect(await code(() => be.download(s))).toBe('DISPOSED');
      // rows of 1 KiB: row 4 starts at a multiple of every allowed offset alignment, so a view
      const wide = be.upload(hostTensor('f32', [8, 256], seededValues(seed, 2048)));
      const view = be.sliceRows(wide, 4, 4);
      expect(await code(() => be.bufferOf(view))).toBe('INVALID_ARGUMENT');
      view.dispose();
      expect(await code(() => be.bufferOf(wide))).toBe(undefined);
      wide.dispose();
    } finally {
      t.dispose();
    }
    expect(await code(() => be.sliceRows(t, 0, 1))).toBe('DISPOSED');
  });
});

if (!backend) {
  describe('varlen on WebGPU', () => {
    it.skip(`skipped: ${reason}`, () => {});
  });
}
