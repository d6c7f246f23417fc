/// <reference types="@webgpu/types" preserve="true" />
/**
 * The TensorFlow.js dense-attention peer (entry `@crisp/kernels-webgpu/tfjs-peer`, Node or
 * browser): causal attention as a TF.js user writes it on @tensorflow/tfjs-backend-webgpu,
 * per head S = Q_h K_gᵀ, S·(1/√d) + M (M = 0 on and below the diagonal, −1e9 above),
 * P = softmax(S), O_h = P V_g, with g = ⌊h / (H / H_kv)⌋ (GQA). f32 throughout because
 * tfjs-webgpu has no f16 tensors.
 *
 * A separate entry so that the main and /node entries never load TF.js. Before any timing,
 * a few output rows are checked against float64 on the same inputs, so a broken peer is
 * reported, not timed. "Cannot run here" (no TF.js, no adapter, n beyond a buffer limit)
 * comes back as `{ absent: reason }`, a wrong or crashing run as `{ failed: reason }`; only
 * bad arguments throw (CrispError INVALID_ARGUMENT).
 *
 * @module @crisp/kernels-webgpu/tfjs-peer
 */
import { CrispError } from '@crisp/core';
import { positiveInt as checkedInt, errText, nonNegativeMs, type PeerTimes, peerTimes, warmUp, webgpuEntry, withNavigatorGpu } from './peer-support.js';

export interface TfjsDenseAttentionOptions {
  /** a WebGPU entry point (navigator.gpu or Dawn's create()); default navigator.gpu, else Dawn with DEFAULT flags */
  readonly gpu?: GPU;
  /** sequence length (queries = keys) */
  readonly n: number;
  readonly heads: number;
  readonly kvHeads: number;
  readonly headDim: number;
  /** timed runs (default 3) */
  readonly reps?: number;
  /** untimed runs first (default 1) */
  readonly warmup?: number;
  /**
   * then untimed runs until this many ms have passed (default 0): crisp-bench passes the time
   * it warms CRISP's kernels up for, so both are timed at the clock the GPU holds under load
   */
  readonly warmMs?: number;
  /** base seed of tf.randomUniform for Q, K, V (default 0) */
  readonly seed?: number;
  /** largest relative error of the checked rows accepted (default 2e-3) */
  readonly tolerance?: number;
}

export interface TfjsDenseAttentionTiming extends PeerTimes {
  readonly n: number;
  readonly dtype: 'f32';
  /** the float64 check: worst max|o − ref| / max(max|ref|, 1e-3) over the checked (head, row) pairs */
  readonly check: { readonly maxRelError: number; readonly rows: number[]; readonly heads: number[] };
  readonly tfjsVersion: string;
}

/** cannot run here (no TF.js, no adapter, n beyond a buffer limit) */
export interface TfjsAbsent {
  readonly absent: string;
}

/** ran, but wrong or crashed: the float64 check failed or TF.js threw mid-run */
export interface TfjsFailed {
  readonly failed: string;
}

export type TfjsDenseAttentionResult = TfjsDenseAttentionTiming | TfjsAbsent | TfjsFailed;

type Tf = typeof import('@tensorflow/tfjs-core');
type Tensor = import('@tensorflow/tfjs-core').Tensor;

let tfReady: Promise<{ tf: Tf } | TfjsAbsent> | undefined;

/**
 * TF.js on tfjs-backend-webgpu, started once per process (the backend registry is global):
 * the same instance the dense peer times, for callers that run their own work on it.
 */
export function startTfjsWebGpu(gpu?: GPU): Promise<{ tf: Tf } | TfjsAbsent> {
  return startTfjs(gpu);
}

/** TF.js on its WebGPU backend, started once per process (the backend registry is global). */
function startTfjs(gpu: GPU | undefined): Promise<{ tf: Tf } | TfjsAbsent> {
  tfReady ??= (async () => {
    const g = await webgpuEntry(gpu);
    if (typeof g === 'string') return { absent: g };
    // tfjs-backend-webgpu registers itself only if navigator.gpu exists when it is imported
    return withNavigatorGpu(g, async () => {
      let tf: Tf;
      try {
        tf = await import('@tensorflow/tfjs-core');
        await import('@tensorflow/tfjs-backend-webgpu');
      } catch (e) {
        return { absent: `@tensorflow/tfjs-core / tfjs-backend-webgpu did not load: ${errText(e)}` };
      }
      try {
        const ok = await tf.setBackend('webgpu');
        await tf.ready();
        if (!ok || tf.getBackend() !== 'webgpu') return { absent: `tfjs-backend-webgpu did not start (backend is '${tf.getBackend()}')` };
      } catch (e) {
        return { absent: `tfjs-backend-webgpu could not start: ${errText(e)}` };
      }
      return { tf };
    });
  })();
  return tfReady;
}

const positiveInt = (name: string, x: unknown, min = 1) => checkedInt('timeTfjsDenseAttention', name, x, min);

/** The rows checked: first, middle, last (causal edge cases: one key, half, all keys). */
function checkedRows(n: number): number[] {
  return [...new Set([0, Math.floor(n / 2), n - 1])];
}

/** float64 causal attention of one query row against keys 0..i. */
function referenceRow(q: Float32Array, k: Float32Array, v: Float32Array, i: number, d: number): Float64Array {
  const scale = 1 / Math.sqrt(d);
  const s = new Float64Array(i + 1);
  let m = Number.NEGATIVE_INFINITY;
  for (let j = 0; j <= i; j++) {
    let acc = 0;
    for (let c = 0; c < d; c++) acc += q[c] * k[j * d + c];
    s[j] = acc * scale;
    if (s[j] > m) m = s[j];
  }
  const out = new Float64Array(d);
  let z = 0;
  for (let j = 0; j <= i; j++) {
    const p = Math.exp(s[j] - m);
    z += p;
    for (let c = 0; c < d; c++) out[c] += p * v[j * d + c];
  }
  for (let c = 0; c < d; c++) out[c] /= z;
  return out;
}

/**
 * Times dense causal attention in TF.js on WebGPU: all H heads per run, synchronised by
 * reading the last head's output. Never throws for "cannot run here"; throws CrispError
 * INVALID_ARGUMENT for bad sizes.
 */
export async function timeTfjsDenseAttention(opts: TfjsDenseAttentionOptions): Promise<TfjsDenseAttentionResult> {
  const n = positiveInt('n', opts.n);
  const H = positiveInt('heads', opts.heads);
  const Hkv = positiveInt('kvHeads', opts.kvHeads);
  const D = positiveInt('headDim', opts.headDim);
  const reps = positiveInt('reps', opts.reps ?? 3);
  const warmup = positiveInt('warmup', opts.warmup ?? 1, 0);
  const warmMs = nonNegativeMs('timeTfjsDenseAttention', 'warmMs', opts.warmMs ?? 0);
  const seed = opts.seed ?? 0;
  const tolerance = opts.tolerance ?? 2e-3;
  if (H % Hkv !== 0) throw new CrispError('INVALID_ARGUMENT', `timeTfjsDenseAttention: heads (${H}) must be a multiple of kvHeads (${Hkv})`);

  const started = await startTfjs(opts.gpu);
  if ('absent' in started) return started;
  const { tf } = started;

  // The n x n score matrix is one buffer per head; beyond the device's binding limit TF.js fails late.
  const device = (tf.backend() as unknown as { device?: GPUDevice }).device;
  const limit = device ? Math.min(device.limits.maxStorageBufferBindingSize, device.limits.maxBufferSize) : Number.POSITIVE_INFINITY;
  if (n * n * 4 > limit) {
    return { absent: `n=${n}: the ${n}x${n} f32 score matrix (${((n * n * 4) / 2 ** 30).toFixed(2)} GiB) exceeds the device's buffer limit (${(limit / 2 ** 30).toFixed(2)} GiB)` };
  }

  const owned: Tensor[] = [];
  try {
    const scale = 1 / Math.sqrt(D);
    const mk = (s: number) => {
      const t = tf.tidy(() => tf.randomUniform([n, D], -1, 1, 'float32', seed + s));
      owned.push(t);
      return t;
    };
    const qs = Array.from({ length: H }, (_, h) => mk(h));
    const ks = Array.from({ length: Hkv }, (_, h) => mk(100 + h));
    const vs = Array.from({ length: Hkv }, (_, h) => mk(200 + h));
    const mask = tf.tidy(() => tf.mul(tf.sub(tf.linalg.bandPart(tf.ones([n, n]), -1, 0), 1), 1e9));
    owned.push(mask);
    const group = (h: number) => Math.floor(h / (H / Hkv));
    const head = (h: number): Tensor =>
      tf.tidy(() => {
        const s = tf.add(tf.mul(tf.matMul(qs[h], ks[group(h)], false, true), scale), mask);
        return tf.matMul(tf.softmax(s), vs[group(h)]);
      });

    // Check first: heads 0 and H-1 (the last KV group), rows 0, n/2, n-1.
    const rows = checkedRows(n);
    const heads = [...new Set([0, H - 1])];
    let worst = 0;
    for (const h of heads) {
      const o = head(h);
      try {
        const [od, qd, kd, vd] = (await Promise.all([o.data(), qs[h].data(), ks[group(h)].data(), vs[group(h)].data()])) as Float32Array[];
        for (const i of rows) {
          const ref = referenceRow(qd.subarray(i * D, (i + 1) * D), kd, vd, i, D);
          let amax = 0;
          let err = 0;
          for (let c = 0; c < D; c++) {
            amax = Math.max(amax, Math.abs(ref[c]));
            const got = od[i * D + c];
            err = Math.max(err, Number.isFinite(got) ? Math.abs(got - ref[c]) : Number.POSITIVE_INFINITY);
          }
          worst = Math.max(worst, err / Math.max(amax, 1e-3));
        }
      } finally {
        o.dispose();
      }
    }
    const check = { maxRelError: worst, rows, heads };
    if (!(worst <= tolerance)) {
      return { failed: `n=${n}: TF.js output failed the float64 check (max relative error ${worst.toExponential(2)} > ${tolerance}); not timed` };
    }

    const run = async () => {
      let last: Tensor | undefined;
      for (let h = 0; h < H; h++) {
        const o = head(h);
        last?.dispose();
        last = o;
      }
      await last?.data();
      last?.dispose();
    };
    const warmupRuns = await warmUp(run, warmup, warmMs);
    const runs: number[] = [];
    for (let r = 0; r < reps; r++) {
      const t0 = performance.now();
      await run();
      runs.push(performance.now() - t0);
    }
    return {
      n,
      ...peerTimes(runs, n, H, D, warmupRuns),
      dtype: 'f32',
      check,
      tfjsVersion: tf.version_core,
    };
  } catch (e) {
    return { failed: `n=${n}: TF.js failed: ${errText(e)}` };
  } finally {
    for (const t of owned) t.dispose();
  }
}
