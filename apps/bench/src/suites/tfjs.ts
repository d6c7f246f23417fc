/**
 * The TF.js suite (`--suites tfjs`, not in the default set): @crisp/tfjs's crispAttention on
 * tfjs-backend-webgpu against TF.js's own dense attention (tfDenseAttention: per head
 * tf.matMul, mask, tf.softmax, tf.matMul) on the same tf.Tensors in the same run, f32 (TF.js's
 * WebGPU backend has no f16). Inputs: the llama fill (the WebGPU latency suite's layer), made
 * on the host and uploaded once. Every timing runs until the output is on the device
 * (queue.onSubmittedWorkDone); each run gets fresh device copies of q, k, v (tf.add(x, 0)) so
 * no run finds values TF.js cached on the host. Also, at one size, the same call through the
 * host (data() to the host, a second CRISP WebGPU backend on its own device, the output back
 * as a new tensor) against the zero-copy path.
 */
import { type BlockMask, expandToRows } from '@crisp/core';
import { type Spread, spread } from '../stats.js';
import type { Shape } from '../config.js';
import { type SuiteContext, message, timeLeft } from '../context.js';
import { llamaRows } from '../llama-fill.js';

export interface TfjsRow {
  readonly n: number;
  readonly shape: Shape;
  /**
   * 'crisp' (the crisp preset, zero-copy), 'crisp-host' (the host path), 'tfjs-dense'
   * (tfDenseAttention on the same tensors), 'tfjs-dense-peer' (the latency suite's TF.js peer:
   * per-head tensors, its own random inputs)
   */
  readonly method: 'crisp' | 'crisp-host' | 'tfjs-dense' | 'tfjs-dense-peer';
  /** wall ms from the call to the output on the device */
  readonly ms: Spread;
  /** crisp rows: the prefill's own total (sparsePrefill), median ms */
  readonly prefillMs?: number;
  readonly density?: number;
  /**
   * rows 0, n/2, n-1 of the first and last head against float64 attention over the same keys
   * (dense rows: all of them; crisp: its plan's blocks): max |o - ref| / max(max |ref|, 1e-3)
   */
  readonly rowsError?: number;
  /** crisp rows: the same rows against float64 dense attention (the sparse approximation's error) */
  readonly denseRowsError?: number;
  /** 4·d·H·n(n+1)/2 causal flops / median, TFLOP/s (dense-equivalent for crisp) */
  readonly tflops: number;
}

export interface TfjsResult {
  readonly rows: TfjsRow[];
  readonly notes: string[];
  readonly tfjsVersion?: string;
}

type Tf = typeof import('@tensorflow/tfjs-core');
type Tensor = import('@tensorflow/tfjs-core').Tensor;

const flops = (n: number, s: Shape) => 4 * s.headDim * s.heads * ((n * (n + 1)) / 2);

async function onDevice(tf: Tf): Promise<void> {
  await (tf.backend() as unknown as { device: GPUDevice }).device.queue.onSubmittedWorkDone();
}

export async function tfjsSuite(ctx: SuiteContext): Promise<TfjsResult> {
  const c = ctx.config.tfjs;
  const notes: string[] = [];
  const peer = await import('@crisp/kernels-webgpu/tfjs-peer');
  const started = await peer.startTfjsWebGpu();
  if ('absent' in started) return { rows: [], notes: [`skipped: ${started.absent}`] };
  const { tf } = started;
  const lib = await import('@crisp/tfjs');
  const { createNodeWebGpuBackend } = await import('@crisp/kernels-webgpu/node');
  const rows: TfjsRow[] = [];
  const device = (tf.backend() as unknown as { device: GPUDevice }).device;
  const limit = Math.min(Number(device.limits.maxStorageBufferBindingSize), Number(device.limits.maxBufferSize));
  for (const n of c.sizes) {
    const left = timeLeft(ctx);
    if (left !== undefined && left < 20_000) {
      notes.push(`n=${n}: skipped, ${Math.round(left / 1000)} s left of the deadline`);
      break;
    }
    const host = layerValues(n, c.shape, ctx.config.seed);
    const base = host.map((x, w) => tf.tensor(x, [n, w === 0 ? c.shape.heads : c.shape.kvHeads, c.shape.headDim], 'float32'));
    const fresh = () => tf.tidy(() => base.map((t) => tf.add(t, 0)));
    const check = (o: Tensor, mask?: BlockMask) => checkRows(o, host, n, c.shape, mask);
    try {
      // crisp, zero-copy
      const runs: number[] = [];
      const prefill: number[] = [];
      let density = 1;
      let mask: BlockMask | undefined;
      let out: Tensor | undefined;
      for (let r = 0; r < c.warmup + c.reps; r++) {
        const [q, k, v] = fresh();
        await onDevice(tf);
        const t0 = performance.now();
        const res = await lib.crispAttention(q, k, v);
        await onDevice(tf);
        const ms = performance.now() - t0;
        tf.dispose([q, k, v]);
        out?.dispose();
        out = res.output;
        if (res.path !== 'webgpu') throw new Error(`crispAttention took the ${res.path} path`);
        if (r >= c.warmup) {
          runs.push(ms);
          prefill.push(res.timings.prefillMs);
          density = res.density;
          mask = res.plans[0].mask;
        }
      }
      const denseErr = await check(out!);
      const ownErr = mask ? await check(out!, mask) : denseErr;
      out?.dispose();
      const ms = spread(runs);
      rows.push({ n, shape: c.shape, method: 'crisp', ms, prefillMs: spread(prefill).median, density, rowsError: ownErr, denseRowsError: denseErr, tflops: flops(n, c.shape) / ms.median / 1e9 });
      ctx.log(`tfjs n=${n}: crisp ${ms.median.toFixed(1)} ms (density ${density.toFixed(3)}; rows vs float64 on its mask ${ownErr.toExponential(2)}, vs dense ${denseErr.toExponential(2)})`);
      if (n === c.copyN) {
        const h = await hostPath(tf, lib, createNodeWebGpuBackend, n, c, fresh, check);
        rows.push(h);
        ctx.log(`tfjs n=${n}: crisp-host ${h.ms.median.toFixed(1)} ms`);
      }
      if (n * n * 4 <= limit) {
        const denseRuns: number[] = [];
        let o: Tensor | undefined;
        for (let r = 0; r < c.warmup + c.reps; r++) {
          const [q, k, v] = fresh();
          await onDevice(tf);
          const t0 = performance.now();
          const x = lib.tfDenseAttention(q, k, v);
          await onDevice(tf);
          denseRuns.push(performance.now() - t0);
          tf.dispose([q, k, v]);
          o?.dispose();
          o = x;
        }
        const err = await check(o!);
        o?.dispose();
        const dms = spread(denseRuns.slice(c.warmup));
        rows.push({ n, shape: c.shape, method: 'tfjs-dense', ms: dms, rowsError: err, tflops: flops(n, c.shape) / dms.median / 1e9 });
        ctx.log(`tfjs n=${n}: tfjs-dense ${dms.median.toFixed(1)} ms (rows vs float64 ${err.toExponential(2)})`);
        if (!(err <= 2e-3)) notes.push(`n=${n}: tfjs-dense failed its float64 check (${err.toExponential(2)}): its time is not a result`);
      } else {
        notes.push(`n=${n}: tfjs-dense not run: its ${n}x${n} f32 score matrix (${((n * n * 4) / 2 ** 30).toFixed(2)} GiB) is over the device's buffer limit (${(limit / 2 ** 30).toFixed(2)} GiB)`);
      }
      // the latency suite's TF.js peer (per-head tensors, its own random inputs), for a second dense time
      const p = await peer.timeTfjsDenseAttention({ n, heads: c.shape.heads, kvHeads: c.shape.kvHeads, headDim: c.shape.headDim, reps: c.reps, warmup: c.warmup, seed: ctx.config.seed });
      if ('medianMs' in p) {
        const pms = { median: p.medianMs, min: p.minMs, max: p.maxMs, runs: p.runs.length };
        rows.push({ n, shape: c.shape, method: 'tfjs-dense-peer', ms: pms, rowsError: p.check.maxRelError, tflops: p.tflops });
      } else notes.push(`n=${n}: tfjs-dense-peer: ${'absent' in p ? p.absent : p.failed}`);
    } catch (e) {
      notes.push(`n=${n}: failed: ${message(e)}`);
      ctx.log(`tfjs n=${n}: failed: ${message(e)}`);
    } finally {
      tf.dispose(base);
    }
  }
  await lib.disposeCrispBackends();
  return { rows, notes, tfjsVersion: tf.version_core };
}

/** The llama fill's q, k, v host values ([n, H, d], [n, Hkv, d] twice). */
function layerValues(n: number, s: Shape, seed: number): Float32Array[] {
  return ([0, 1, 2] as const).map((w) => llamaRows(w, 0, n, w === 0 ? s.heads : s.kvHeads, s.headDim, s.heads, seed));
}

/**
 * Rows 0, n/2, n-1 of heads 0 and H-1 of `o` against float64 causal attention on the host
 * values, over every key (dense) or over the blocks of `mask` (a sparse plan's own
 * definition): max |o - ref| / max(max |ref|, 1e-3). A wrong or unwritten output shows here.
 */
export async function checkRows(o: { data(): Promise<unknown> }, [q, k, v]: Float32Array[], n: number, s: Shape, mask?: BlockMask): Promise<number> {
  const got = (await o.data()) as Float32Array;
  const { heads: H, kvHeads: Hkv, headDim: D } = s;
  const rows = mask ? expandToRows(mask) : undefined;
  const B = mask?.blockSize ?? n;
  /** whether query row i of head h sees key j (causal, and in a kept block) */
  const sees = (h: number, i: number, j: number): boolean => {
    if (!rows || !mask) return true;
    const r = h * mask.numBlocks + Math.floor(i / B);
    const jb = Math.floor(j / B);
    for (let x = rows.rowPtr[r]; x < rows.rowPtr[r + 1]; x++) if (rows.cols[x] === jb) return true;
    return false;
  };
  const scale = 1 / Math.sqrt(D);
  let worst = 0;
  for (const h of new Set([0, H - 1])) {
    const g = Math.floor(h / (H / Hkv));
    for (const i of new Set([0, n >> 1, n - 1])) {
      const sc = new Float64Array(i + 1);
      let m = Number.NEGATIVE_INFINITY;
      for (let j = 0; j <= i; j++) {
        if (!sees(h, i, j)) {
          sc[j] = Number.NEGATIVE_INFINITY;
          continue;
        }
        let acc = 0;
        for (let c = 0; c < D; c++) acc += q[(i * H + h) * D + c] * k[(j * Hkv + g) * D + c];
        sc[j] = acc * scale;
        m = Math.max(m, sc[j]);
      }
      const ref = new Float64Array(D);
      let z = 0;
      for (let j = 0; j <= i; j++) {
        if (sc[j] === Number.NEGATIVE_INFINITY) continue;
        const p = Math.exp(sc[j] - m);
        z += p;
        for (let c = 0; c < D; c++) ref[c] += p * v[(j * Hkv + g) * D + c];
      }
      let amax = 0;
      let err = 0;
      for (let c = 0; c < D; c++) {
        const r = ref[c] / z;
        amax = Math.max(amax, Math.abs(r));
        const x = got[(i * H + h) * D + c];
        err = Math.max(err, Number.isFinite(x) ? Math.abs(x - r) : Number.POSITIVE_INFINITY);
      }
      worst = Math.max(worst, err / Math.max(amax, 1e-3));
    }
  }
  return worst;
}

/** The same crispAttention through the host: a CRISP WebGPU backend on a device of its own. */
async function hostPath(
  tf: Tf,
  lib: typeof import('@crisp/tfjs'),
  create: typeof import('@crisp/kernels-webgpu/node').createNodeWebGpuBackend,
  n: number,
  c: { readonly shape: Shape; readonly reps: number; readonly warmup: number },
  fresh: () => Tensor[],
  check: (o: Tensor, mask?: BlockMask) => Promise<number>,
): Promise<TfjsRow> {
  const own = await create();
  const tfb = tf.backend() as unknown as { uploadToGPU(id: object): void };
  try {
    const runs: number[] = [];
    const prefill: number[] = [];
    let density = 1;
    let err = Number.NaN;
    let ownErr = Number.NaN;
    for (let r = 0; r < c.warmup + c.reps; r++) {
      const [q, k, v] = fresh();
      await onDevice(tf);
      const t0 = performance.now();
      const res = await lib.crispAttention(q, k, v, { backend: own });
      // the output made from host values goes to the device at first use: count that too
      tfb.uploadToGPU(res.output.dataId);
      await onDevice(tf);
      const ms = performance.now() - t0;
      if (r === 0) {
        err = await check(res.output);
        ownErr = res.plans[0].mask ? await check(res.output, res.plans[0].mask) : err;
      }
      tf.dispose([q, k, v, res.output]);
      if (res.path !== 'host') throw new Error(`a backend on another device took the ${res.path} path`);
      if (r >= c.warmup) {
        runs.push(ms);
        prefill.push(res.timings.prefillMs);
        density = res.density;
      }
    }
    const ms = spread(runs);
    return { n, shape: c.shape, method: 'crisp-host', ms, prefillMs: spread(prefill).median, density, rowsError: ownErr, denseRowsError: err, tflops: flops(n, c.shape) / ms.median / 1e9 };
  } finally {
    own.dispose();
  }
}

const f = (x: number, d = 1) => (x >= 100 ? x.toFixed(0) : x.toFixed(d));

/** The suite's section of bench.md. */
export function tfjsMarkdown(r: TfjsResult, reps: number): string[] {
  const out: string[] = ['', '## TF.js (@crisp/tfjs on tfjs-backend-webgpu)', ''];
  out.push(
    `crispAttention (the crisp preset) on TF.js's own WebGPU device against TF.js's own dense attention (tfDenseAttention: per head tf.matMul, mask, tf.softmax, tf.matMul) on the same tf.Tensors, f32, the llama fill; wall ms from the call to the output on the device, median of ${reps} runs [min, max]. crisp-host: the same call through the host (data(), a CRISP WebGPU backend on its own device, a new tensor). tfjs-dense-peer: the latency suite's TF.js peer (per-head tensors made up front, its own random inputs). Rows vs float64: rows 0, n/2, n-1 of the first and last head against float64 attention over the same keys (crisp: its plan's blocks, the exactness check) and over every key (crisp: its sparse approximation's error). crisp keeps the backend's length gate (dense below it). TF.js ${r.tfjsVersion ?? '?'}.`,
  );
  if (r.rows.length) {
    out.push('');
    out.push('| n | method | ms | prefill ms | density | rows vs float64, same keys | rows vs float64 dense | TFLOP/s (dense-equivalent) | speed-up vs tfjs-dense |');
    out.push('|---|---|---|---|---|---|---|---|---|');
    for (const row of r.rows) {
      const dense = r.rows.find((x) => x.n === row.n && x.method === 'tfjs-dense');
      out.push(
        `| ${row.n / 1024}k | ${row.method} | ${f(row.ms.median)} [${f(row.ms.min)}, ${f(row.ms.max)}] | ${row.prefillMs === undefined ? '–' : f(row.prefillMs)} | ${row.density === undefined ? '–' : row.density.toFixed(3)} | ${row.rowsError === undefined ? '–' : row.rowsError.toExponential(2)} | ${(row.denseRowsError ?? (row.method.startsWith('tfjs') ? row.rowsError : undefined))?.toExponential(2) ?? '–'} | ${row.tflops.toFixed(1)} | ${dense && row !== dense ? `${(dense.ms.median / row.ms.median).toFixed(2)}x` : '–'} |`,
      );
    }
  }
  for (const x of r.notes) out.push(`- ${x}`);
  return out;
}
