/**
 * Device tensors for the run: inputs generated on the GPU, f16 read-back, the float64 check
 * of sampled rows and the fixed block mask of the sparse check.
 */
import { type BlockMask, type DeviceTensor, expandToRows, f16BitsToF32 } from '@crisp/core';
import type { WebGpuBackend } from '@crisp/kernels-webgpu';
import { D, H, HKV } from './args.js';

function synthWgsl(): string {
  return /* wgsl */ `
struct Params { rows: u32, heads: u32, kind: u32, seed: u32, words: u32, rowWidth: u32, p0: u32, p1: u32 }
@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
fn hash(x: u32) -> u32 {
  var h = x * 0x9E3779B1u;
  h ^= h >> 16u; h *= 0x85EBCA6Bu; h ^= h >> 13u; h *= 0xC2B2AE35u; h ^= h >> 16u;
  return h;
}
fn unit(x: u32) -> f32 { return f32(hash(x) >> 8u) / 8388608.0 - 1.0; }
fn value(e: u32) -> f32 {
  let c = e % ${D}u;
  let h = (e / ${D}u) % P.heads;
  let r = e / (${D}u * P.heads);
  let g = select(h, h / (P.heads / ${HKV}u), P.kind == 0u);
  var x = unit(e ^ (P.seed * 0x632BE5ABu)) * 0.6;
  // a per-kv-head direction shared by q and the sink / vertical keys
  let dirv = select(-1.0, 1.0, (hash(g * 977u + c + 12345u) & 1u) == 1u);
  // positional part: cos/sin pairs over 32 frequencies give a local window
  if (c < 64u) {
    let f = c % 32u;
    let w = 6.2831853 / (8.0 * pow(2.0, f32(f) / 3.0));
    let ph = f32(r) * w;
    x += 0.9 * select(sin(ph), cos(ph), c < 32u);
  }
  if (P.kind == 0u) { x += 0.25 * dirv; }
  if (P.kind == 1u) {
    if (r < 4u) { x += 3.0 * dirv; }
    else if ((hash(r * 7919u + g) % 1500u) == 0u) { x += 1.6 * dirv; }
  }
  return x;
}
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let w = gid.x + gid.y * P.rowWidth;
  if (w >= P.words) { return; }
  out[w] = pack2x16float(vec2<f32>(value(w * 2u), value(w * 2u + 1u)));
}
`;
}

export interface Gpu {
  b: WebGpuBackend;
}

export async function synth(g: Gpu, rows: number, heads: number, kind: number, seed: number): Promise<DeviceTensor> {
  const t = g.b.allocate('f16', [rows, heads, D]);
  const ctx = g.b.gpu;
  const pipe = await ctx.pipeline({ name: 'synth', cacheKey: 'synth', wgsl: synthWgsl(), entryPoint: 'main' });
  const words = (rows * heads * D) / 2;
  const grid = ctx.grid(words);
  const u = ctx.uniform([rows, heads, kind, seed, words, grid.rowWidth, 0, 0]);
  const enc = ctx.device.createCommandEncoder();
  ctx.dispatch(enc, pipe, [u, (t as unknown as { buffer: GPUBuffer }).buffer], grid.groups);
  ctx.submit(enc, [u]);
  return t;
}

/** f16 bit pattern -> value, for reading device tensors without a per-element call. */
const F16 = (() => {
  const t = new Float32Array(65536);
  for (let i = 0; i < 65536; i++) t[i] = f16BitsToF32(i);
  return t;
})();

/** Raw f16 bits of whole rows [r0, r0 + count) of a [rows, heads, d] f16 tensor. */
export async function readRaw(g: Gpu, t: DeviceTensor, r0: number, count: number): Promise<Uint16Array> {
  const per = t.shape[1] * t.shape[2];
  return new Uint16Array(await g.b.gpu.read((t as unknown as { buffer: GPUBuffer }).buffer, r0 * per * 2, count * per * 2));
}

/** Rows [r0, r0 + count) of a [rows, heads, d] f16 tensor as f32. */
export async function readRows(g: Gpu, t: DeviceTensor, r0: number, count: number): Promise<Float32Array> {
  const u16 = await readRaw(g, t, r0, count);
  const out = new Float32Array(u16.length);
  for (let i = 0; i < u16.length; i++) out[i] = F16[u16[i]];
  return out;
}

/**
 * float64 attention for sampled (row, head) pairs, dense or over a mask; the max error of
 * the device output on those rows, relative to the row's max |value| (f16 output).
 */
export async function checkRows(
  g: Gpu,
  q: DeviceTensor,
  k: DeviceTensor,
  v: DeviceTensor,
  out: DeviceTensor,
  mask: BlockMask | undefined,
  samples: number,
): Promise<{ maxError: number; rows: number }> {
  const n = k.shape[0];
  const kf = await readRaw(g, k, 0, n);
  const vf = await readRaw(g, v, 0, n);
  const rows = mask ? expandToRows(mask) : undefined;
  const B = mask?.blockSize ?? 128;
  const Nb = Math.ceil(n / B);
  let worst = 0;
  const scale = 1 / Math.sqrt(D);
  for (let s = 0; s < samples; s++) {
    const i = s === 0 ? n - 1 : Math.floor(((s * 2654435761) % 4294967296) / 4294967296 * n);
    const h = (s * 7) % H;
    const gk = Math.floor(h / (H / HKV));
    const qr = await readRows(g, q, i, 1);
    const orow = await readRows(g, out, i, 1);
    const keys: number[] = [];
    if (rows) {
      const r = h * Nb + Math.floor(i / B);
      for (let p = rows.rowPtr[r]; p < rows.rowPtr[r + 1]; p++) {
        const J = rows.cols[p];
        for (let j = J * B; j < Math.min(J * B + B, i + 1); j++) keys.push(j);
      }
    } else for (let j = 0; j <= i; j++) keys.push(j);
    const logits = new Float64Array(keys.length);
    let mx = Number.NEGATIVE_INFINITY;
    keys.forEach((j, t) => {
      let dot = 0;
      for (let c = 0; c < D; c++) dot += qr[h * D + c] * F16[kf[(j * HKV + gk) * D + c]];
      logits[t] = dot * scale;
      mx = Math.max(mx, logits[t]);
    });
    let z = 0;
    const acc = new Float64Array(D);
    keys.forEach((j, t) => {
      const p = Math.exp(logits[t] - mx);
      z += p;
      for (let c = 0; c < D; c++) acc[c] += p * F16[vf[(j * HKV + gk) * D + c]];
    });
    let amax = 0;
    let err = 0;
    for (let c = 0; c < D; c++) {
      const e = acc[c] / z;
      amax = Math.max(amax, Math.abs(e));
      err = Math.max(err, Math.abs(e - orow[h * D + c]));
    }
    worst = Math.max(worst, err / Math.max(amax, 1e-3));
  }
  return { maxError: worst, rows: samples };
}

/** Block rows for the sparse check: block 0, the diagonal and a seeded half of the rest. */
export function checkMask(n: number): BlockMask {
  const B = 128;
  const Nb = Math.ceil(n / B);
  const rowPtr = new Int32Array(H * Nb + 1);
  const cols: number[] = [];
  for (let h = 0; h < H; h++) {
    for (let I = 0; I < Nb; I++) {
      for (let J = 0; J <= I; J++) {
        const keep = J === 0 || J === I || (((h * 7919 + I * 104729 + J * 1299709) >>> 0) % 5) < 2;
        if (keep) cols.push(J);
      }
      rowPtr[h * Nb + I + 1] = cols.length;
    }
  }
  return { heads: H, numBlocks: Nb, blockSize: B, rows: { rowPtr, cols: Int32Array.from(cols) } };
}
