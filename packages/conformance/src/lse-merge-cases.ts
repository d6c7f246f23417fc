/**
 * LSE merge cases for chunked shapes: a chunk's attention over the cached prefix and over the
 * rest, each with its LSE, merged on the host (mergeAttentionByLse), against exact attention
 * over every key.
 *
 * Shape legend: q [m, H, d] (positions p .. n - 1, p = n - m), k and v [n, Hkv, d], B block
 * size, Nb = ceil(n / B).
 */
import { type DType, mergeAttentionByLse, numBlocks, vsListsFromArrays } from '@crisp/core';
import { attentionRows } from '@crisp/reference';
import {
  type ConformanceCase,
  type ShapeCase,
  checkAttention,
  checkRowsFor,
  makeCase,
  outcome,
  poisoned,
  shapeName,
  upload,
} from './cases.js';
import { maxMixedError } from './compare.js';
import { attentionInputs } from './random.js';

/**
 * Chunked attention merged by LSE (backends with returnLse): a chunk's attention over the
 * cached prefix's whole key blocks (vertical blocks J < floor(p / B), all before the chunk's
 * first row) and over the rest (block rows J in [floor(p / B), I], causal in the diagonal
 * block), each with its LSE, merged with mergeAttentionByLse, equals exact dense attention over
 * every key. Shapes whose prefix holds at least one whole block.
 */
export function lseMergeCase(dtype: DType, s: ShapeCase): ConformanceCase {
  const c = makeCase(`lseMerge/${shapeName(s)}/${dtype}`, dtype, s, s.blockSize, async (ctx, r) => {
    const x = attentionInputs(r, dtype, s);
    const be = ctx.backend;
    const B = s.blockSize;
    const H = s.heads;
    const Nb = numBlocks(s.n, B);
    const I0 = Math.floor((s.n - (s.m ?? s.n)) / B);
    const none: number[][] = Array.from({ length: H }, () => []);
    const prefix = vsListsFromArrays(Array.from({ length: H }, () => [...Array(I0).keys()]), none);
    const rowPtr = new Int32Array(H * Nb + 1);
    const cols: number[] = [];
    for (let h = 0; h < H; h++) {
      for (let I = 0; I < Nb; I++) {
        for (let J = I0; J <= I; J++) cols.push(J);
        rowPtr[h * Nb + I + 1] = cols.length;
      }
    }
    const d = upload(be, x);
    const parts = [];
    for (const mask of [
      { heads: H, numBlocks: Nb, blockSize: B, vs: prefix },
      { heads: H, numBlocks: Nb, blockSize: B, rows: { rowPtr, cols: Int32Array.from(cols) } },
    ]) {
      const out = poisoned(be, dtype, x.q.shape);
      const res = await be.sparseAttention(d.q, d.k, d.v, mask, { out, returnLse: true });
      if (!res.lse) return outcome(Number.POSITIVE_INFINITY, ctx.tolerance.output, ['returnLse was asked for but no lse came back']);
      parts.push({ output: await be.download(res.output), lse: await be.download(res.lse) });
    }
    const merged = mergeAttentionByLse(parts);
    const att = await checkAttention(ctx, s, x, merged.output, undefined, undefined, false);
    // the merged LSE against the dense one, on the rows checked
    const rows = checkRowsFor(ctx, s);
    const exact = attentionRows(x.q, x.k, x.v, rows);
    const m = s.m ?? s.n;
    const got = new Float64Array(H * rows.length);
    for (let h = 0; h < H; h++) for (const [t, i] of rows.entries()) got[h * rows.length + t] = (merged.lse.data as Float32Array)[h * m + i];
    const e = maxMixedError(got, exact.lse);
    const lines = att.passed ? [] : att.detail.split('\n');
    if (!(e.error <= ctx.tolerance.lse)) lines.push(`merged lse error ${e.error.toExponential(3)} > ${ctx.tolerance.lse}`);
    return outcome(att.maxError, ctx.tolerance.output, lines, `prefix of ${I0} blocks; merged lse error ${e.error.toExponential(2)}`);
  });
  return { ...c, needs: { ...c.needs, lse: true } };
}

/** The LSE merge case of every primitive shape whose prefix holds a whole block, per dtype. */
export function buildLseMergeCases(sizes: readonly ShapeCase[], dtypes: readonly DType[]): ConformanceCase[] {
  const out: ConformanceCase[] = [];
  for (const dtype of dtypes) {
    for (const s of sizes) {
      if ((s.use ?? 'primitives') !== 'pipeline' && Math.floor((s.n - (s.m ?? s.n)) / s.blockSize) >= 1) out.push(lseMergeCase(dtype, s));
    }
  }
  return out;
}
