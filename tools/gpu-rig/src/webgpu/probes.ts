/** Probes: the subgroup-matrix GEMM, the FMA peak, the workgroup-memory GEMM ceiling and whether the device toggles took effect. */
import type { DeviceTensor } from '@crisp/core';
import type { WebGpuBackend } from '@crisp/kernels-webgpu';
import { D, PROBE, PROBES, smoke } from './args.js';
import { log, median, result, save, timeIt, withTimeout } from './harness.js';
import { type Gpu, readRows, synth } from './tensors.js';
import type { Variant } from './variants.js';

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

/** The subgroup-matrix GEMM probe at --smm-probe n on the default device (0 skips it). */
export async function subgroupMatrixProbePhase(base: WebGpuBackend): Promise<void> {
  if (PROBE > 0) {
    try {
      result.subgroupMatrixProbe = await subgroupMatrixProbe({ b: base }, PROBE);
    } catch (e) {
      result.subgroupMatrixProbe = { error: String(e) };
    }
    log('smm-probe', result.subgroupMatrixProbe);
    save();
  }
}

/** --probes on the default device and on the variants' devices with toggles. */
export async function probesPhase(base: WebGpuBackend, variants: Variant[]): Promise<void> {
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
}
