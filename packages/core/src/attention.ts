/**
 * Attention problem shapes and the validation every public entry point runs.
 *
 * Shape legend: q [m, H, d], k and v [n, Hkv, d], m <= n. Query row i sits at absolute
 * position n - m + i (m == n is ordinary prefill; m < n is chunked prefill over a prefix
 * KV). Query head h reads kv head floor(h / (H / Hkv)). Causal: position i sees j <= i.
 * Blocks: B tokens, Nb = ceil(n / B) over absolute positions; the last block may be partial.
 */
import type { DType } from './dtype.js';
import { DTypeError, InvalidArgumentError, ShapeError, UnsupportedError, LimitError } from './errors.js';

export interface AttentionShape {
  /** query rows (m) */
  readonly queries: number;
  /** key/value rows (n) */
  readonly keys: number;
  readonly heads: number;
  readonly kvHeads: number;
  readonly headDim: number;
  readonly dtype: DType;
}

interface Shaped {
  readonly dtype: DType;
  readonly shape: readonly number[];
}

/** Check q, k, v agree and describe one layer's attention problem. */
function assertRank3(name: string, t: Shaped): void {
  if (!t || !Array.isArray(t.shape) || t.shape.length !== 3) {
    throw new ShapeError(`${name} must have rank 3 ([rows, heads, headDim]); got shape [${t?.shape}]`);
  }
}

export function attentionShape(q: Shaped, k: Shaped, v: Shaped): AttentionShape {
  // (three calls, not a loop over [name, tensor] pairs: this runs before every prefill's first
  // launch, where allocations cost on a cold host: measured on the H200 from an idle device)
  assertRank3('q', q);
  assertRank3('k', k);
  assertRank3('v', v);
  if (q.dtype !== k.dtype || q.dtype !== v.dtype) {
    throw new DTypeError(`q, k and v must share a dtype; got ${q.dtype}, ${k.dtype}, ${v.dtype}`);
  }
  const [m, H, d] = q.shape;
  const [n, Hkv, dk] = k.shape;
  if (v.shape[0] !== n || v.shape[1] !== Hkv || v.shape[2] !== dk) {
    throw new ShapeError(`v must have k's shape [${k.shape}]; got [${v.shape}]`);
  }
  if (d !== dk) throw new ShapeError(`q's head dim ${d} differs from k's ${dk}`);
  if (n < 1 || m < 1 || H < 1 || Hkv < 1 || d < 1) {
    throw new ShapeError(`empty attention problem: q [${q.shape}], k [${k.shape}]`);
  }
  if (H % Hkv !== 0) {
    throw new ShapeError(`query heads (${H}) must be a multiple of kv heads (${Hkv}) for GQA`);
  }
  if (m > n) throw new ShapeError(`q has ${m} rows but k only ${n}; queries are the last m of n positions`);
  return { queries: m, keys: n, heads: H, kvHeads: Hkv, headDim: d, dtype: q.dtype };
}

export function numBlocks(n: number, blockSize: number): number {
  return Math.ceil(n / blockSize);
}

export function assertBlockSize(B: unknown, allowed: readonly number[] = [64, 128]): asserts B is number {
  if (typeof B !== 'number' || !allowed.includes(B)) {
    throw new InvalidArgumentError(`blockSize must be one of ${allowed.join(', ')}; got ${String(B)}`);
  }
}

/** What a backend can do; checked before any work starts. */
export interface BackendCapabilities {
  readonly dtypes: readonly DType[];
  readonly headDims: readonly number[];
  readonly blockSizes: readonly number[];
  /** largest n (keys) the backend accepts for one layer */
  readonly maxSequence: number;
  /** accepts q with fewer rows than k (chunked prefill) */
  readonly chunkedPrefill: boolean;
  /** can return the per-row log-sum-exp */
  readonly logSumExp: boolean;
}

export function assertSupported(caps: BackendCapabilities, s: AttentionShape, backend: string): void {
  if (!caps.dtypes.includes(s.dtype)) {
    throw new UnsupportedError(`${backend} backend does not take ${s.dtype}; use one of ${caps.dtypes.join(', ')}`, {
      limit: 'dtype',
    });
  }
  if (!caps.headDims.includes(s.headDim)) {
    throw new UnsupportedError(
      `${backend} backend has no kernel for head dim ${s.headDim}; supported: ${caps.headDims.join(', ')}`,
      { limit: 'headDim' },
    );
  }
  if (s.keys > caps.maxSequence) {
    throw new LimitError(`n = ${s.keys} exceeds the ${backend} backend's limit of ${caps.maxSequence} tokens`, {
      limit: 'maxSequence',
      max: caps.maxSequence,
    });
  }
  if (s.queries !== s.keys && !caps.chunkedPrefill) {
    throw new UnsupportedError(`${backend} backend needs q and k of equal length (no chunked prefill yet)`, {
      limit: 'chunkedPrefill',
    });
  }
}

export function defaultScale(headDim: number): number {
  return 1 / Math.sqrt(headDim);
}
