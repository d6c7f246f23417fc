/**
 * Merging partial attention results by their log-sum-exp: attention over disjoint key sets
 * (a cached prefix and the rest, the chunks of a split key range, ...) combined into the
 * attention over their union, on the host.
 *
 * Shape legend: output [m, H, d], lse [H, m] (f32, natural log), one pair per part.
 */
import { type DType, assertDType, decode, encode } from './dtype.js';
import { DTypeError, InvalidArgumentError, NonFiniteError, ShapeError, checkOptions, describeValue, errorWithin } from './errors.js';
import { type HostTensor, wrapHost } from './tensor.js';

/** One partial attention result: its output and the natural-log LSE of each row's logits. */
export interface AttentionPart {
  /** [m, H, d], any dtype */
  readonly output: HostTensor;
  /** [H, m] f32: ln Σ_j exp(s_j) over the part's keys; -Infinity for a row with none (its output is ignored) */
  readonly lse: HostTensor;
}

export interface MergedAttention {
  /** [m, H, d] in `opts.dtype` (default the first part's dtype); rows with no keys in any part are 0 */
  readonly output: HostTensor;
  /** [H, m] f32: logsumexp of the parts' LSE; -Infinity where no part had keys */
  readonly lse: HostTensor;
}

/**
 * Merge two or more partial attention results over disjoint key sets into the attention over
 * all of them: per row and head, with L = logsumexp_i(lse_i),
 *
 *     o = Σ_i exp(lse_i − L) · o_i,      lse = L.
 *
 * The parts are what `sparseAttention` / `denseAttention` return with `returnLse` (downloaded),
 * for the same query rows over different keys. A row whose part has no keys (lse -Infinity)
 * takes nothing from that part; a row with no keys in any part gets output 0 and lse
 * -Infinity. Sums run in float64, rounded once to the output dtype. Every part must have the
 * same [m, H, d]; LSE must be f32 [H, m]; NaN or +Infinity in an LSE, or a non-finite value in
 * an output row that is used, is a NON_FINITE error.
 */
export function mergeAttentionByLse(parts: readonly AttentionPart[], opts: { readonly dtype?: DType } = {}): MergedAttention {
  if (!Array.isArray(parts) || parts.length < 1) {
    throw new InvalidArgumentError(`mergeAttentionByLse needs an array of one or more { output, lse } parts; got ${describeValue(parts)}`);
  }
  const first = parts[0]?.output;
  if (!first || !Array.isArray(first.shape) || first.shape.length !== 3) {
    throw new ShapeError(`mergeAttentionByLse: part 0's output must be a host tensor [m, H, d]; got ${describeValue(first?.shape)}`);
  }
  checkOptions(opts, 'mergeAttentionByLse', ['dtype']);
  const [m, H, d] = first.shape;
  const dtype = opts?.dtype ?? first.dtype;
  assertDType(dtype);
  const outs: Float32Array[] = [];
  const lses: Float32Array[] = [];
  parts.forEach((p, i) => {
    if (!p || typeof p !== 'object' || !p.output || !p.lse) {
      throw new InvalidArgumentError(`mergeAttentionByLse: part ${i} must be { output, lse } host tensors; got ${describeValue(p)}`);
    }
    const o = p.output;
    if (!Array.isArray(o.shape) || o.shape.join() !== [m, H, d].join()) {
      throw new ShapeError(`mergeAttentionByLse: part ${i}'s output is [${o.shape}], part 0's [${m}, ${H}, ${d}]; every part covers the same query rows`);
    }
    if (p.lse.dtype !== 'f32') throw new DTypeError(`mergeAttentionByLse: part ${i}'s lse must be f32 (as returnLse gives it); got ${p.lse.dtype}`);
    if (!Array.isArray(p.lse.shape) || p.lse.shape.join() !== [H, m].join()) {
      throw new ShapeError(`mergeAttentionByLse: part ${i}'s lse is [${p.lse.shape}], expected [${H}, ${m}] (heads, then rows)`);
    }
    // each tensor's data of its dtype's array type and of its shape's length
    for (const [t, name] of [
      [o, 'output'],
      [p.lse, 'lse'],
    ] as const) {
      try {
        wrapHost(t.dtype, t.shape, t.data);
      } catch (e) {
        throw errorWithin(e, `mergeAttentionByLse: part ${i}'s ${name}`, { part: i });
      }
    }
    outs.push(decode(o.dtype, o.data));
    lses.push(p.lse.data as Float32Array);
  });
  const out = new Float64Array(m * H * d);
  const lse = new Float32Array(H * m);
  const w = new Float64Array(parts.length);
  for (let h = 0; h < H; h++) {
    for (let i = 0; i < m; i++) {
      let mx = Number.NEGATIVE_INFINITY;
      for (let s = 0; s < parts.length; s++) {
        const l = lses[s][h * m + i];
        if (Number.isNaN(l) || l === Number.POSITIVE_INFINITY) {
          throw new NonFiniteError(`mergeAttentionByLse: part ${s}'s lse is ${l} at head ${h}, row ${i}`, { part: s, head: h, row: i });
        }
        if (l > mx) mx = l;
      }
      if (mx === Number.NEGATIVE_INFINITY) {
        lse[h * m + i] = mx; // no part has keys for this row: output stays 0
        continue;
      }
      let z = 0;
      for (let s = 0; s < parts.length; s++) {
        w[s] = Math.exp(lses[s][h * m + i] - mx);
        z += w[s];
      }
      lse[h * m + i] = mx + Math.log(z);
      const o0 = (i * H + h) * d;
      for (let s = 0; s < parts.length; s++) {
        if (w[s] === 0) continue;
        const ws = w[s] / z;
        const src = outs[s];
        for (let c = 0; c < d; c++) {
          const x = src[o0 + c];
          if (!Number.isFinite(x)) {
            throw new NonFiniteError(`mergeAttentionByLse: part ${s}'s output is ${x} at row ${i}, head ${h}, column ${c}`, { part: s, head: h, row: i });
          }
          out[o0 + c] += ws * x;
        }
      }
    }
  }
  return {
    output: { dtype, shape: [m, H, d], data: encode(dtype, out) },
    lse: { dtype: 'f32', shape: [H, m], data: lse },
  };
}
