import {
  type Backend,
  type BlockMask,
  type BlockRows,
  type DType,
  type HostTensor,
  denseRows,
  hostTensor,
  isCrispError,
  roundTo,
  toFloat32,
  mulberry32 as rng,
  vsListsFromArrays,
} from '@crisp/core';
import { describe, expect, it } from 'vitest';
import { attentionRows, createReferenceBackend, massRecall, pooledBlockMap, relativeError } from './index.js';

// --- seeded inputs (mulberry32); the seed is printed in every failing assertion message ---
const SEED = Number(process.env.CRISP_SEED ?? Math.floor(Math.random() * 2 ** 31));
const rand = rng(SEED);
const msg = (what: string) => `${what} (seed ${SEED}; rerun with CRISP_SEED=${SEED})`;
function randn(): number {
  return Math.sqrt(-2 * Math.log(1 - rand())) * Math.cos(2 * Math.PI * rand());
}
function randomTensor(shape: number[], dtype: DType = 'f32', amp = 1): HostTensor {
  const len = shape.reduce((a, b) => a * b, 1);
  return hostTensor(dtype, shape, Array.from({ length: len }, () => amp * randn()));
}

// --- brute force: materialise everything with plain arrays ---
function at(t: HostTensor): (r: number, h: number, c: number) => number {
  const v = toFloat32(t);
  const [, H, d] = t.shape;
  return (r, h, c) => v[(r * H + h) * d + c];
}
/** Â row of query row i (absolute position pos) for head h: probabilities over j <= pos. */
function bruteRow(q: HostTensor, k: HostTensor, h: number, i: number, scale: number, keep?: (j: number) => boolean) {
  const [m, H, d] = q.shape;
  const [n, Hkv] = k.shape;
  const g = Math.floor(h / (H / Hkv));
  const Q = at(q);
  const K = at(k);
  const pos = n - m + i;
  const logits: number[] = [];
  for (let j = 0; j <= pos; j++) {
    let s = 0;
    for (let c = 0; c < d; c++) s += Q(i, h, c) * K(j, g, c);
    logits.push(keep && !keep(j) ? Number.NEGATIVE_INFINITY : s * scale);
  }
  const mx = Math.max(...logits);
  const e = logits.map((x) => Math.exp(x - mx));
  const z = e.reduce((a, b) => a + b, 0);
  return { p: e.map((x) => x / z), lse: mx + Math.log(z) };
}
function bruteAttention(q: HostTensor, k: HostTensor, v: HostTensor, keepBlock?: (h: number, I: number, J: number) => boolean, B = 16) {
  const [m, H, d] = q.shape;
  const [n, Hkv] = k.shape;
  const V = at(v);
  const out = new Float64Array(m * H * d);
  const lse = new Float64Array(H * m);
  for (let h = 0; h < H; h++) {
    const g = Math.floor(h / (H / Hkv));
    for (let i = 0; i < m; i++) {
      const I = Math.floor((n - m + i) / B);
      const { p, lse: l } = bruteRow(q, k, h, i, 1 / Math.sqrt(d), keepBlock ? (j) => keepBlock(h, I, Math.floor(j / B)) : undefined);
      lse[h * m + i] = l;
      for (let c = 0; c < d; c++) {
        let s = 0;
        for (let j = 0; j < p.length; j++) s += p[j] * V(j, g, c);
        out[(i * H + h) * d + c] = s;
      }
    }
  }
  return { out, lse };
}
function maxAbsDiff(a: ArrayLike<number>, b: ArrayLike<number>): number {
  expect(a.length).toBe(b.length);
  let m = 0;
  for (let i = 0; i < a.length; i++) {
    const e = Math.abs(a[i] - b[i]);
    if (!(e <= m)) m = e; // NaN propagates
  }
  return m;
}
async function expectCode(p: (() => unknown) | Promise<unknown>, code: string): Promise<void> {
  try {
    await (typeof p === 'function' ? p() : p);
  } catch (e) {
    if (!isCrispError(e)) throw e;
    expect(e.code).toBe(code);
    expect(e.message.length).toBeGreaterThan(10);
    return;
  }
  throw new Error(`expected a CrispError with code ${code}, nothing was thrown`);
}
async function run(be: Backend, q: HostTensor, k: HostTensor, v: HostTensor, mask?: BlockMask, returnLse = true) {
  const [qd, kd, vd] = [be.upload(q), be.upload(k), be.upload(v)];
  const r = mask
    ? await be.sparseAttention(qd, kd, vd, mask, { returnLse })
    : await be.denseAttention(qd, kd, vd, { returnLse });
  const output = await be.download(r.output);
  const lse = r.lse ? toFloat32(await be.download(r.lse)) : undefined;
  return { output, out: toFloat32(output), lse };
}
function rowsMask(H: number, Nb: number, B: number, keep: (h: number, I: number, J: number) => boolean): BlockMask {
  const rows: number[][] = [];
  for (let h = 0; h < H; h++) for (let I = 0; I < Nb; I++) rows.push([...Array(I + 1).keys()].filter((J) => keep(h, I, J)));
  const rowPtr = new Int32Array(rows.length + 1);
  rows.forEach((r, i) => {
    rowPtr[i + 1] = rowPtr[i] + r.length;
  });
  return { heads: H, numBlocks: Nb, blockSize: B, rows: { rowPtr, cols: Int32Array.from(rows.flat()) } };
}

describe('reference attention', () => {
  it('n = 3: hand-computed softmax weights 1:2:3 and log-sum-exp', async () => {
    const be = createReferenceBackend();
    const d = 16;
    const qv = new Array(3 * d).fill(0);
    const kv = new Array(3 * d).fill(0);
    const vv = new Array(3 * d).fill(0);
    const logit = [0, Math.log(2), Math.log(3)];
    for (let i = 0; i < 3; i++) {
      qv[i * d] = 1;
      kv[i * d] = logit[i] * 4; // scale 1/sqrt(16) = 1/4 gives logits 0, ln 2, ln 3
      vv[i * d + 1] = i + 1;
      vv[i * d + 2] = 10;
    }
    const { out, lse } = await run(
      be,
      hostTensor('f32', [3, 1, d], qv),
      hostTensor('f32', [3, 1, d], kv),
      hostTensor('f32', [3, 1, d], vv),
    );
    // row 0 sees v0; row 1 weights 1:2 -> (1 + 4) / 3; row 2 weights 1:2:3 -> 14 / 6
    expect(out[0 * d + 1]).toBeCloseTo(1, 6);
    expect(out[1 * d + 1]).toBeCloseTo(5 / 3, 6);
    expect(out[2 * d + 1]).toBeCloseTo(14 / 6, 6);
    for (let i = 0; i < 3; i++) expect(out[i * d + 2]).toBeCloseTo(10, 5);
    expect(out[2 * d + 5]).toBe(0);
    expect(Array.from(lse!)).toEqual([0, Math.log(3), Math.log(6)].map((x) => expect.closeTo(x, 6)));
  });

  it('dense attention and LSE match brute force (GQA 4:2, n not a multiple of B)', async () => {
    const be = createReferenceBackend();
    const [n, H, Hkv, d] = [37, 4, 2, 16];
    const q = randomTensor([n, H, d]);
    const k = randomTensor([n, Hkv, d]);
    const v = randomTensor([n, Hkv, d]);
    const { out, lse } = await run(be, q, k, v);
    const ref = bruteAttention(q, k, v);
    expect(maxAbsDiff(out, ref.out), msg('output')).toBeLessThan(1e-5);
    expect(maxAbsDiff(lse!, ref.lse), msg('lse')).toBeLessThan(1e-5);
  });

  it('sparse attention over a random mask matches brute force, causal inside the diagonal block', async () => {
    const be = createReferenceBackend();
    const [n, H, Hkv, d, B] = [75, 2, 1, 32, 16];
    const Nb = Math.ceil(n / B);
    const q = randomTensor([n, H, d]);
    const k = randomTensor([n, Hkv, d]);
    const v = randomTensor([n, Hkv, d]);
    const sel = new Map<string, boolean>();
    const keep = (h: number, I: number, J: number) => {
      const key = `${h},${I},${J}`;
      if (!sel.has(key)) sel.set(key, J === I || rand() < 0.5);
      return sel.get(key)!;
    };
    const mask = rowsMask(H, Nb, B, keep);
    const { out, lse } = await run(be, q, k, v, mask);
    const ref = bruteAttention(q, k, v, keep, B);
    expect(maxAbsDiff(out, ref.out), msg('sparse output')).toBeLessThan(1e-5);
    expect(maxAbsDiff(lse!, ref.lse), msg('sparse lse')).toBeLessThan(1e-5);
    const rowsOnly = attentionRows(q, k, v, [0, 17, 74], mask);
    for (const [t, i] of [0, 17, 74].entries()) {
      for (let c = 0; c < H * d; c++) expect(rowsOnly.output[t * H * d + c]).toBeCloseTo(ref.out[i * H * d + c], 9);
    }
  });

  it('a VS mask and its expanded rows give identical outputs', async () => {
    const be = createReferenceBackend();
    const [n, H, d, B] = [64, 2, 16, 16];
    const q = randomTensor([n, H, d]);
    const k = randomTensor([n, H, d]);
    const v = randomTensor([n, H, d]);
    const vs: BlockMask = { heads: H, numBlocks: 4, blockSize: B, vs: vsListsFromArrays([[0], [1]], [[0], [0, 2]]) };
    const rows = await be.expandMask(vs);
    expect(Array.from(rows.cols.subarray(rows.rowPtr[0], rows.rowPtr[4]))).toEqual([0, 0, 1, 0, 2, 0, 3]);
    // head 1: vertical 1 (I >= 1), slash offsets 0 and 2: row 0 {0}, row 1 {1}, row 2 {0, 1, 2}, row 3 {1, 3}
    expect(Array.from(rows.rowPtr.subarray(4))).toEqual([7, 8, 9, 12, 14]);
    const a = await run(be, q, k, v, vs);
    const b = await run(be, q, k, v, { heads: H, numBlocks: 4, blockSize: B, rows });
    expect(Array.from(a.out)).toEqual(Array.from(b.out));
  });

  it('a mask that leaves a query block with no key block is INVALID_MASK, with nothing written to out', async () => {
    const be = createReferenceBackend();
    const [n, H, d, B] = [64, 2, 16, 16];
    const [q, k, v] = [randomTensor([n, H, d]), randomTensor([n, H, d]), randomTensor([n, H, d])];
    const [qd, kd, vd] = [be.upload(q), be.upload(k), be.upload(v)];
    // head 1: vertical 1 and slash 2 leave query block 0 with nothing to attend to
    const holes: BlockMask = { heads: H, numBlocks: 4, blockSize: B, vs: vsListsFromArrays([[0], [1]], [[0], [2]]) };
    const out = be.allocate('f32', [n, H, d]);
    const before = toFloat32(await be.download(out));
    const err = await be.sparseAttention(qd, kd, vd, holes, { out }).catch((e: unknown) => e);
    expect(isCrispError(err, 'INVALID_MASK'), String(err)).toBe(true);
    expect((err as Error).message).toMatch(/head 1: query block 0 selects no key block/);
    expect(Array.from(toFloat32(await be.download(out))).every((x, i) => Object.is(x, before[i]))).toBe(true);
    expect(isCrispError(await be.expandMask(holes).catch((e: unknown) => e), 'INVALID_MASK')).toBe(true);
    // a row of its own covers the block
    const rowPtr = new Int32Array(H * 4 + 1);
    rowPtr.fill(1, 4 + 1);
    const patched: BlockMask = { ...holes, rows: { rowPtr, cols: Int32Array.of(0) } };
    expect(isCrispError(await be.sparseAttention(qd, kd, vd, patched).catch((e: unknown) => e))).toBe(false);
    // chunked prefill: q holds the last 32 of 64 positions, so query blocks 0 and 1 hold no rows and may stay empty
    const chunk = be.upload(randomTensor([32, H, d]));
    const late: BlockMask = { heads: H, numBlocks: 4, blockSize: B, vs: vsListsFromArrays([[2], [2]], [[], []]) };
    expect(isCrispError(await be.sparseAttention(chunk, kd, vd, late).catch((e: unknown) => e))).toBe(false);
    const tooLate: BlockMask = { ...late, vs: vsListsFromArrays([[3], [2]], [[], []]) };
    expect(isCrispError(await be.sparseAttention(chunk, kd, vd, tooLate).catch((e: unknown) => e), 'INVALID_MASK')).toBe(true);
  });

  it('the full mask equals dense attention bit for bit, in every dtype', async () => {
    const be = createReferenceBackend();
    for (const dtype of ['f32', 'f16', 'bf16'] as DType[]) {
      const [n, H, d, B] = [50, 2, 16, 16];
      const Nb = Math.ceil(n / B);
      const q = randomTensor([n, H, d], dtype);
      const k = randomTensor([n, 1, d], dtype);
      const v = randomTensor([n, 1, d], dtype);
      const dense = await run(be, q, k, v);
      const full = await run(be, q, k, v, { heads: H, numBlocks: Nb, blockSize: B, rows: denseRows(H, Nb) });
      const allVertical: BlockMask = {
        heads: H,
        numBlocks: Nb,
        blockSize: B,
        vs: vsListsFromArrays([[0, 1, 2, 3], [0, 1, 2, 3]], [[], []]),
      };
      const vert = await run(be, q, k, v, allVertical);
      expect(full.output.dtype).toBe(dtype);
      expect(Array.from(full.output.data)).toEqual(Array.from(dense.output.data));
      expect(Array.from(vert.output.data)).toEqual(Array.from(dense.output.data));
      // the output is the float64 result rounded once to the dtype
      const exact = attentionRows(q, k, v, [0, 25, 49]);
      for (const [t, i] of [0, 25, 49].entries()) {
        for (let c = 0; c < H * d; c++) {
          expect(dense.out[i * H * d + c], msg(dtype)).toBe(roundTo(dtype, exact.output[t * H * d + c]));
        }
      }
    }
  });

  it('GQA: query head h reads kv head floor(h / (H / Hkv)), checked against explicitly repeated kv heads', async () => {
    const be = createReferenceBackend();
    for (const [H, Hkv] of [
      [4, 1],
      [8, 2],
      [4, 4],
    ]) {
      const [n, d] = [20, 16];
      const q = randomTensor([n, H, d]);
      const k = randomTensor([n, Hkv, d]);
      const v = randomTensor([n, Hkv, d]);
      const rep = (t: HostTensor) => {
        const x = toFloat32(t);
        const y = new Float32Array(n * H * d);
        for (let j = 0; j < n; j++)
          for (let h = 0; h < H; h++)
            y.set(x.subarray((j * Hkv + Math.floor(h / (H / Hkv))) * d, (j * Hkv + Math.floor(h / (H / Hkv)) + 1) * d), (j * H + h) * d);
        return hostTensor('f32', [n, H, d], y);
      };
      const a = await run(be, q, k, v);
      const b = await run(be, q, rep(k), rep(v));
      expect(Array.from(a.out)).toEqual(Array.from(b.out));
    }
  });

  it('chunked prefill: the last m query rows equal full prefill sliced', async () => {
    const be = createReferenceBackend();
    const [n, m, H, d, B] = [45, 14, 2, 16, 16]; // m = 14: row grouping differs from full prefill
    const q = randomTensor([n, H, d]);
    const k = randomTensor([n, 1, d]);
    const v = randomTensor([n, 1, d]);
    const qLast = hostTensor('f32', [m, H, d], toFloat32(q).subarray((n - m) * H * d));
    const full = await run(be, q, k, v);
    const chunk = await run(be, qLast, k, v);
    expect(Array.from(chunk.out)).toEqual(Array.from(full.out.subarray((n - m) * H * d)));
    for (let h = 0; h < H; h++) {
      for (let i = 0; i < m; i++) expect(chunk.lse![h * m + i]).toBe(full.lse![h * n + n - m + i]);
    }
    const Nb = Math.ceil(n / B);
    const mask = rowsMask(H, Nb, B, (_h, I, J) => J === I || J === 0);
    const fullS = await run(be, q, k, v, mask);
    const chunkS = await run(be, qLast, k, v, mask);
    expect(Array.from(chunkS.out)).toEqual(Array.from(fullS.out.subarray((n - m) * H * d)));
  });

  it('honours opts.out: a NaN-poisoned output is overwritten completely', async () => {
    const be = createReferenceBackend();
    const [n, H, d] = [33, 2, 16];
    const q = be.upload(randomTensor([n, H, d], 'bf16'));
    const k = be.upload(randomTensor([n, 2, d], 'bf16'));
    const v = be.upload(randomTensor([n, 2, d], 'bf16'));
    const out = be.allocate('bf16', [n, H, d]);
    be.write(out, 0, new Uint16Array(n * H * d).fill(0x7fc0));
    const r = await be.denseAttention(q, k, v, { out });
    expect(r.output).toBe(out);
    const got = toFloat32(await be.download(out));
    expect(got.every(Number.isFinite)).toBe(true);
    const fresh = toFloat32(await be.download((await be.denseAttention(q, k, v)).output));
    expect(Array.from(got)).toEqual(Array.from(fresh));
  });
});

describe('reference proxy statistics', () => {
  /** Materialise Â [b, n] per head and reduce it the obvious way. */
  function bruteStats(q: HostTensor, k: HostTensor, B: number, wSink: number, wLocal: number) {
    const [n, H, d] = q.shape;
    const Hkv = k.shape[1];
    const b = Math.min(B, n);
    const Nb = Math.ceil(n / B);
    const scale = 1 / Math.sqrt(d);
    const res = { cStruct: [] as number[], pv: [] as number[], ps: [] as number[], av: [] as number[], as: [] as number[], ent: [] as number[], pooled: [] as number[] };
    const Q = at(q);
    const K = at(k);
    for (let h = 0; h < H; h++) {
      const A: number[][] = [];
      for (let t = 0; t < b; t++) {
        const row = bruteRow(q, k, h, n - b + t, scale).p;
        A.push([...row, ...new Array(n - row.length).fill(0)]);
      }
      const av = new Array(n).fill(0);
      const as = new Array(n).fill(0);
      let c = 0;
      let ent = 0;
      for (let t = 0; t < b; t++) {
        const pos = n - b + t;
        for (let j = 0; j < n; j++) {
          av[j] += A[t][j] / b;
          if (j <= pos) as[pos - j] += A[t][j] / b;
          if (j < wSink || j >= n - wLocal) c += A[t][j] / b;
          if (A[t][j] > 0) ent -= (A[t][j] * Math.log(A[t][j])) / b;
        }
      }
      res.cStruct.push(c);
      res.ent.push(ent);
      res.av.push(...av);
      res.as.push(...as);
      for (let J = 0; J < Nb; J++) {
        res.pv.push(av.slice(J * B, J * B + B).reduce((x, y) => x + y, 0));
        res.ps.push(as.slice(J * B, J * B + B).reduce((x, y) => x + y, 0));
      }
      const g = Math.floor(h / (H / Hkv));
      const qm = new Array(d).fill(0);
      for (let t = 0; t < b; t++) for (let e = 0; e < d; e++) qm[e] += Q(n - b + t, h, e) / b;
      const logits: number[] = [];
      for (let J = 0; J < Nb; J++) {
        const cnt = Math.min(B, n - J * B);
        let s = 0;
        for (let e = 0; e < d; e++) {
          let km = 0;
          for (let j = J * B; j < J * B + cnt; j++) km += K(j, g, e);
          s += qm[e] * (km / cnt);
        }
        logits.push(s * scale);
      }
      const mx = Math.max(...logits);
      const z = logits.reduce((a, x) => a + Math.exp(x - mx), 0);
      res.pooled.push(...logits.map((x) => Math.exp(x - mx) / z));
    }
    return res;
  }

  it('matches Â materialised by brute force: C_struct, a_v, a_s by offset, p_v, p_s, entropy, pooled estimate', async () => {
    const be = createReferenceBackend();
    const [n, H, Hkv, d, B, wSink, wLocal] = [70, 4, 2, 16, 16, 8, 12];
    const q = randomTensor([n, H, d], 'f32', 1.5);
    const k = randomTensor([n, Hkv, d], 'f32', 1.5);
    const s = await be.proxyStats(be.upload(q), be.upload(k), { blockSize: B, wSink, wLocal, tokenScores: true });
    const ref = bruteStats(q, k, B, wSink, wLocal);
    expect(s.proxyRows).toBe(16);
    expect(s.numBlocks).toBe(5);
    expect(maxAbsDiff(s.cStruct, ref.cStruct), msg('cStruct')).toBeLessThan(1e-12);
    expect(maxAbsDiff(s.verticalBlocks, ref.pv), msg('p_v')).toBeLessThan(1e-12);
    expect(maxAbsDiff(s.slashBlocks, ref.ps), msg('p_s')).toBeLessThan(1e-12);
    expect(maxAbsDiff(s.rowEntropy, ref.ent), msg('entropy')).toBeLessThan(1e-10);
    expect(maxAbsDiff(s.pooledEstimate, ref.pooled), msg('pooled')).toBeLessThan(1e-12);
    expect(maxAbsDiff(s.verticalTokens!, ref.av), msg('a_v')).toBeLessThan(1e-7);
    expect(maxAbsDiff(s.slashTokens!, ref.as), msg('a_s')).toBeLessThan(1e-7);
    for (let h = 0; h < H; h++) {
      const sum = (a: Float64Array) => a.subarray(h * 5, h * 5 + 5).reduce((x, y) => x + y, 0);
      expect(sum(s.verticalBlocks)).toBeCloseTo(1, 12);
      expect(sum(s.slashBlocks)).toBeCloseTo(1, 12);
      expect(sum(s.pooledEstimate)).toBeCloseTo(1, 12);
    }
    const noTokens = await be.proxyStats(be.upload(q), be.upload(k), { blockSize: B, wSink, wLocal });
    expect(noTokens.verticalTokens).toBeUndefined();
  });

  it('slash offset 0 is the diagonal: self-attending heads put their slash mass on offset block 0', async () => {
    const be = createReferenceBackend();
    const [n, d, B] = [96, 32, 32];
    // Keys equal to queries, large: each proxy row attends to itself, offset o = 0.
    const q = randomTensor([n, 1, d], 'f32', 6);
    const s = await be.proxyStats(be.upload(q), be.upload(q), { blockSize: B, wSink: 4, wLocal: 4, tokenScores: true });
    expect(s.slashTokens![0], msg('a_s[0]')).toBeGreaterThan(0.95);
    expect(s.slashBlocks[0]).toBeGreaterThan(0.95);
    // vertically the mass sits on the last block (the proxy rows' own keys)
    expect(s.verticalBlocks[2]).toBeGreaterThan(0.95);
    // C_struct: the local window of 4 holds the last 4 proxy rows' self-attention, ~4/32 of the mass
    expect(s.cStruct[0]).toBeGreaterThan(0.1);
    expect(s.cStruct[0]).toBeLessThan(0.2);
  });

  it('C_struct counts overlapping sink and local windows once (stays <= 1); b = n when n < B', async () => {
    const be = createReferenceBackend();
    const q = randomTensor([20, 2, 16]);
    const k = randomTensor([20, 1, 16]);
    const s = await be.proxyStats(be.upload(q), be.upload(k), { blockSize: 32, wSink: 128, wLocal: 128 });
    expect(s.proxyRows).toBe(20);
    expect(s.numBlocks).toBe(1);
    for (const c of s.cStruct) expect(c).toBeCloseTo(1, 12);
  });
});

describe('reference PE rows', () => {
  it('ties break to the lower flat index and the shortest prefix reaching gamma is kept', async () => {
    const be = createReferenceBackend();
    // Zero queries make every row of Ā uniform: values 1/4, 1/8 x2, 1/12 x3, 1/16 x4 (Nb = 4).
    const q = hostTensor('f32', [64, 1, 16], new Float32Array(64 * 16));
    const k = randomTensor([64, 1, 16]);
    const rowsOf = async (gamma: number) => {
      const r = await be.peBlockRows(be.upload(q), be.upload(k), { blockSize: 16, gamma, heads: [0] });
      return [0, 1, 2, 3].map((I) => Array.from(r.cols.subarray(r.rowPtr[I], r.rowPtr[I + 1])));
    };
    expect(await rowsOf(0.5)).toEqual([[0], [0, 1], [], []]); // 1/4 + 1/8 + 1/8 reaches 0.5 exactly
    expect(await rowsOf(0.55)).toEqual([[0], [0, 1], [0], []]);
    expect(await rowsOf(0.2)).toEqual([[0], [], [], []]);
    expect(await rowsOf(1)).toEqual([[0], [0, 1], [0, 1, 2], [0, 1, 2, 3]]);
  });

  it('matches a brute-force pooled map for the listed heads (partial last block, GQA)', async () => {
    const be = createReferenceBackend();
    const [n, H, Hkv, d, B, gamma] = [90, 4, 2, 16, 16, 0.9];
    const Nb = Math.ceil(n / B);
    const q = randomTensor([n, H, d], 'f32', 2);
    const k = randomTensor([n, Hkv, d], 'f32', 2);
    const heads = [1, 2];
    const r = await be.peBlockRows(be.upload(q), be.upload(k), { blockSize: B, gamma, heads });
    expect(r.rowPtr.length).toBe(heads.length * Nb + 1);
    const Q = at(q);
    const K = at(k);
    const mean = (T: typeof Q, h: number, blk: number) => {
      const cnt = Math.min(B, n - blk * B);
      return Array.from({ length: d }, (_, e) => {
        let s = 0;
        for (let j = blk * B; j < blk * B + cnt; j++) s += T(j, h, e);
        return s / cnt;
      });
    };
    for (const [slot, h] of heads.entries()) {
      const g = Math.floor(h / 2);
      const entries: { I: number; J: number; p: number }[] = [];
      for (let I = 0; I < Nb; I++) {
        const qm = mean(Q, h, I);
        const logits = Array.from({ length: I + 1 }, (_, J) => mean(K, g, J).reduce((a, x, e) => a + x * qm[e], 0) / 4);
        const mx = Math.max(...logits);
        const z = logits.reduce((a, x) => a + Math.exp(x - mx), 0);
        for (const [J, x] of logits.entries()) entries.push({ I, J, p: Math.exp(x - mx) / z / Nb });
      }
      const map = pooledBlockMap(q, k, B, heads);
      expect(maxAbsDiff(map.values[slot], entries.map((e) => e.p)), msg('pooledBlockMap')).toBeLessThan(1e-12);
      const sorted = entries.map((e, f) => ({ ...e, f })).sort((a, b) => b.p - a.p || a.f - b.f);
      expect(Array.from(map.order[slot])).toEqual(sorted.map((e) => e.f));
      let cum = 0;
      const kept = new Set<string>();
      for (const e of sorted) {
        kept.add(`${e.I},${e.J}`);
        cum += e.p;
        if (cum >= gamma) break;
      }
      const got = new Set<string>();
      for (let I = 0; I < Nb; I++) {
        for (let p = r.rowPtr[slot * Nb + I]; p < r.rowPtr[slot * Nb + I + 1]; p++) got.add(`${I},${r.cols[p]}`);
      }
      expect([...got].sort(), msg(`head ${h}`)).toEqual([...kept].sort());
    }
  });
});

describe('reference bad input', () => {
  const be = createReferenceBackend();
  const q = () => be.upload(randomTensor([40, 4, 16]));
  const kv = () => be.upload(randomTensor([40, 2, 16]));
  const opts = { blockSize: 16, wSink: 16, wLocal: 16 };

  it('shape, dtype and capability errors', async () => {
    await expectCode(be.denseAttention(be.upload(randomTensor([40, 64])), kv(), kv()), 'SHAPE_MISMATCH');
    await expectCode(be.denseAttention(q(), be.upload(randomTensor([40, 3, 16])), be.upload(randomTensor([40, 3, 16]))), 'SHAPE_MISMATCH');
    await expectCode(be.denseAttention(be.upload(randomTensor([41, 4, 16])), kv(), kv()), 'SHAPE_MISMATCH');
    await expectCode(be.denseAttention(q(), kv(), be.upload(randomTensor([40, 2, 16], 'f16'))), 'DTYPE_MISMATCH');
    await expectCode(
      be.denseAttention(be.upload(randomTensor([8, 1, 24])), be.upload(randomTensor([8, 1, 24])), be.upload(randomTensor([8, 1, 24]))),
      'UNSUPPORTED',
    );
    const big = be.allocate('f16', [65537, 1, 16]);
    await expectCode(be.proxyStats(big, big, opts), 'LIMIT_EXCEEDED');
    await expectCode(be.proxyStats(q(), kv(), { ...opts, blockSize: 48 }), 'INVALID_ARGUMENT');
    await expectCode(be.proxyStats(q(), kv(), { ...opts, wSink: -1 }), 'INVALID_ARGUMENT');
    await expectCode(be.denseAttention(q(), kv(), kv(), { scale: Number.NaN }), 'INVALID_ARGUMENT');
    await expectCode(be.peBlockRows(q(), kv(), { blockSize: 16, gamma: 0, heads: [0] }), 'INVALID_ARGUMENT');
    await expectCode(be.peBlockRows(q(), kv(), { blockSize: 16, gamma: 0.9, heads: [2, 1] }), 'INVALID_ARGUMENT');
    await expectCode(be.peBlockRows(q(), kv(), { blockSize: 16, gamma: 0.9, heads: [4] }), 'INVALID_ARGUMENT');
  });

  it('NaN and Inf in q, k or v are NON_FINITE at proxyStats and attention', async () => {
    for (const [where, bad] of [
      ['q', Number.NaN],
      ['k', Number.POSITIVE_INFINITY],
      ['v', Number.NEGATIVE_INFINITY],
    ] as const) {
      const t = { q: randomTensor([40, 4, 16]), k: randomTensor([40, 2, 16]), v: randomTensor([40, 2, 16]) };
      const vals = toFloat32(t[where]).slice();
      vals[Math.floor(rand() * vals.length)] = bad;
      t[where] = hostTensor('f32', t[where].shape, vals);
      const [qd, kd, vd] = [be.upload(t.q), be.upload(t.k), be.upload(t.v)];
      await expectCode(be.denseAttention(qd, kd, vd), 'NON_FINITE');
      await expectCode(be.sparseAttention(qd, kd, vd, rowsMask(4, 3, 16, () => true)), 'NON_FINITE');
      if (where !== 'v') await expectCode(be.proxyStats(qd, kd, opts), 'NON_FINITE');
    }
  });

  it('mask errors are INVALID_MASK', async () => {
    const ok = rowsMask(4, 3, 16, (_h, I, J) => I === J);
    await expectCode(be.sparseAttention(q(), kv(), kv(), { ...ok, heads: 2 }), 'INVALID_MASK');
    await expectCode(be.sparseAttention(q(), kv(), kv(), { ...ok, numBlocks: 4 }), 'INVALID_MASK');
    const nonCausal: BlockRows = { rowPtr: ok.rows!.rowPtr, cols: ok.rows!.cols.map((x, i) => (i === 0 ? 1 : x)) };
    await expectCode(be.sparseAttention(q(), kv(), kv(), { ...ok, rows: nonCausal }), 'INVALID_MASK');
    await expectCode(be.expandMask({ ...ok, rows: nonCausal }), 'INVALID_MASK');
    await expectCode(be.sparseAttention(q(), kv(), kv(), { ...ok, blockSize: 24 }), 'INVALID_ARGUMENT');
  });

  it('disposed tensors, tensors of another backend, bad out tensors, bad writes', async () => {
    const t = q();
    t.dispose();
    expect(t.disposed).toBe(true);
    await expectCode(be.denseAttention(t, kv(), kv()), 'DISPOSED');
    await expectCode(be.download(t), 'DISPOSED');
    const other = createReferenceBackend();
    await expectCode(be.denseAttention(other.upload(randomTensor([40, 4, 16])), kv(), kv()), 'WRONG_BACKEND');
    const fake = { backend: 'webgpu', dtype: 'f32', shape: [40, 4, 16], disposed: false, dispose() {}, [Symbol.dispose]() {} };
    await expectCode(be.download(fake as never), 'WRONG_BACKEND');
    await expectCode(be.denseAttention(q(), kv(), kv(), { out: be.allocate('f32', [40, 4, 32]) }), 'SHAPE_MISMATCH');
    await expectCode(be.denseAttention(q(), kv(), kv(), { out: be.allocate('f16', [40, 4, 16]) }), 'DTYPE_MISMATCH');
    const dst = be.allocate('f16', [4]);
    await expectCode(() => be.write(dst, 0, new Float32Array(4)), 'DTYPE_MISMATCH');
    await expectCode(() => be.write(dst, 2, new Uint16Array(3)), 'INVALID_ARGUMENT');
    const gone = createReferenceBackend();
    const x = gone.upload(randomTensor([4, 1, 16]));
    gone.dispose();
    await expectCode(gone.download(x), 'DISPOSED');
  });
});

describe('metric helpers', () => {
  it('relativeError per head and overall', () => {
    const b = hostTensor('f32', [1, 2, 2], [3, 4, 1, 0]);
    const a = hostTensor('f32', [1, 2, 2], [3, 4, 1, 1]);
    const r = relativeError(a, b);
    expect(Array.from(r.perHead)).toEqual([0, 1]);
    expect(r.overall).toBeCloseTo(Math.sqrt(1 / 26), 12);
  });

  it('massRecall is 1 for the full mask and matches brute force for a diagonal-only mask', () => {
    const [n, H, d, B] = [48, 2, 16, 16];
    const q = randomTensor([n, H, d], 'f32', 2);
    const k = randomTensor([n, 1, d], 'f32', 2);
    const full = massRecall(q, k, { heads: H, numBlocks: 3, blockSize: B, rows: denseRows(H, 3) });
    expect(full.overall).toBeCloseTo(1, 12);
    const diag = rowsMask(H, 3, B, (_h, I, J) => I === J);
    const rows = [5, 20, 47];
    const r = massRecall(q, k, diag, { rows });
    for (let h = 0; h < H; h++) {
      let exp = 0;
      for (const i of rows) {
        const { p } = bruteRow(q, k, h, i, 1 / 4);
        exp += p.filter((_, j) => Math.floor(j / B) === Math.floor(i / B)).reduce((a, x) => a + x, 0) / rows.length;
      }
      expect(r.perHead[h], msg('mass recall')).toBeCloseTo(exp, 10);
    }
  });
});

describe('attention progress (onProgress)', () => {
  // A causal random mask over the blocks, so the sparse pass skips some keys.
  function randomMask(H: number, Nb: number, B: number): BlockMask {
    const cols: number[][] = [];
    const rowsOf: number[][] = [];
    for (let h = 0; h < H; h++) {
      cols.push([0, ...Array.from({ length: Nb }, (_, J) => J).filter((J) => J > 0 && rand() < 0.3)]);
      rowsOf.push([0]);
    }
    return { heads: H, numBlocks: Nb, blockSize: B, vs: vsListsFromArrays(cols, rowsOf) };
  }

  for (const dtype of ['f32', 'bf16'] as const) {
    it(`gives the same bits with progress as without, dense and sparse, full and chunked prefill (${dtype})`, async () => {
      const [n, H, Hkv, d, B] = [300, 4, 2, 32, 32];
      const q = randomTensor([n, H, d], dtype);
      const k = randomTensor([n, Hkv, d], dtype);
      const v = randomTensor([n, Hkv, d], dtype);
      const seen: { op: string; done: number; total: number }[] = [];
      const plain = createReferenceBackend();
      const sliced = createReferenceBackend({ onProgress: (p) => seen.push({ ...p }), progressEveryMs: 0 });
      const mask = randomMask(H, Math.ceil(n / B), B);
      const run = async (be: Backend, qh: HostTensor) => {
        const [qd, kd, vd] = [be.upload(qh), be.upload(k), be.upload(v)];
        const dense = await be.denseAttention(qd, kd, vd, { returnLse: true });
        const sparse = await be.sparseAttention(qd, kd, vd, mask, { returnLse: true });
        return Promise.all([dense.output, dense.lse!, sparse.output, sparse.lse!].map((t) => be.download(t)));
      };
      const tail: HostTensor = { dtype, shape: [100, H, d], data: q.data.slice(200 * H * d) };
      for (const qh of [q, tail]) {
        const a = await run(plain, qh);
        const b = await run(sliced, qh);
        for (let i = 0; i < a.length; i++) expect(Array.from(b[i].data), msg(`output ${i}`)).toEqual(Array.from(a[i].data));
      }
      // every call reports 0 first and total last, never going back
      const calls: (typeof seen)[] = [];
      for (const e of seen) {
        if (e.done === 0) calls.push([]);
        calls.at(-1)!.push(e);
      }
      expect(calls.map((c) => c[0].op)).toEqual(['dense', 'sparse', 'dense', 'sparse']);
      for (const c of calls) {
        expect(c.length).toBeGreaterThan(3);
        for (let i = 1; i < c.length; i++) expect(c[i].done).toBeGreaterThanOrEqual(c[i - 1].done);
        expect(c.at(-1)!.done).toBe(c[0].total);
      }
      // dense over all 300 rows scans at least the causal triangle; the mask scans less
      expect(calls[0][0].total).toBeGreaterThanOrEqual((H * n * (n + 1)) / 2);
      expect(calls[1][0].total).toBeLessThan(calls[0][0].total);
    });
  }

  it('yields to the event loop inside a pass: a timer set before the call fires before it ends', async () => {
    let fired = false;
    let firedMidPass = false;
    const be = createReferenceBackend({
      onProgress: (p) => {
        if (fired && p.done > 0 && p.done < p.total) firedMidPass = true;
      },
      progressEveryMs: 0,
    });
    const [n, H, d] = [256, 2, 32];
    const t = (shape: number[]) => be.upload(randomTensor(shape));
    setImmediate(() => {
      fired = true;
    });
    await be.denseAttention(t([n, H, d]), t([n, 1, d]), t([n, 1, d]));
    expect(firedMidPass).toBe(true);
  });

  it('refuses a bad onProgress or progressEveryMs with INVALID_ARGUMENT', () => {
    expect(() => createReferenceBackend({ onProgress: 1 as never })).toThrow(/onProgress must be a function/);
    expect(() => createReferenceBackend({ progressEveryMs: -1 })).toThrow(/progressEveryMs must be a finite number >= 0/);
    expect(() => createReferenceBackend({ progressEveryMs: Number.NaN })).toThrow(/progressEveryMs/);
  });
});
