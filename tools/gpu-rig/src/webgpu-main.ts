/**
 * A GPU-machine run of @crisp/kernels-webgpu (Dawn over Vulkan): build report, checks and
 * timings of the attention kernels in one process, written to --out after every item so a
 * killed run still leaves its data.
 *
 *   node webgpu-main.mjs --out $OUT [flags]
 *
 * Flags (all optional; LIST = comma-separated numbers):
 *   --out DIR|FILE.json  results (default ./webgpu-device-out). A directory gets
 *                        webgpu-device.json, webgpu-device.log, build-report.json and
 *                        wgsl/<kernel>.wgsl; a FILE.json path puts the log and the rest next to it.
 *   --no-wgsl            do not write wgsl/<kernel>.wgsl (the device tool returns few files)
 *   --budget S           seconds for the whole run (default 420); each phase stops early (and
 *                        says so in the JSON) when its projected time would overrun.
 *   --variants V,...     attention kernels (default fma,subgroup-matrix). A variant is
 *                        KERNEL[:rolled][+TOGGLES]: rolled (the FMA kernel's compactKernels
 *                        loops); TOGGLES fast (Dawn device toggles disable_robustness,
 *                        disable_workgroup_init, skip_validation) | norobust
 *                        (disable_robustness only). Each variant has its own Dawn device.
 *   --probes LIST        fma,lds,robust (default all; empty = none): FMA peak (fma()),
 *                        the workgroup-memory GEMM ceiling of the FMA kernel's tiling,
 *                        and whether the toggles reached the device (out-of-bounds read)
 *   --best-dense LIST    extra dense sizes for the best plain variant after the sweep
 *                        (default empty)
 *   --check N            float64 correctness size per variant, dense and sparse (default 4096)
 *   --dense LIST         dense sweep (default 8192,16384,32768,65536)
 *   --sparse LIST        crisp-preset sparse vs own dense, best variant (default 32768,65536,131072)
 *   --tfjs LIST          TF.js peer sizes (default 8192,16384; empty = skip)
 *   --smm-probe N        subgroup-matrix GEMM probe size (default 8192; 0 = skip)
 *   --conformance LIST   @crisp/conformance (f16, best variant) at these n, last, if 40 s remain
 *                        (default 4000; empty = skip)
 *   --heads H --kvheads HKV   (default 32, 8); d is 128
 *   --smoke              tiny sizes for an end-to-end check on a CPU adapter (SwiftShader)
 *
 * Order: (a) WGSL compilation messages (getCompilationInfo) and pipeline errors of every
 * variant, before anything is timed; (b) correctness of each variant at --check n against
 * float64 on sampled (row, head) pairs; (c) dense TFLOP/s per variant; (d) the sparse pipeline
 * with the best correct variant vs its own dense (density, plan ms, attention ms, ratio to
 * density × dense + plan); (e) the TF.js peer; then @crisp/conformance with the best variant.
 * "Best plain variant" (the --best-dense sizes, conformance, sparse, the TF.js ratio): the
 * fastest correct variant with Dawn's default toggles (what a browser runs), `rolled` excluded.
 * Conformance also runs with the experimental subgroup-matrix kernel when it was correct.
 *
 * Inputs for timing are generated on the GPU (a WGSL kernel: seeded noise plus sink keys,
 * a few vertical-line keys and a positional component that makes a local window), so
 * 128k-token tensors never pass through JavaScript.
 *
 * Shape legend: q [n, H, d], k and v [n, Hkv, d].
 */
import { appendFileSync, mkdirSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import {
  type BlockMask,
  type DeviceTensor,
  attentionShape,
  expandToRows,
  f16BitsToF32,
  sparsePrefill,
} from '@crisp/core';
import { LARGE_SIZES, runConformance } from '@crisp/conformance';
import { crisp } from '@crisp/presets';
import { ATTENTION_KERNELS, type AttentionKernel, type WebGpuBackend } from '@crisp/kernels-webgpu';
import { DEFAULT_DAWN_FLAGS, createNodeWebGpuBackend } from '@crisp/kernels-webgpu/node';
import { timeTfjsDenseAttention } from '@crisp/kernels-webgpu/tfjs-peer';

// ------------------------------------------------------------------- flags
const args = new Map<string, string>();
for (let i = 2; i < process.argv.length; i++) {
  const a = process.argv[i];
  if (!a.startsWith('--')) continue;
  const next = process.argv[i + 1];
  if (next === undefined || next.startsWith('--')) args.set(a.slice(2), '');
  else {
    args.set(a.slice(2), next);
    i++;
  }
}
const smoke = args.has('smoke');
const list = (k: string, dflt: string) =>
  (args.get(k) ?? dflt)
    .split(',')
    .filter(Boolean)
    .map(Number);
const outArg = args.get('out') || 'webgpu-device-out';
const outDir = outArg.endsWith('.json') ? dirname(outArg) : outArg;
const writeWgsl = !args.has('no-wgsl');
mkdirSync(writeWgsl ? join(outDir, 'wgsl') : outDir, { recursive: true });
const jsonPath = outArg.endsWith('.json') ? outArg : join(outDir, 'webgpu-device.json');
const logPath = join(outDir, 'webgpu-device.log');
const started = performance.now();
const budgetMs = Number(args.get('budget') || 420) * 1000;
const elapsed = () => performance.now() - started;
const left = (frac: number) => budgetMs * frac - elapsed();
const result: Record<string, unknown> = { started: new Date().toISOString(), args: Object.fromEntries(args), node: process.version };
const save = () => writeFileSync(jsonPath, JSON.stringify(result, null, 1));
writeFileSync(logPath, '');
const log = (...a: unknown[]) => {
  const line = `[${(elapsed() / 1000).toFixed(1)}s] ${a.map((x) => (typeof x === 'string' ? x : JSON.stringify(x))).join(' ')}`;
  console.log(line);
  appendFileSync(logPath, `${line}\n`);
};

const H = Number(args.get('heads') || (smoke ? 4 : 32));
const HKV = Number(args.get('kvheads') || (smoke ? 2 : 8));
const D = 128;
/** Dawn device toggles per variant suffix (passed through create()'s enable-dawn-features). */
const TOGGLES: Record<string, string[]> = {
  fast: ['disable_robustness', 'disable_workgroup_init', 'skip_validation'],
  norobust: ['disable_robustness'],
};
interface VariantSpec {
  label: string;
  kernel: AttentionKernel;
  form?: string;
  toggles?: string;
}
function parseVariant(label: string): VariantSpec {
  const [main, toggles] = label.split('+');
  const [kernel, form] = main.split(':') as [AttentionKernel, string | undefined];
  if (!ATTENTION_KERNELS.includes(kernel)) throw new Error(`unknown kernel in variant ${label}; known: ${ATTENTION_KERNELS.join(', ')}`);
  if (form !== undefined && (form !== 'rolled' || kernel !== 'fma')) throw new Error(`variant ${label}: the only form is rolled, of the fma kernel`);
  if (toggles !== undefined && !(toggles in TOGGLES)) throw new Error(`variant ${label}: toggles are ${Object.keys(TOGGLES)}`);
  return { label, kernel, form, toggles };
}
function flagsFor(toggles: string | undefined): string[] {
  if (!toggles) return [...DEFAULT_DAWN_FLAGS];
  return DEFAULT_DAWN_FLAGS.map((f) => (f.startsWith('enable-dawn-features=') ? `${f},${TOGGLES[toggles].join(',')}` : f));
}
const VARIANTS = (args.get('variants') || 'fma,subgroup-matrix').split(',').filter(Boolean).map(parseVariant);
const PROBES = (args.get('probes') ?? 'fma,lds,robust').split(',').filter(Boolean);
const BEST_DENSE = list('best-dense', '');
const CHECK_N = Number(args.get('check') || (smoke ? 256 : 4096));
const DENSE = list('dense', smoke ? '256,512' : '8192,16384,32768,65536');
const SPARSE = list('sparse', smoke ? '512,1024' : '32768,65536,131072');
const TFJS = list('tfjs', smoke ? '256' : '8192,16384');
const PROBE = Number(args.get('smm-probe') ?? (smoke ? 256 : 8192));
/** a variant whose max relative error on sampled rows exceeds this is not timed as "best" */
const ERR_OK = 2e-2;

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

interface Gpu {
  b: WebGpuBackend;
}

async function synth(g: Gpu, rows: number, heads: number, kind: number, seed: number): Promise<DeviceTensor> {
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
async function readRaw(g: Gpu, t: DeviceTensor, r0: number, count: number): Promise<Uint16Array> {
  const per = t.shape[1] * t.shape[2];
  return new Uint16Array(await g.b.gpu.read((t as unknown as { buffer: GPUBuffer }).buffer, r0 * per * 2, count * per * 2));
}

/** Rows [r0, r0 + count) of a [rows, heads, d] f16 tensor as f32. */
async function readRows(g: Gpu, t: DeviceTensor, r0: number, count: number): Promise<Float32Array> {
  const u16 = await readRaw(g, t, r0, count);
  const out = new Float32Array(u16.length);
  for (let i = 0; i < u16.length; i++) out[i] = F16[u16[i]];
  return out;
}

/**
 * float64 attention for sampled (row, head) pairs, dense or over a mask; the max error of
 * the device output on those rows, relative to the row's max |value| (f16 output).
 */
async function checkRows(
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

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)];
}

const causalFlops = (n: number) => 4 * D * H * ((n * (n + 1)) / 2);

async function timeIt(g: Gpu, f: () => Promise<unknown>, reps: number): Promise<number[]> {
  await f();
  await g.b.synchronize();
  const ts: number[] = [];
  for (let r = 0; r < reps; r++) {
    const t0 = performance.now();
    await f();
    await g.b.synchronize();
    ts.push(performance.now() - t0);
  }
  return ts;
}

/** Time one dispatch of a probe pipeline (a warm-up, then 5 runs): the median and the runs, ms. */
async function timeDispatch(
  g: Gpu,
  pipe: GPUComputePipeline,
  buffers: readonly GPUBuffer[],
  groups: readonly [number, number?, number?],
): Promise<{ ms: number; runsMs: number[] }> {
  const ctx = g.b.gpu;
  const run = async () => {
    const enc = ctx.device.createCommandEncoder();
    ctx.dispatch(enc, pipe, buffers, groups);
    ctx.submit(enc);
    await ctx.idle();
  };
  const runsMs = await timeIt(g, run, 5);
  return { ms: median(runsMs), runsMs };
}


/**
 * Probe of chromium-experimental-subgroup-matrix: a plain f16 GEMM C = A Bᵀ (f32 result) in
 * subgroup-matrix fragments, each subgroup of 32 owning 2 x 2 fragments, checked against a
 * host product on a few entries and timed. Tells whether the tensor-core path compiles and
 * what it reaches before an attention kernel is built on it.
 */
async function subgroupMatrixProbe(g: Gpu, size: number): Promise<unknown> {
  const adapterInfo = (g.b.gpu.keepAlive[1] as GPUAdapter | undefined)?.info as unknown as {
    subgroupMatrixConfigs?: { componentType: string; resultComponentType: string; M: number; N: number; K: number }[];
  };
  const configs = [...(adapterInfo?.subgroupMatrixConfigs ?? [])].map((c) => ({
    componentType: c.componentType,
    resultComponentType: c.resultComponentType,
    M: c.M,
    N: c.N,
    K: c.K,
  }));
  const cfg = configs.find((c) => c.componentType === 'f16' && c.resultComponentType === 'f32');
  if (!cfg) return { configs, skipped: 'no f16 -> f32 subgroup matrix config' };
  const { M: FM, N: FN, K: FK } = cfg;
  const wgsl = `
enable f16;
enable chromium_experimental_subgroup_matrix;
struct Params { M: u32, N: u32, K: u32, p: u32 }
@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> A: array<f16>;
@group(0) @binding(2) var<storage, read> Bt: array<f16>;
@group(0) @binding(3) var<storage, read_write> C: array<f32>;
@compute @workgroup_size(32)
fn main(@builtin(workgroup_id) wid: vec3<u32>) {
  let m0 = wid.y * ${2 * FM}u;
  let n0 = wid.x * ${2 * FN}u;
  var c00: subgroup_matrix_result<f32, ${FN}, ${FM}>;
  var c01: subgroup_matrix_result<f32, ${FN}, ${FM}>;
  var c10: subgroup_matrix_result<f32, ${FN}, ${FM}>;
  var c11: subgroup_matrix_result<f32, ${FN}, ${FM}>;
  for (var k = 0u; k < P.K; k += ${FK}u) {
    let a0 = subgroupMatrixLoad<subgroup_matrix_left<f16, ${FK}, ${FM}>>(&A, m0 * P.K + k, false, P.K);
    let a1 = subgroupMatrixLoad<subgroup_matrix_left<f16, ${FK}, ${FM}>>(&A, (m0 + ${FM}u) * P.K + k, false, P.K);
    let b0 = subgroupMatrixLoad<subgroup_matrix_right<f16, ${FN}, ${FK}>>(&Bt, n0 * P.K + k, true, P.K);
    let b1 = subgroupMatrixLoad<subgroup_matrix_right<f16, ${FN}, ${FK}>>(&Bt, (n0 + ${FN}u) * P.K + k, true, P.K);
    c00 = subgroupMatrixMultiplyAccumulate(a0, b0, c00);
    c01 = subgroupMatrixMultiplyAccumulate(a0, b1, c01);
    c10 = subgroupMatrixMultiplyAccumulate(a1, b0, c10);
    c11 = subgroupMatrixMultiplyAccumulate(a1, b1, c11);
  }
  subgroupMatrixStore(&C, m0 * P.N + n0, c00, false, P.N);
  subgroupMatrixStore(&C, m0 * P.N + n0 + ${FN}u, c01, false, P.N);
  subgroupMatrixStore(&C, (m0 + ${FM}u) * P.N + n0, c10, false, P.N);
  subgroupMatrixStore(&C, (m0 + ${FM}u) * P.N + n0 + ${FN}u, c11, false, P.N);
}
`;
  const ctx = g.b.gpu;
  const pipe = await ctx.pipeline({ name: 'smmGemm', cacheKey: `smm:${FM}x${FN}x${FK}`, wgsl, entryPoint: 'main' });
  const n = size;
  const a = await synth(g, n, 1, 0, 21);
  const bt = await synth(g, n, 1, 2, 22);
  // synth makes [rows, 1, 128]; re-read as [n][K = 128]: a K = 128 GEMM (attention's Q Kᵀ)
  const K = D;
  const c = ctx.createBuffer(n * n * 4, 0x80 | 0x4, 'C');
  const u = ctx.uniform([n, n, K, 0]);
  const buf = (t: DeviceTensor) => (t as unknown as { buffer: GPUBuffer }).buffer;
  const { ms, runsMs } = await timeDispatch(g, pipe, [u, buf(a), buf(bt), c], [n / (2 * FN), n / (2 * FM)]);
  const af = await readRows(g, a, 0, 4);
  const bf = await readRows(g, bt, 0, n);
  // (synth rows are [rows, 1, 128]: row-major [n][K])
  const cRow = new Float32Array(await ctx.read(c, 0, 4 * n * 4));
  let err = 0;
  for (let i = 0; i < 4; i++) {
    for (let j = 0; j < n; j += Math.max(1, Math.floor(n / 64))) {
      let dot = 0;
      for (let x = 0; x < K; x++) dot += af[i * K + x] * bf[j * K + x];
      err = Math.max(err, Math.abs(dot - cRow[i * n + j]) / Math.max(1, Math.abs(dot)));
    }
  }
  return { config: cfg, configs, n, K, ms, runsMs, tflops: (2 * n * n * K) / ms / 1e9, maxRelError: err };
}

/**
 * Did the device toggles reach the device? With Tint's robustness transform an index past
 * a storage binding is clamped into it; without it the read goes to the memory behind the
 * binding. The binding covers 4 of the 64 words written (word i = i), the shader reads word
 * 40: 40 means no clamp (robustness off), 3 or 0 means clamped. Also: workgroup memory read
 * before any write after a dispatch that filled it (zero-init on: all zero).
 */
async function robustnessProbe(b: WebGpuBackend): Promise<unknown> {
  const ctx = b.gpu;
  const wgsl = /* wgsl */ `
@group(0) @binding(0) var<storage, read_write> buf: array<u32>;
@group(0) @binding(1) var<storage, read_write> res: array<u32>;
@group(0) @binding(2) var<uniform> U: vec4<u32>;
var<workgroup> wg: array<u32, 256>;
@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) lid: u32) {
  if (U.y == 1u) {
    wg[lid] = 0xABCD0000u + lid;
    workgroupBarrier();
    res[512u + lid] = wg[255u - lid];
    return;
  }
  let z = wg[lid];
  workgroupBarrier();
  if (lid == 0u) { res[0] = buf[U.x]; res[1] = arrayLength(&buf); }
  res[256u + lid] = z;
}`;
  const pipe = await ctx.pipeline({ name: 'robustProbe', cacheKey: 'robustProbe', wgsl, entryPoint: 'main' });
  const buf = ctx.u32Buffer(Array.from({ length: 64 }, (_, i) => i), 'probe-buf');
  const res = ctx.createBuffer(4 * 1024, 0x80 | 0x4 | 0x8, 'probe-res');
  const fill = ctx.uniform([40, 1, 0, 0]);
  const read = ctx.uniform([40, 0, 0, 0]);
  const bind = (u: GPUBuffer) =>
    ctx.device.createBindGroup({
      layout: pipe.getBindGroupLayout(0),
      entries: [
        { binding: 0, resource: { buffer: buf, offset: 0, size: 16 } },
        { binding: 1, resource: { buffer: res } },
        { binding: 2, resource: { buffer: u } },
      ],
    });
  const enc = ctx.device.createCommandEncoder();
  for (const [u, groups] of [[fill, 264], [read, 264]] as const) {
    const pass = enc.beginComputePass();
    pass.setPipeline(pipe);
    pass.setBindGroup(0, bind(u));
    pass.dispatchWorkgroups(groups);
    pass.end();
  }
  ctx.submit(enc, [fill, read]);
  await ctx.idle();
  const out = new Uint32Array(await ctx.read(res, 0, 4 * 1024));
  const wgWords = out.subarray(256, 512);
  const nonzero = wgWords.filter((x) => x !== 0).length;
  ctx.retire(buf, res);
  return {
    outOfBoundsRead: out[0],
    arrayLength: out[1],
    robustnessClamped: out[0] !== 40,
    workgroupWordsNonzeroBeforeWrite: nonzero,
    workgroupSample: [...wgWords.subarray(0, 4)].map((x) => x.toString(16)),
  };
}

/**
 * Register-only FMA throughput: 8 independent vec4 chains per thread of fma(): the ceiling
 * of the FMA kernel's inner loops on this device.
 */
async function fmaPeakProbe(b: WebGpuBackend): Promise<unknown> {
  const ctx = b.gpu;
  const step = (a: string) => `${a} = fma(${a}, x, y);`;
  const chains = [0, 1, 2, 3, 4, 5, 6, 7];
  const wgsl = /* wgsl */ `
struct U { iters: u32, p: u32, a: f32, b: f32 }
@group(0) @binding(0) var<uniform> P: U;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let x = vec4<f32>(P.a);
  let y = vec4<f32>(P.b);
  let base = vec4<f32>(f32(gid.x) * 1e-7) + vec4<f32>(0.0, 0.01, 0.02, 0.03);
  ${chains.map((i) => `var a${i} = base + vec4<f32>(${i}.0 * 0.1);`).join(' ')}
  for (var i = 0u; i < P.iters; i++) {
    ${chains.map((i) => step(`a${i}`)).join(' ')}
    ${chains.map((i) => step(`a${i}`)).join(' ')}
  }
  out[gid.x] = dot(${chains.map((i) => `a${i}`).join(' + ')}, vec4<f32>(1.0));
}`;
  const pipe = await ctx.pipeline({ name: 'fmaPeak', cacheKey: 'fmaPeak', wgsl, entryPoint: 'main' });
  const groups = smoke ? 16 : 4096;
  const iters = smoke ? 16 : 2048;
  const out = ctx.createBuffer(groups * 256 * 4, 0x80 | 0x4, 'fma-out');
  const u = ctx.uniform([iters, 0, { f32: 0.999 }, { f32: 1e-4 }]);
  const { ms, runsMs } = await timeDispatch({ b }, pipe, [u, out], [groups]);
  const sample = new Float32Array(await ctx.read(out, 0, 16));
  ctx.retire(out, u);
  const flop = 2 * 64 * iters * groups * 256;
  return { form: 'fma()', ms, runsMs, tflops: flop / ms / 1e9, finite: sample.every(Number.isFinite) };
}

/**
 * The S = Q Kᵀ inner loop of an attention kernel with its operands already in workgroup
 * memory (no global loads, no softmax), one barrier per 16-dim chunk as in the kernels:
 * the ceiling of that tiling on this device: 128 threads, 8 x 4 per thread, 3 vec4 loads per
 * 32 FMAs.
 */
async function ldsGemmProbe(b: WebGpuBackend): Promise<unknown> {
  const ctx = b.gpu;
  const T = 128;
  const R = 8;
  const kk = Array.from({ length: 16 }, (_, i) => i);
  const body = (k: number) =>
    `{ let a0 = W[qb + ${k * 16}u + tr * 2u]; let a1 = W[qb + ${k * 16}u + tr * 2u + 1u]; let bb = W[qb + ${256 + k * 16}u + tc];
      s0 = fma(vec4<f32>(a0.x), bb, s0); s1 = fma(vec4<f32>(a0.y), bb, s1); s2 = fma(vec4<f32>(a0.z), bb, s2); s3 = fma(vec4<f32>(a0.w), bb, s3);
      s4 = fma(vec4<f32>(a1.x), bb, s4); s5 = fma(vec4<f32>(a1.y), bb, s5); s6 = fma(vec4<f32>(a1.z), bb, s6); s7 = fma(vec4<f32>(a1.w), bb, s7); }`;
  const wgsl = /* wgsl */ `
struct U { iters: u32, p0: u32, p1: u32, p2: u32 }
@group(0) @binding(0) var<uniform> P: U;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
var<workgroup> W: array<vec4<f32>, 1024>;
@compute @workgroup_size(${T})
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
  let tr = lid / 16u;
  let tc = lid % 16u;
  for (var x = lid; x < 1024u; x += ${T}u) { W[x] = vec4<f32>(f32(x) * 1e-4, f32(wid.x) * 1e-6, 0.5, -0.25); }
  workgroupBarrier();
  ${Array.from({ length: R }, (_, i) => `var s${i} = vec4<f32>(0.0);`).join(' ')}
  for (var it = 0u; it < P.iters; it++) {
    let qb = (it % 2u) * 512u;
    ${kk.map(body).join('\n    ')}
    workgroupBarrier();
  }
  out[wid.x * ${T}u + lid] = dot(${Array.from({ length: R }, (_, i) => `s${i}`).join(' + ')}, vec4<f32>(1.0));
}`;
  const pipe = await ctx.pipeline({ name: 'ldsGemm', cacheKey: 'ldsGemm', wgsl, entryPoint: 'main' });
  const groups = smoke ? 8 : 2048;
  const iters = smoke ? 8 : 512;
  const out = ctx.createBuffer(groups * T * 4, 0x80 | 0x4, 'lds-out');
  const u = ctx.uniform([iters, 0, 0, 0]);
  const { ms, runsMs } = await timeDispatch({ b }, pipe, [u, out], [groups]);
  ctx.retire(out, u);
  const flop = 2 * 16 * R * 4 * iters * groups * T;
  return { tiling: 'fma', threads: T, rowsPerThread: R, ms, runsMs, tflops: flop / ms / 1e9 };
}

interface Variant extends VariantSpec {
  b: WebGpuBackend;
  /** the kernel the backend actually runs (a failed or ineligible tensor-core kernel runs fma) */
  active: string;
  buildOk: boolean;
  correct?: boolean;
  /** ms of one dense call at the last measured n, for projecting the next size */
  lastN?: number;
  lastMs?: number;
  stopped?: string;
}

/** Compile one program on the device: every WGSL message and the pipeline error, if any. */
async function buildReport(device: GPUDevice, name: string, wgsl: string): Promise<Record<string, unknown>> {
  if (writeWgsl) writeFileSync(join(outDir, 'wgsl', `${name}.wgsl`), wgsl);
  const t0 = performance.now();
  const rep: Record<string, unknown> = { program: name };
  try {
    device.pushErrorScope('internal');
    device.pushErrorScope('validation');
    const module = device.createShaderModule({ code: wgsl, label: name });
    const info = await module.getCompilationInfo();
    const msgs = info.messages.map((m) => ({ type: m.type, line: m.lineNum, col: m.linePos, message: m.message }));
    // Deprecation warnings repeat once per call site: keep errors whole, count the rest.
    rep.errors = msgs.filter((m) => m.type === 'error');
    const others = new Map<string, { count: number; first: unknown }>();
    for (const m of msgs.filter((x) => x.type !== 'error')) {
      const k = `${m.type}: ${m.message}`;
      const e = others.get(k);
      if (e) e.count++;
      else others.set(k, { count: 1, first: m });
    }
    rep.otherMessages = [...others.entries()].map(([k, v]) => ({ message: k, count: v.count, first: v.first }));
    device.createComputePipeline({ layout: 'auto', compute: { module, entryPoint: 'main' }, label: name });
    const ve = await device.popErrorScope();
    const ie = await device.popErrorScope();
    rep.validationError = ve ? ve.message : null;
    rep.internalError = ie ? ie.message : null;
    rep.ok = !ve && !ie && (rep.errors as unknown[]).length === 0;
  } catch (e) {
    rep.exception = String(e instanceof Error ? (e.stack ?? e.message) : e);
    rep.ok = false;
  }
  rep.ms = performance.now() - t0;
  return rep;
}

/** Block rows for the sparse check: block 0, the diagonal and a seeded half of the rest. */
function checkMask(n: number): BlockMask {
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

/**
 * A hung kernel never resolves its promise: give up after `ms`, mark the variant, and let
 * the run go on (each variant has its own device, so the others keep working).
 */
async function withTimeout<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const t = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: no result after ${(ms / 1000).toFixed(0)} s (hung or far too slow)`)), ms);
  });
  try {
    return await Promise.race([p, t]);
  } finally {
    clearTimeout(timer);
  }
}

function reps(n: number): number {
  // short runs (8k: ~22 ms) get more samples: their median is what the 25 TFLOP/s target reads
  return n >= 32768 ? 3 : n >= 16384 ? 5 : 9;
}

/** A backend on its own Dawn device running this variant (toggles, rolled loops). */
async function backendFor(spec: VariantSpec): Promise<WebGpuBackend> {
  return createNodeWebGpuBackend({
    attentionKernel: spec.kernel,
    flags: flagsFor(spec.toggles),
    compactKernels: spec.form === 'rolled' ? true : undefined,
  });
}

async function main(): Promise<void> {
  const base = await createNodeWebGpuBackend();
  const adapter = base.gpu.keepAlive[1] as GPUAdapter | undefined;
  result.device = base.info;
  const ai = adapter?.info as unknown as Record<string, unknown> | undefined;
  result.adapterInfo = ai
    ? {
        subgroupMinSize: ai.subgroupMinSize,
        subgroupMaxSize: ai.subgroupMaxSize,
        subgroupMatrixConfigs: [...((ai.subgroupMatrixConfigs as Record<string, unknown>[] | undefined) ?? [])].map((c) => ({
          componentType: c.componentType,
          resultComponentType: c.resultComponentType,
          M: c.M,
          N: c.N,
          K: c.K,
        })),
      }
    : undefined;
  log('adapter', base.info.vendor, base.info.architecture, base.info.description, base.info.features.join(' '), result.adapterInfo, base.info.limits);
  log('shape', { H, HKV, D, budgetS: budgetMs / 1000, variants: VARIANTS, smoke });
  save();

  // --------------------------------------------- (a) build report, every variant
  const variants: Variant[] = [];
  const builds: Record<string, unknown>[] = [];
  result.build = builds;
  for (const spec of VARIANTS) {
    // Each variant gets its own Dawn instance and device: a driver fault or device loss in
    // an experimental kernel then takes down that variant only; toggles are per device.
    const name = spec.label;
    const b = await backendFor(spec);
    const programs: [string, string][] = [];
    const k = spec.kernel;
    if (k === 'subgroup-matrix') programs.push([name, b.attentionProgramFor(k, 'f16', D).wgsl]);
    else programs.push([`${name}-f16`, b.attentionProgramFor(k, 'f16', D).wgsl], [`${name}-f32`, b.attentionProgramFor(k, 'f32', D).wgsl]);
    let ok = true;
    for (const [pname, wgsl] of programs) {
      const rep = await buildReport(b.gpu.device, pname, wgsl);
      rep.variant = name;
      rep.flags = flagsFor(spec.toggles);
      rep.eligible = b.attentionKernel === k;
      ok &&= rep.ok === true;
      builds.push(rep);
      log('build', pname, rep.ok ? 'OK' : 'FAILED', { eligible: rep.eligible, errors: rep.errors, validationError: rep.validationError, internalError: rep.internalError, exception: rep.exception, otherMessages: (rep.otherMessages as unknown[]).length, ms: Math.round(rep.ms as number) });
      writeFileSync(join(outDir, 'build-report.json'), JSON.stringify(builds, null, 1));
      save();
    }
    const vr: Variant = { ...spec, b, active: b.attentionKernel, buildOk: ok };
    if (!ok) vr.stopped = 'did not build (see build report)';
    variants.push(vr);
  }
  if (PROBE > 0) {
    try {
      result.subgroupMatrixProbe = await subgroupMatrixProbe({ b: base }, PROBE);
    } catch (e) {
      result.subgroupMatrixProbe = { error: String(e) };
    }
    log('smm-probe', result.subgroupMatrixProbe);
    save();
  }

  // ------------------------------------------ (b) correctness of every variant
  const checks: unknown[] = [];
  result.correctness = checks;
  for (const vr of variants) {
    const g = { b: vr.b };
    const n = CHECK_N;
    const row: Record<string, unknown> = { variant: vr.label, n };
    if (vr.stopped) {
      row.skipped = vr.stopped;
      vr.correct = false;
      checks.push(row);
      log('check', row);
      save();
      continue;
    }
    try {
      await withTimeout(
        (async () => {
          const q = await synth(g, n, H, 0, 31);
          const k = await synth(g, n, HKV, 1, 32);
          const v = await synth(g, n, HKV, 2, 33);
          const out = vr.b.allocate('f16', [n, H, D]);
          await vr.b.denseAttention(q, k, v, { out });
          await vr.b.synchronize();
          vr.active = vr.b.attentionKernel;
          row.active = vr.active;
          row.note = vr.b.kernelNote;
          const t0 = performance.now();
          await vr.b.denseAttention(q, k, v, { out });
          await vr.b.synchronize();
          vr.lastMs = performance.now() - t0;
          vr.lastN = n;
          row.denseMs = vr.lastMs;
          row.dense = await checkRows(g, q, k, v, out, undefined, 8);
          // Block-sparse path of the same kernel: a fixed mask with sink, diagonal and about
          // half of the other blocks (the crisp plan at this n may route every head to dense).
          const mask = checkMask(n);
          await vr.b.sparseAttention(q, k, v, mask, { out });
          row.sparse = await checkRows(g, q, k, v, out, mask, 8);
          const worst = Math.max((row.dense as { maxError: number }).maxError, (row.sparse as { maxError?: number }).maxError ?? 0);
          vr.correct = worst < ERR_OK && vr.active === vr.kernel;
          row.correct = vr.correct;
          for (const t of [q, k, v, out]) t.dispose();
        })(),
        smoke ? 300000 : 60000,
        `check ${vr.label}`,
      );
    } catch (e) {
      row.error = String(e instanceof Error ? (e.stack ?? e.message) : e);
      vr.correct = false;
      vr.stopped = 'the correctness run failed (see correctness)';
    }
    if (!vr.stopped && vr.active !== vr.kernel) vr.stopped = `runs ${vr.active}, not ${vr.kernel}: ${vr.b.kernelNote ?? 'not eligible on this adapter'}`;
    log('check', row);
    checks.push(row);
    save();
  }

  // ----------------------------------------- probes: FMA ceiling, toggles reached?
  if (PROBES.length) {
    const probes: Record<string, unknown> = {};
    result.probes = probes;
    const fast = variants.find((v) => v.toggles === 'fast')?.b;
    const norobust = variants.find((v) => v.toggles === 'norobust')?.b;
    const on: [string, WebGpuBackend | undefined][] = [['default', base], ['fast', fast], ['norobust', norobust]];
    for (const [tag, b] of on) {
      if (!b) continue;
      const run = async (key: string, f: () => Promise<unknown>) => {
        try {
          probes[`${key}@${tag}`] = await withTimeout(f(), 60000, `probe ${key}@${tag}`);
        } catch (e) {
          probes[`${key}@${tag}`] = { error: String(e instanceof Error ? (e.stack ?? e.message) : e) };
        }
        log('probe', `${key}@${tag}`, probes[`${key}@${tag}`]);
        save();
      };
      if (PROBES.includes('robust')) await run('robust', () => robustnessProbe(b));
      if (PROBES.includes('fma') && tag === 'default') {
        await run('fma-peak', () => fmaPeakProbe(b));
      }
      if (PROBES.includes('lds') && tag !== 'norobust') {
        await run('lds-gemm', () => ldsGemmProbe(b));
      }
    }
  }

  // ------------------------------------------------- (c) dense sweep per variant
  const dense: Record<string, unknown>[] = [];
  result.dense = dense;
  const denseOne = async (vr: Variant, n: number, frac: number) => {
    if (vr.stopped) {
      dense.push({ n, variant: vr.label, skipped: vr.stopped });
      return;
    }
    const r = reps(n);
    const callMs = (vr.lastMs ?? 1000) * ((n / (vr.lastN ?? n)) ** 2);
    const projected = callMs * (r + 1) + 1500 + n / 20;
    if (projected > left(frac)) {
      dense.push({ n, variant: vr.label, skipped: `time budget: projected ${(projected / 1000).toFixed(1)} s, ${(left(frac) / 1000).toFixed(1)} s left for the dense phase` });
      log('dense skip', n, vr.label, dense[dense.length - 1].skipped);
      save();
      return;
    }
    const g = { b: vr.b };
    try {
      const q = await synth(g, n, H, 0, 1);
      const k = await synth(g, n, HKV, 1, 2);
      const v = await synth(g, n, HKV, 2, 3);
      const out = vr.b.allocate('f16', [n, H, D]);
      const ts = await withTimeout(timeIt(g, () => vr.b.denseAttention(q, k, v, { out }), r), Math.max(60000, 4 * projected), `dense ${vr.label} n=${n}`);
      const ms = median(ts);
      vr.lastMs = ms;
      vr.lastN = n;
      const check = await checkRows(g, q, k, v, out, undefined, 4);
      const row = { n, variant: vr.label, active: vr.b.attentionKernel, H, Hkv: HKV, d: D, dtype: 'f16', ms, runsMs: ts, tflops: causalFlops(n) / ms / 1e9, check };
      log('dense', row);
      dense.push(row);
      for (const t of [q, k, v, out]) t.dispose();
    } catch (e) {
      vr.stopped = `error at n=${n}`;
      dense.push({ n, variant: vr.label, error: String(e instanceof Error ? (e.stack ?? e.message) : e) });
      log('dense error', n, vr.label, String(e));
    }
    save();
  };
  for (const n of DENSE) for (const vr of variants) await denseOne(vr, n, 0.5);
  const best = bestVariant(variants, dense);
  // What a browser can run: Dawn's default toggles (robustness on).
  const bestPlain = bestVariant(variants.filter((v) => v.form !== 'rolled' && !v.toggles), dense);
  result.bestVariant = best?.label ?? null;
  result.bestPlainVariant = bestPlain?.label ?? null;
  log('best variant', best?.label ?? 'none', 'best plain variant', bestPlain?.label ?? 'none');
  if (bestPlain) for (const n of BEST_DENSE) await denseOne(bestPlain, n, 0.6);

  // ------------------------------------------------------------ conformance
  const confSizes = list('conformance', smoke ? '' : '4000');
  if (confSizes.length) {
    const reports: unknown[] = [];
    result.conformance = reports;
    // The best plain variant, and the experimental tensor-core kernel wherever it ran correctly.
    const specs: VariantSpec[] = [bestPlain ?? { label: 'fma', kernel: 'fma' }];
    const smm = variants.find((v) => v.kernel === 'subgroup-matrix' && v.correct && !v.toggles);
    if (smm && smm !== bestPlain) specs.push(smm);
    for (const spec of specs) {
      for (const n of confSizes) {
        const kernel = spec.label;
        if (left(1) < (n > 16384 ? 60000 : 30000)) {
          reports.push({ n, kernel, skipped: 'time budget' });
          log('conformance skip', n, 'time budget');
          save();
          continue;
        }
        const sizes = LARGE_SIZES.filter((s) => s.n === n && (s.m ?? s.n) === s.n);
        const t0 = performance.now();
        const rep = await runConformance(() => backendFor(spec), {
          sizes,
          dtypes: ['f16'],
          filter: n > 4096 ? /^(denseAttention|sparseAttention\/vs|proxyStats)/ : undefined,
          onResult: (x) => log(x.passed ? 'pass' : x.skipped ? 'skip' : 'FAIL', x.name, x.skipped ?? x.detail.slice(0, 200)),
        });
        reports.push({
          n,
          kernel,
          seconds: (performance.now() - t0) / 1000,
          seed: rep.seed,
          passed: rep.passed,
          counts: rep.counts,
          failures: rep.results.filter((x) => !x.passed && !x.skipped).map((x) => ({ name: x.name, detail: x.detail })),
        });
        log('conformance', n, kernel, rep.passed ? 'PASSED' : 'FAILED', rep.counts);
        save();
      }
    }
  }

  // ------------------------------------ (d) sparse vs own dense, best plain variant
  const sparse: unknown[] = [];
  result.sparse = sparse;
  let lastDense: { n: number; ms: number } | undefined = bestPlain?.lastN ? { n: bestPlain.lastN, ms: bestPlain.lastMs! } : undefined;
  for (const n of SPARSE) {
    if (!bestPlain) break;
    const r = n >= 131072 ? 2 : 3;
    const denseGuess = lastDense ? lastDense.ms * (n / lastDense.n) ** 2 : 1000;
    // dense (warm-up + reps), sparse pipeline (warm-up + reps) and attention alone, at ~0.7 density
    const projected = denseGuess * (r + 1) * (1 + 2 * 0.75) + 4000 + n / 10;
    if (projected > left(0.95)) {
      sparse.push({ n, skipped: `time budget: projected ${(projected / 1000).toFixed(1)} s, ${(left(0.95) / 1000).toFixed(1)} s left for the sparse phase` });
      log('sparse skip', n, sparse[sparse.length - 1]);
      save();
      continue;
    }
    const b = bestPlain.b;
    const g = { b };
    try {
      const q = await synth(g, n, H, 0, 11);
      const k = await synth(g, n, HKV, 1, 12);
      const v = await synth(g, n, HKV, 2, 13);
      const out = b.allocate('f16', [n, H, D]);
      attentionShape(q, k, v);
      const denseTs = await timeIt(g, () => b.denseAttention(q, k, v, { out }), r);
      const runs: { planMs: number; attentionMs: number; totalMs: number }[] = [];
      let last: Awaited<ReturnType<typeof sparsePrefill>> | undefined;
      for (let i = 0; i <= r; i++) {
        const t0 = performance.now();
        const res = await sparsePrefill(b, { q, k, v }, crisp, { minSparseLength: 0, out });
        const total = performance.now() - t0;
        if (i > 0) runs.push({ ...res.timings, totalMs: total });
        last = res;
      }
      const plan = last!.plan;
      const attTs = plan.mask ? await timeIt(g, () => b.sparseAttention(q, k, v, plan.mask!, { out }), r) : [];
      const check = await checkRows(g, q, k, v, out, plan.mask, 4);
      const denseMs = median(denseTs);
      lastDense = { n, ms: denseMs };
      const attMs = attTs.length ? median(attTs) : Number.NaN;
      const totalMs = median(runs.map((x) => x.totalMs));
      const planMs = median(runs.map((x) => x.planMs));
      const routes = plan.routing?.routes ?? [];
      const row = {
        n,
        variant: bestPlain.label,
        active: b.attentionKernel,
        policy: plan.policy,
        density: plan.overallDensity,
        vsHeads: routes.filter((x) => x === 'vs').length,
        peHeads: routes.filter((x) => x === 'pe').length,
        denseMs,
        denseTflops: causalFlops(n) / denseMs / 1e9,
        denseRunsMs: denseTs,
        sparseTotalMs: totalMs,
        sparsePlanMs: planMs,
        sparseAttentionMs: attMs,
        sparseRuns: runs,
        speedup: denseMs / totalMs,
        attentionVsDensityTimesDense: attMs / (plan.overallDensity * denseMs),
        totalVsBound: totalMs / (plan.overallDensity * denseMs + planMs),
        check,
      };
      log('sparse', row);
      sparse.push(row);
      for (const t of [q, k, v, out]) t.dispose();
    } catch (e) {
      sparse.push({ n, error: String(e instanceof Error ? (e.stack ?? e.message) : e) });
      log('sparse error', n, String(e));
    }
    save();
  }

  // ------------------------------------------------------------------- tfjs
  if (TFJS.length) result.tfjs = await tfjsPeer(TFJS, bestPlain);

  result.finishedSeconds = elapsed() / 1000;
  log('done', result.finishedSeconds);
  save();
  for (const vr of variants) vr.b.dispose();
  base.dispose();
}

/** The correct variant with the highest dense TFLOP/s at the largest n every timed variant reached. */
function bestVariant(variants: Variant[], dense: Record<string, unknown>[]): Variant | undefined {
  const ok = variants.filter((v) => v.correct);
  if (!ok.length) return undefined;
  const timed = dense.filter((r) => typeof r.tflops === 'number');
  let best: Variant | undefined;
  let bestScore = -1;
  for (const v of ok) {
    const rows = timed.filter((r) => r.variant === v.label);
    if (!rows.length) continue;
    const nmax = Math.max(...rows.map((r) => r.n as number));
    // score at the largest n this variant reached, penalised when others reached larger n
    const atMax = rows.find((r) => r.n === nmax)!.tflops as number;
    const score = atMax * (nmax / Math.max(...timed.map((r) => r.n as number)));
    if (score > bestScore) {
      bestScore = score;
      best = v;
    }
  }
  return best ?? ok[0];
}

/**
 * The peer: dense causal attention as a TensorFlow.js user writes it on the WebGPU backend
 * (@crisp/kernels-webgpu/tfjs-peer), H/HKV heads of D, 1 warm-up and 3 timed runs per size, checked
 * against float64 rows before it is timed; the ratio is to the best variant's dense time.
 */
async function tfjsPeer(sizes: number[], best: Variant | undefined): Promise<unknown> {
  const rows: unknown[] = [];
  const dense = (result.dense as Record<string, unknown>[]) ?? [];
  for (const n of sizes) {
    if (left(1) < 15000) {
      rows.push({ n, skipped: 'time budget' });
      continue;
    }
    try {
      const r = await timeTfjsDenseAttention({ n, heads: H, kvHeads: HKV, headDim: D, reps: 3, warmup: 1 });
      if ('medianMs' in r) {
        const ours = dense.find((x) => x.n === n && x.variant === best?.label && typeof x.ms === 'number');
        const row = {
          n,
          ms: r.medianMs,
          runsMs: r.runs,
          tflops: causalFlops(n) / r.medianMs / 1e9,
          dtype: r.dtype,
          check: r.check,
          oursVariant: best?.label,
          oursMs: ours?.ms,
          tfjsOverOurs: ours ? r.medianMs / (ours.ms as number) : undefined,
        };
        rows.push(row);
        log('tfjs', row);
      } else {
        rows.push({ n, error: 'absent' in r ? r.absent : r.failed });
        log('tfjs error', n, r);
      }
    } catch (e) {
      rows.push({ n, error: String(e) });
      log('tfjs error', n, String(e));
    }
    result.tfjs = rows;
    save();
  }
  return rows;
}

main().catch((e) => {
  result.fatal = String(e instanceof Error ? e.stack : e);
  save();
  log('FATAL', result.fatal);
  process.exitCode = 1;
});
