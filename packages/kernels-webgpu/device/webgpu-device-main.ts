/**
 * The H200 run (Dawn over Vulkan): checks and timings in one process, JSON to --out.
 *
 *   node webgpu-device-main.mjs --out $OUT/webgpu.json [--dense 8192,16384] [--sparse 32768]
 *        [--conformance 4000,16384] [--tfjs 8192] [--budget 400]
 *
 * Inputs for timing are generated on the GPU (a WGSL kernel: seeded noise plus sink keys,
 * a few vertical-line keys and a positional component that makes a local window), so
 * 128k-token tensors never pass through JavaScript. Correctness at those sizes is checked on
 * sampled (row, head) pairs against a float64 evaluation of the same rows.
 *
 * Shape legend: q [n, H, d], k and v [n, Hkv, d].
 */
import { writeFileSync } from 'node:fs';
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
import type { WebGpuBackend } from '../src/backend.js';
import { attentionSmmProgram } from '../src/kernels/attention-smm.js';
import { createNodeWebGpuBackend } from '../src/node.js';
import { timeTfjsDenseAttention } from '../src/tfjs-peer.js';

const args = new Map<string, string>();
for (let i = 2; i < process.argv.length; i += 2) args.set(process.argv[i].replace(/^--/, ''), process.argv[i + 1] ?? '');
const list = (k: string, dflt: string) =>
  (args.get(k) ?? dflt)
    .split(',')
    .filter(Boolean)
    .map(Number);
const outPath = args.get('out') ?? 'webgpu-device.json';
const started = performance.now();
const budgetMs = Number(args.get('budget') ?? 420) * 1000;
const elapsed = () => performance.now() - started;
const result: Record<string, unknown> = { started: new Date().toISOString(), args: Object.fromEntries(args) };
const save = () => writeFileSync(outPath, JSON.stringify(result, null, 1));
const log = (...a: unknown[]) => console.log(`[${(elapsed() / 1000).toFixed(1)}s]`, ...a);

const H = Number(args.get('heads') ?? 32);
const HKV = Number(args.get('kvheads') ?? 8);
const D = 128;

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

/** Read whole rows [r0, r0 + count) of a [rows, heads, d] f16 tensor as f32. */
async function readRows(g: Gpu, t: DeviceTensor, r0: number, count: number): Promise<Float32Array> {
  const per = t.shape[1] * t.shape[2];
  const ab = await g.b.gpu.read((t as unknown as { buffer: GPUBuffer }).buffer, r0 * per * 2, count * per * 2);
  const u16 = new Uint16Array(ab);
  const out = new Float32Array(u16.length);
  for (let i = 0; i < u16.length; i++) out[i] = f16BitsToF32(u16[i]);
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
  const kf = await readRows(g, k, 0, n);
  const vf = await readRows(g, v, 0, n);
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
      for (let c = 0; c < D; c++) dot += qr[h * D + c] * kf[(j * HKV + gk) * D + c];
      logits[t] = dot * scale;
      mx = Math.max(mx, logits[t]);
    });
    let z = 0;
    const acc = new Float64Array(D);
    keys.forEach((j, t) => {
      const p = Math.exp(logits[t] - mx);
      z += p;
      for (let c = 0; c < D; c++) acc[c] += p * vf[(j * HKV + gk) * D + c];
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
  const run = async () => {
    const enc = ctx.device.createCommandEncoder();
    ctx.dispatch(enc, pipe, [u, buf(a), buf(bt), c], [n / (2 * FN), n / (2 * FM)]);
    ctx.submit(enc);
    await ctx.idle();
  };
  const ts = await timeIt(g, run, 5);
  const ms = median(ts);
  const af = await readRows(g, a, 0, 4);
  const bf = await readRows(g, bt, 0, n);
  const cRow = new Float32Array(await ctx.read(c, 0, 4 * n * 4));
  let err = 0;
  for (let i = 0; i < 4; i++) {
    for (let j = 0; j < n; j += Math.max(1, Math.floor(n / 64))) {
      let dot = 0;
      for (let x = 0; x < K; x++) dot += af[i * K + x] * bf[j * K + x];
      err = Math.max(err, Math.abs(dot - cRow[i * n + j]) / Math.max(1, Math.abs(dot)));
    }
  }
  return { config: cfg, configs, n, K, ms, runsMs: ts, tflops: (2 * n * n * K) / ms / 1e9, maxRelError: err };
}

async function main(): Promise<void> {
  const b = await createNodeWebGpuBackend(args.has('smm-attention') ? { attentionKernel: 'subgroup-matrix' } : {});
  const g: Gpu = { b };
  result.device = b.info;
  const ai = (b.gpu.keepAlive[1] as GPUAdapter | undefined)?.info as unknown as Record<string, unknown> | undefined;
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
  log('adapter', b.info.vendor, b.info.architecture, b.info.description, b.info.features.join(' '), JSON.stringify(result.adapterInfo), JSON.stringify(b.info.limits));
  save();
  if (args.has('smm-attention')) {
    // Build the experimental tensor-core attention kernel first and keep the error, if any.
    try {
      await b.gpu.pipeline(attentionSmmProgram(D));
      result.smmAttentionBuild = 'ok';
    } catch (e) {
      result.smmAttentionBuild = String(e);
    }
    log('smm attention build', result.smmAttentionBuild);
    save();
  }
  if (args.has('smm')) {
    try {
      result.subgroupMatrixProbe = await subgroupMatrixProbe(g, Number(args.get('smm') || 8192));
    } catch (e) {
      result.subgroupMatrixProbe = { error: String(e) };
    }
    log('smm', JSON.stringify(result.subgroupMatrixProbe));
    save();
  }

  // ------------------------------------------------------------ conformance
  const confSizes = list('conformance', '');
  if (confSizes.length) {
    const reports: unknown[] = [];
    for (const n of confSizes) {
      if (elapsed() > budgetMs * 0.35) {
        reports.push({ n, skipped: 'time budget' });
        continue;
      }
      const sizes = LARGE_SIZES.filter((s) => s.n === n && (s.m ?? s.n) === s.n);
      const big = n > 4096;
      const rep = await runConformance(() => createNodeWebGpuBackend(), {
        sizes,
        // long shapes: the attention and proxy primitives in f16 (the tensor-core kernel)
        dtypes: ['f16'],
        filter: big ? /^(denseAttention|sparseAttention\/vs|proxyStats)/ : undefined,
        onResult: (r) => log(r.passed ? 'pass' : r.skipped ? 'skip' : 'FAIL', r.name, r.skipped ?? r.detail.slice(0, 200)),
      });
      reports.push({
        n,
        seed: rep.seed,
        passed: rep.passed,
        counts: rep.counts,
        failures: rep.results.filter((r) => !r.passed && !r.skipped).map((r) => ({ name: r.name, detail: r.detail })),
      });
      result.conformance = reports;
      save();
    }
  }

  // ------------------------------------------------------------------ dense
  const dense: unknown[] = [];
  result.dense = dense;
  result.attentionKernel = b.attentionKernel;
  const bFma = await createNodeWebGpuBackend({ attentionKernel: 'fma' });
  // (run 2 used 'auto' for b; the tensor-core kernel is now opt-in: --smm-attention)
  const kernels: [string, WebGpuBackend][] = b.attentionKernel === 'fma' ? [['fma', b]] : [[b.attentionKernel, b], ['fma', bFma]];
  for (const n of list('dense', '8192,16384,32768,65536'))
  for (const [kernel, kb] of kernels) {
    if (elapsed() > budgetMs * 0.6) {
      dense.push({ n, kernel, skipped: 'time budget' });
      continue;
    }
    const g = { b: kb };
    try {
      const q = await synth(g, n, H, 0, 1);
      const k = await synth(g, n, HKV, 1, 2);
      const v = await synth(g, n, HKV, 2, 3);
      const out = b.allocate('f16', [n, H, D]);
      const reps = n >= 65536 ? 3 : 5;
      const ts = await timeIt(g, () => kb.denseAttention(q, k, v, { out }), reps);
      const ms = median(ts);
      const check = await checkRows(g, q, k, v, out, undefined, 6);
      const row = { n, kernel, note: kb.kernelNote, H, Hkv: HKV, d: D, dtype: 'f16', ms, runsMs: ts, tflops: causalFlops(n) / ms / 1e9, check };
      log('dense', JSON.stringify(row));
      dense.push(row);
      for (const t of [q, k, v, out]) t.dispose();
    } catch (e) {
      dense.push({ n, kernel, error: String(e) });
      log('dense error', n, String(e));
    }
    save();
  }

  // ----------------------------------------------------------------- sparse
  const sparse: unknown[] = [];
  result.sparse = sparse;
  bFma.dispose();
  result.attentionKernelAfterDense = b.attentionKernel;
  result.kernelNote = b.kernelNote;
  for (const n of list('sparse', '32768,65536,131072')) {
    if (elapsed() > budgetMs * 0.85) {
      sparse.push({ n, skipped: 'time budget' });
      continue;
    }
    try {
      const q = await synth(g, n, H, 0, 11);
      const k = await synth(g, n, HKV, 1, 12);
      const v = await synth(g, n, HKV, 2, 13);
      const out = b.allocate('f16', [n, H, D]);
      attentionShape(q, k, v);
      const reps = 3;
      const denseTs = await timeIt(g, () => b.denseAttention(q, k, v, { out }), reps);
      const runs: { planMs: number; attentionMs: number; totalMs: number }[] = [];
      let last: Awaited<ReturnType<typeof sparsePrefill>> | undefined;
      for (let r = 0; r <= reps; r++) {
        const t0 = performance.now();
        const res = await sparsePrefill(b, { q, k, v }, crisp, { minSparseLength: 0, out });
        const total = performance.now() - t0;
        if (r > 0) runs.push({ ...res.timings, totalMs: total });
        last = res;
      }
      const plan = last!.plan;
      // Attention alone over the same plan (the mask), for the density x dense comparison.
      const attTs = await timeIt(g, () => b.sparseAttention(q, k, v, plan.mask!, { out }), reps);
      const check = await checkRows(g, q, k, v, out, plan.mask, 6);
      const denseMs = median(denseTs);
      const attMs = median(attTs);
      const totalMs = median(runs.map((r) => r.totalMs));
      const planMs = median(runs.map((r) => r.planMs));
      const routes = plan.routing?.routes ?? [];
      const row = {
        n,
        kernel: b.attentionKernel,
        policy: plan.policy,
        density: plan.overallDensity,
        vsHeads: routes.filter((x) => x === 'vs').length,
        peHeads: routes.filter((x) => x === 'pe').length,
        denseMs,
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
      log('sparse', JSON.stringify(row));
      sparse.push(row);
      for (const t of [q, k, v, out]) t.dispose();
    } catch (e) {
      sparse.push({ n, error: String(e) });
      log('sparse error', n, String(e));
    }
    save();
  }

  // ------------------------------------------------------------------- tfjs
  const tfSizes = list('tfjs', '');
  if (tfSizes.length) result.tfjs = await tfjsPeer(tfSizes);
  result.kernelNoteAtEnd = b.kernelNote;
  result.finishedSeconds = elapsed() / 1000;
  save();
  b.dispose();
}

/**
 * The peer: dense causal attention as a TensorFlow.js user writes it on the WebGPU backend
 * (./src/tfjs-peer.ts, entry @crisp/kernels-webgpu/tfjs-peer), at H/HKV heads of D, 1
 * warm-up and 3 timed runs per size as before; its float64 row check now comes with it.
 */
async function tfjsPeer(sizes: number[]): Promise<unknown> {
  const rows: unknown[] = [];
  for (const n of sizes) {
    if (elapsed() > budgetMs) {
      rows.push({ n, skipped: 'time budget' });
      continue;
    }
    try {
      const r = await timeTfjsDenseAttention({ n, heads: H, kvHeads: HKV, headDim: D, reps: 3, warmup: 1 });
      if ('medianMs' in r) {
        rows.push({ n, ms: r.medianMs, runsMs: r.runs, tflops: causalFlops(n) / r.medianMs / 1e9, dtype: r.dtype, check: r.check });
        log('tfjs', n, r.medianMs);
      } else {
        rows.push({ n, error: 'absent' in r ? r.absent : r.failed });
        log('tfjs error', n, JSON.stringify(r));
      }
    } catch (e) {
      rows.push({ n, error: String(e) });
      log('tfjs error', n, String(e));
    }
    save();
  }
  return rows;
}

main().catch((e) => {
  result.fatal = String(e instanceof Error ? e.stack : e);
  save();
  console.error(e);
  process.exitCode = 1;
});
