/**
 * A fast structured layer for latency inputs on backends without a device fill: a
 * TypeScript port of the CUDA backend's `fill_llama` generator (packages/kernels-cuda/
 * kernels/bench.cu), so WebGPU and CUDA are timed on the same kind of layer at any n.
 * Values agree with the CUDA fill up to float rounding of sin/cos/pow (the device uses fast
 * float intrinsics); timing does not depend on the last bits.
 *
 * Per head: hash noise, a sink on the first 4 keys (dim 32), a rotary local window
 * (dims 0..31), vertical lines on keys whose hash hits 1 in `vEvery` (dim 33) and one slash
 * line at offset slash0 + 997 (h mod 5) (dims 34..47); heads with h mod 4 == 3 are diffuse.
 * Shape legend: which 0 = q [n, H, D], 1 = k [n, Hkv, D], 2 = v [n, Hkv, D]; D >= 48.
 */
import type { Backend, DeviceTensor, DType } from '@crisp/core';
import { encode } from '@crisp/core';
import { allocateQkv } from '@crisp/synth';

/** bench.cu's crisp_hash on the low 32 bits of idx (idx < 2^53). */
export function crispHash(idx: number, seed: number): number {
  const lo = idx % 4294967296;
  let x = (Math.imul(lo >>> 0, 2654435761 | 0) + (seed >>> 0)) >>> 0;
  x = Math.imul((x >>> 16) ^ x, 0x45d9f3b) >>> 0;
  x = Math.imul((x >>> 16) ^ x, 0x45d9f3b) >>> 0;
  return ((x >>> 16) ^ x) >>> 0;
}

function hashUniform(idx: number, seed: number, amp: number): number {
  return ((crispHash(idx, seed) >>> 8) * 5.9604644775390625e-8 - 0.5) * 2 * amp;
}

/** Rows [start, end) of one tensor, f32. */
export function llamaRows(which: 0 | 1 | 2, start: number, end: number, heads: number, D: number, H: number, seed: number, slash0 = 1000, vEvery = 4096): Float32Array {
  const out = new Float32Array((end - start) * heads * D);
  const s = (seed + which * 7919) >>> 0;
  const rot = new Float64Array(32);
  const rotW = Array.from({ length: 16 }, (_, f) => 10000 ** (-f / 16));
  const slashW = Array.from({ length: 7 }, (_, f) => 10000 ** (-f / 7));
  let o = 0;
  for (let pos = start; pos < end; pos++) {
    for (let f = 0; f < 16; f++) {
      const ang = rotW[f] * pos;
      rot[2 * f] = Math.cos(ang);
      rot[2 * f + 1] = Math.sin(ang);
    }
    const vertical = which === 1 && crispHash(pos, (seed ^ 0xabcd) >>> 0) % vEvery === 0;
    for (let hh = 0; hh < heads; hh++) {
      const base = (pos * heads + hh) * D;
      if (which === 2) {
        for (let d = 0; d < D; d++) out[o++] = hashUniform(base + d, s, 1);
        continue;
      }
      const hq = which === 0 ? hh : hh * (H / heads);
      const diffuse = which === 0 && hh % 4 === 3;
      const A = diffuse ? 1.2 : 2.65;
      const off = slash0 + 997 * (hq % 5);
      for (let d = 0; d < D; d++) {
        let val: number;
        if (d < 32) val = A * rot[d];
        else if (d === 32) val = which === 0 ? (diffuse ? 0 : 4) : pos < 4 ? 40 : 0;
        else if (d === 33) val = which === 0 ? (diffuse ? 0 : 4) : vertical ? 22 : 0;
        else if (d < 48) {
          const f = (d - 34) >> 1;
          const ang = slashW[f] * (which === 0 ? pos - off : pos);
          const amp = which === 0 && diffuse ? 0 : 3;
          val = amp * (d & 1 ? Math.sin(ang) : Math.cos(ang));
        } else val = hashUniform(base + d, s, 1);
        out[o++] = val;
      }
    }
  }
  return out;
}

/** Allocate q, k, v on the backend and stream the layer in row chunks. */
export async function uploadLlamaFill(
  b: Backend,
  n: number,
  H: number,
  Hkv: number,
  D: number,
  dtype: DType,
  seed: number,
  onProgress?: (rowsDone: number, n: number) => void,
): Promise<{ q: DeviceTensor; k: DeviceTensor; v: DeviceTensor }> {
  const made: DeviceTensor[] = [];
  try {
    const { q, k, v } = allocateQkv(b, { n, heads: H, kvHeads: Hkv, headDim: D, dtype }, made);
    const rows = Math.max(1, Math.floor((4 * 1024 * 1024) / (H * D)));
    for (let start = 0; start < n; start += rows) {
      const end = Math.min(n, start + rows);
      b.write(q, start * H * D, encode(dtype, llamaRows(0, start, end, H, D, H, seed)));
      b.write(k, start * Hkv * D, encode(dtype, llamaRows(1, start, end, Hkv, D, H, seed)));
      b.write(v, start * Hkv * D, encode(dtype, llamaRows(2, start, end, Hkv, D, H, seed)));
      onProgress?.(end, n);
      if (end < n) await new Promise<void>((resolve) => setImmediate(resolve));
    }
    return { q, k, v };
  } catch (e) {
    for (const t of made) t.dispose();
    throw e;
  }
}
