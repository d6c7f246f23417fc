/**
 * The soak's ground truth: problems generated on the host (seeded, their exact dtype values
 * kept as f32 for the reference), and exact attention in float64 for a few query rows, dense
 * or under a block mask (causal inside the diagonal block), compared with what a backend
 * wrote. Shape legend: q [m, H, d] (the last m of n positions), k and v [n, Hkv, d].
 */
import { type BlockMask, type DType, type DeviceTensor, type HostTensor, hostTensor, toFloat32 } from '@crisp/core';

/** One problem of the soak's pool: its host values (exact, as f32) and its device tensors. */
export interface Problem {
  readonly name: string;
  readonly dtype: 'bf16' | 'f16';
  readonly n: number;
  readonly H: number;
  readonly Hkv: number;
  readonly d: number;
  /** the dtype's bit patterns of q, k, v (for rewriting a copy with a NaN in it) */
  readonly bits: { readonly q: Uint16Array; readonly k: Uint16Array; readonly v: Uint16Array };
  /** the exact values of q, k, v */
  readonly host: { readonly q: Float32Array; readonly k: Float32Array; readonly v: Float32Array };
  readonly q: DeviceTensor;
  readonly k: DeviceTensor;
  readonly v: DeviceTensor;
}

export interface ProblemSpec {
  readonly n: number;
  readonly H: number;
  readonly Hkv: number;
  readonly d: number;
  readonly dtype: 'bf16' | 'f16';
}

/** Seeded host values in [-amp, amp] as a tensor of `dtype`. */
export function randomHost(r: () => number, dtype: DType, shape: readonly number[], amp: number): HostTensor {
  const len = shape.reduce((a, b) => a * b, 1);
  const x = new Float32Array(len);
  for (let i = 0; i < len; i++) x[i] = (r() * 2 - 1) * amp;
  return hostTensor(dtype, shape, x);
}

/** The key blocks query block I of head h attends to under `mask` (sorted, each once, J <= I). */
export function maskRowBlocks(mask: BlockMask, h: number, I: number): number[] {
  const set = new Set<number>();
  const vs = mask.vs;
  if (vs) {
    for (let p = vs.verticalPtr[h]; p < vs.verticalPtr[h + 1]; p++) if (vs.vertical[p] <= I) set.add(vs.vertical[p]);
    for (let p = vs.slashPtr[h]; p < vs.slashPtr[h + 1]; p++) if (vs.slash[p] <= I) set.add(I - vs.slash[p]);
  }
  if (mask.rows) {
    const r = h * mask.numBlocks + I;
    for (let p = mask.rows.rowPtr[r]; p < mask.rows.rowPtr[r + 1]; p++) set.add(mask.rows.cols[p]);
  }
  return [...set].sort((a, b) => a - b);
}

/**
 * Exact attention (float64) of query row `row` (of m), head `h`: the keys of the mask's
 * blocks for that row's query block (every key at or before the position when dense), with
 * softmax scale `scale`. Returns d values.
 */
export function referenceRow(
  host: { readonly q: Float32Array; readonly k: Float32Array; readonly v: Float32Array },
  dims: { readonly m: number; readonly n: number; readonly H: number; readonly Hkv: number; readonly d: number },
  row: number,
  h: number,
  scale: number,
  mask?: BlockMask,
): Float64Array {
  const { m, n, H, Hkv, d } = dims;
  const pos = n - m + row;
  const g = Math.floor(h / (H / Hkv));
  const keys: number[] = [];
  if (mask) {
    const B = mask.blockSize;
    for (const J of maskRowBlocks(mask, h, Math.floor(pos / B))) {
      for (let j = J * B; j < Math.min(n, (J + 1) * B); j++) if (j <= pos) keys.push(j);
    }
  } else {
    for (let j = 0; j <= pos; j++) keys.push(j);
  }
  const qo = (row * H + h) * d;
  const s = new Float64Array(keys.length);
  let max = Number.NEGATIVE_INFINITY;
  for (let t = 0; t < keys.length; t++) {
    const ko = (keys[t] * Hkv + g) * d;
    let dot = 0;
    for (let c = 0; c < d; c++) dot += host.q[qo + c] * host.k[ko + c];
    s[t] = dot * scale;
    if (s[t] > max) max = s[t];
  }
  const out = new Float64Array(d);
  let sum = 0;
  for (let t = 0; t < keys.length; t++) {
    const p = Math.exp(s[t] - max);
    sum += p;
    const vo = (keys[t] * Hkv + g) * d;
    for (let c = 0; c < d; c++) out[c] += p * host.v[vo + c];
  }
  // (an empty row: zeros, as the kernels write)
  if (sum > 0) for (let c = 0; c < d; c++) out[c] /= sum;
  return out;
}

/** ‖got − want‖ / ‖want‖ over one row (0 when both are zero). */
export function rowError(got: Float32Array, want: Float64Array): number {
  let e = 0;
  let w = 0;
  for (let c = 0; c < want.length; c++) {
    e += (got[c] - want[c]) ** 2;
    w += want[c] ** 2;
  }
  if (Number.isNaN(e)) return Number.NaN;
  return w > 0 ? Math.sqrt(e / w) : e === 0 ? 0 : Number.POSITIVE_INFINITY;
}

/** Largest row error accepted: the output is rounded to the dtype (bf16 8 bits of mantissa, f16 11), and P·V takes P in it. */
export const ROW_TOLERANCE: Readonly<Record<'bf16' | 'f16', number>> = { bf16: 3e-2, f16: 1.2e-2 };

/** The listed rows of an output [m, H, d] on the host, as f32: through `readRows` when the backend has it, else the whole tensor. */
export async function outputRows(
  backend: { download(t: DeviceTensor): Promise<HostTensor>; readRows?: (t: DeviceTensor, rows: Int32Array) => HostTensor },
  out: DeviceTensor,
  rows: readonly number[],
): Promise<Float32Array[]> {
  const [, H, d] = out.shape;
  const stride = H * d;
  if (backend.readRows) {
    const got = toFloat32(backend.readRows(out, Int32Array.from(rows)));
    return rows.map((_, i) => got.subarray(i * stride, (i + 1) * stride));
  }
  const all = toFloat32(await backend.download(out));
  return rows.map((r) => all.subarray(r * stride, (r + 1) * stride));
}
