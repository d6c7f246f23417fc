/**
 * The checks of a run against exact attention: block masses of sampled query rows (float64
 * over f32 inputs) for mass recall, and the relative output error against dense.
 *
 * Shape legend: q [n, H, d], k and v [n, Hkv, d], B block size, Nb = ceil(n / B).
 */
import { type BlockRows, bf16BitsToF32, f16BitsToF32, type HostTensor } from '@crisp/core';
import type { CliIo } from './cli-io.js';
import type { Inputs } from './inputs.js';
import { progressBar } from './progress.js';

/** Evenly spaced rows, always including the last; at most `count`. */
export function sampleRowsOf(n: number, count: number): number[] {
  if (count >= n) return Array.from({ length: n }, (_, i) => i);
  const rows = new Set<number>();
  for (let t = 0; t < count; t++) rows.add(Math.round(((t + 1) * (n - 1)) / count));
  return [...rows].sort((a, b) => a - b);
}

/** Sizes the exact rows need. */
export interface CheckDims {
  readonly n: number;
  readonly H: number;
  readonly Hkv: number;
  readonly d: number;
  readonly B: number;
}

/**
 * Exact attention probabilities of query row i (q: its [H * d] values, k: [n, Hkv, d] f32),
 * in float64, reduced to block masses [H][Nb]. `logits` is scratch of n values.
 */
export function rowBlockMasses(q: Float32Array, k: Float32Array, i: number, dims: CheckDims, logits: Float64Array): Float64Array {
  const { n, H, Hkv, d, B } = dims;
  const Nb = Math.ceil(n / B);
  const scale = 1 / Math.sqrt(d);
  const group = H / Hkv;
  const masses = new Float64Array(H * Nb);
  for (let h = 0; h < H; h++) {
    const g = Math.floor(h / group);
    const qo = h * d;
    let max = Number.NEGATIVE_INFINITY;
    for (let j = 0; j <= i; j++) {
      const ko = (j * Hkv + g) * d;
      let s = 0;
      for (let c = 0; c < d; c++) s += q[qo + c] * k[ko + c];
      s *= scale;
      logits[j] = s;
      if (s > max) max = s;
    }
    let z = 0;
    for (let j = 0; j <= i; j++) {
      const e = Math.exp(logits[j] - max);
      z += e;
      masses[h * Nb + Math.floor(j / B)] += e;
    }
    for (let J = 0; J < Nb; J++) masses[h * Nb + J] /= z;
  }
  return masses;
}

/**
 * Block masses [rows][H][Nb] of the sampled rows, on this thread. Shared by every policy's
 * mass recall.
 */
export async function sampledBlockMasses(inp: Inputs, k: Float32Array, rows: readonly number[], B: number, io: CliIo): Promise<Float64Array[]> {
  const dims: CheckDims = { n: inp.n, H: inp.H, Hkv: inp.Hkv, d: inp.d, B };
  const logits = new Float64Array(inp.n);
  const out: Float64Array[] = [];
  const bar = progressBar(io.stderr, 'mass recall (exact rows)', rows.length);
  try {
    for (let r = 0; r < rows.length; r++) {
      out.push(rowBlockMasses(await inp.qRow(rows[r]), k, rows[r], dims, logits));
      bar.update(r + 1);
      if (r % 4 === 3) await new Promise<void>((res) => setImmediate(res));
    }
  } finally {
    bar.stop();
  }
  return out;
}

export function massRecallOf(rows: BlockRows | undefined, masses: Float64Array[], sample: number[], H: number, Nb: number, B: number): Float64Array {
  const per = new Float64Array(H);
  if (!rows) return per.fill(1);
  for (let r = 0; r < sample.length; r++) {
    const I = Math.floor(sample[r] / B);
    for (let h = 0; h < H; h++) {
      const row = h * Nb + I;
      let s = 0;
      for (let p = rows.rowPtr[row]; p < rows.rowPtr[row + 1]; p++) s += masses[r][h * Nb + rows.cols[p]];
      per[h] += s;
    }
  }
  for (let h = 0; h < H; h++) per[h] /= sample.length;
  return per;
}

/** Every 16-bit pattern of a dtype decoded, so a decode is one load (built once per dtype). */
const TABLES = new Map<string, Float32Array>();
function decodeTable(dtype: 'bf16' | 'f16'): Float32Array {
  let t = TABLES.get(dtype);
  if (!t) {
    const conv = dtype === 'bf16' ? bf16BitsToF32 : f16BitsToF32;
    t = new Float32Array(65536);
    for (let i = 0; i < 65536; i++) t[i] = conv(i);
    TABLES.set(dtype, t);
  }
  return t;
}

/**
 * ‖a − b‖ / ‖b‖ per head over all rows, decoding as it goes (no second full f32 copy): 16-bit
 * values through a table, rows and heads as nested loops (n·H·d is 268M values at 64k).
 */
export function relativeErrorPerHead(a: HostTensor, b: HostTensor, H: number, d: number): { perHead: Float64Array; overall: number } {
  const diff = new Float64Array(H);
  const ref = new Float64Array(H);
  const rows = a.data.length / (H * d);
  const table = a.dtype === 'f32' ? undefined : decodeTable(a.dtype);
  const ad = a.data;
  const bd = b.data;
  for (let r = 0, f = 0; r < rows; r++) {
    for (let h = 0; h < H; h++) {
      let dh = 0;
      let rh = 0;
      for (let c = 0; c < d; c++, f++) {
        const x = table ? table[ad[f]] : ad[f];
        const y = table ? table[bd[f]] : bd[f];
        dh += (x - y) * (x - y);
        rh += y * y;
      }
      diff[h] += dh;
      ref[h] += rh;
    }
  }
  let sx = 0;
  let sy = 0;
  const perHead = new Float64Array(H);
  for (let h = 0; h < H; h++) {
    perHead[h] = ref[h] > 0 ? Math.sqrt(diff[h] / ref[h]) : diff[h] === 0 ? 0 : Number.POSITIVE_INFINITY;
    sx += diff[h];
    sy += ref[h];
  }
  return { perHead, overall: sy > 0 ? Math.sqrt(sx / sy) : 0 };
}
