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
import { type Spread, spread } from '../stats.js';
import type { Shape } from '../config.js';
import { type SuiteContext, message, timeLeft } from '../context.js';
import { llamaRows } from '../llama-fill.js';

export interface TfjsRow {
  readonly n: number;
  readonly shape: Shape;
  /** 'crisp' (zero-copy, the crisp preset), 'crisp-host' (the host path), 'tfjs-dense' */
  readonly method: 'crisp' | 'crisp-host' | 'tfjs-dense';
  /** wall ms from the call to the output on the device */
  readonly ms: Spread;
  /** crisp rows: the prefill's own total (sparsePrefill), median ms */
  readonly prefillMs?: number;
  readonly density?: number;
  /** crisp rows: max |crisp - tfjs dense| / max |tfjs dense| over the whole output, where dense ran */
  readonly relErrorVsDense?: number;
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

/** max |a - b| / max |b| (read asynchronously: tfjs-backend-webgpu's synchronous reads need a canvas). */
async function relativeError(tf: Tf, a: Tensor, b: Tensor): Promise<number> {
  const [num, den] = tf.tidy(() => [tf.max(tf.abs(tf.sub(a, b))), tf.max(tf.abs(b))]);
  const r = (await num.data())[0] / (await den.data())[0];
  tf.dispose([num, den]);
  return r;
}

const flops = (n: number, s: Shape) => 4 * s.headDim * s.heads * ((n * (n + 1)) / 2);

async function onDevice(tf: Tf): Promise<void> {
  await (tf.backend() as unknown as { device: GPUDevice }).device.queue.onSubmittedWorkDone();
}

/** The llama fill's q, k, v as tf.Tensors on the current (webgpu) backend. */
function layer(tf: Tf, n: number, s: Shape, seed: number): Tensor[] {
  return ([0, 1, 2] as const).map((w) => {
    const heads = w === 0 ? s.heads : s.kvHeads;
    return tf.tensor(llamaRows(w, 0, n, heads, s.headDim, s.heads, seed), [n, heads, s.headDim], 'float32');
  });
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
    const base = layer(tf, n, c.shape, ctx.config.seed);
    const fresh = () => tf.tidy(() => base.map((t) => tf.add(t, 0)));
    try {
      // crisp, zero-copy
      let plan: { prefill: number[]; density: number } = { prefill: [], density: 1 };
      let last: Tensor | undefined;
      const crispRuns: number[] = [];
      for (let r = 0; r < c.warmup + c.reps; r++) {
        const [q, k, v] = fresh();
        await onDevice(tf);
        const t0 = performance.now();
        const res = await lib.crispAttention(q, k, v);
        await onDevice(tf);
        const ms = performance.now() - t0;
        tf.dispose([q, k, v]);
        if (res.path !== 'webgpu') throw new Error(`crispAttention took the ${res.path} path`);
        if (r >= c.warmup) {
          crispRuns.push(ms);
          plan = { prefill: [...plan.prefill, res.timings.prefillMs], density: res.density };
        }
        last?.dispose();
        last = res.output;
      }
      let denseOut: Tensor | undefined;
      if (n * n * 4 <= limit) {
        const denseRuns: number[] = [];
        for (let r = 0; r < c.warmup + c.reps; r++) {
          const [q, k, v] = fresh();
          await onDevice(tf);
          const t0 = performance.now();
          const o = lib.tfDenseAttention(q, k, v);
          await onDevice(tf);
          denseRuns.push(performance.now() - t0);
          tf.dispose([q, k, v]);
          denseOut?.dispose();
          denseOut = o;
        }
        const ms = spread(denseRuns.slice(c.warmup));
        rows.push({ n, shape: c.shape, method: 'tfjs-dense', ms, tflops: flops(n, c.shape) / ms.median / 1e9 });
        ctx.log(`tfjs n=${n}: tfjs-dense ${ms.median.toFixed(1)} ms`);
      } else {
        notes.push(`n=${n}: tfjs-dense not run: its ${n}x${n} f32 score matrix (${((n * n * 4) / 2 ** 30).toFixed(2)} GiB) is over the device's buffer limit (${(limit / 2 ** 30).toFixed(2)} GiB)`);
      }
      const rel = denseOut && last ? await relativeError(tf, last, denseOut) : undefined;
      const ms = spread(crispRuns);
      rows.push({
        n,
        shape: c.shape,
        method: 'crisp',
        ms,
        prefillMs: spread(plan.prefill).median,
        density: plan.density,
        ...(rel === undefined ? {} : { relErrorVsDense: rel }),
        tflops: flops(n, c.shape) / ms.median / 1e9,
      });
      ctx.log(`tfjs n=${n}: crisp ${ms.median.toFixed(1)} ms (density ${plan.density.toFixed(3)}${rel === undefined ? '' : `, rel. error vs TF.js dense ${rel.toExponential(2)}`})`);
      tf.dispose([last, denseOut].filter((x): x is Tensor => x !== undefined));
      if (n === c.copyN) rows.push(await hostPath(tf, lib, createNodeWebGpuBackend, n, c, fresh));
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

/** The same crispAttention through the host: a CRISP WebGPU backend on a device of its own. */
async function hostPath(
  tf: Tf,
  lib: typeof import('@crisp/tfjs'),
  create: typeof import('@crisp/kernels-webgpu/node').createNodeWebGpuBackend,
  n: number,
  c: { readonly shape: Shape; readonly reps: number; readonly warmup: number },
  fresh: () => Tensor[],
): Promise<TfjsRow> {
  const own = await create();
  const tfb = tf.backend() as unknown as { uploadToGPU(id: object): void };
  try {
    const runs: number[] = [];
    const prefill: number[] = [];
    let density = 1;
    for (let r = 0; r < c.warmup + c.reps; r++) {
      const [q, k, v] = fresh();
      await onDevice(tf);
      const t0 = performance.now();
      const res = await lib.crispAttention(q, k, v, { backend: own });
      // the output made from host values goes to the device at first use: count that too
      tfb.uploadToGPU(res.output.dataId);
      await onDevice(tf);
      const ms = performance.now() - t0;
      tf.dispose([q, k, v, res.output]);
      if (res.path !== 'host') throw new Error(`a backend on another device took the ${res.path} path`);
      if (r >= c.warmup) {
        runs.push(ms);
        prefill.push(res.timings.prefillMs);
        density = res.density;
      }
    }
    const ms = spread(runs);
    return { n, shape: c.shape, method: 'crisp-host', ms, prefillMs: spread(prefill).median, density, tflops: flops(n, c.shape) / ms.median / 1e9 };
  } finally {
    own.dispose();
  }
}

const f = (x: number, d = 1) => (x >= 100 ? x.toFixed(0) : x.toFixed(d));

/** The suite's section of bench.md. */
export function tfjsMarkdown(r: TfjsResult, reps: number): string[] {
  const out: string[] = ['', '## TF.js (@crisp/tfjs on tfjs-backend-webgpu)', ''];
  out.push(
    `crispAttention (the crisp preset) on TF.js's own WebGPU device against TF.js's own dense attention (tfDenseAttention: per head tf.matMul, mask, tf.softmax, tf.matMul) on the same tf.Tensors, f32, the llama fill; wall ms from the call to the output on the device, median of ${reps} runs [min, max]. crisp-host: the same call through the host (data(), a CRISP WebGPU backend on its own device, a new tensor). TF.js ${r.tfjsVersion ?? '?'}.`,
  );
  if (r.rows.length) {
    out.push('');
    out.push('| n | method | ms | prefill ms | density | rel. error vs tfjs-dense | TFLOP/s (dense-equivalent) | speed-up vs tfjs-dense |');
    out.push('|---|---|---|---|---|---|---|---|');
    for (const row of r.rows) {
      const dense = r.rows.find((x) => x.n === row.n && x.method === 'tfjs-dense');
      out.push(
        `| ${row.n / 1024}k | ${row.method} | ${f(row.ms.median)} [${f(row.ms.min)}, ${f(row.ms.max)}] | ${row.prefillMs === undefined ? '–' : f(row.prefillMs)} | ${row.density === undefined ? '–' : row.density.toFixed(3)} | ${row.relErrorVsDense === undefined ? '–' : row.relErrorVsDense.toExponential(2)} | ${row.tflops.toFixed(1)} | ${dense && row !== dense ? `${(dense.ms.median / row.ms.median).toFixed(2)}x` : '–'} |`,
      );
    }
  }
  for (const x of r.notes) out.push(`- ${x}`);
  return out;
}
