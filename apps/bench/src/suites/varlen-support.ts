/**
 * What the varlen suite's two parts share: its policies, a timing loop that keeps each run's
 * own timings and respects the run's deadline, synth inputs written straight into rows of
 * packed tensors, and output rows read back to the host for comparisons.
 *
 * Shape legend: q [rows, H, d], k and v [rows, Hkv, d] (packed: sequences one after another).
 */
import { type Backend, type DeviceTensor, type DType, mulberry32, type Policy, toFloat32 } from '@crisp/core';
import { crisp, dense } from '@crisp/presets';
import { relativeError } from '@crisp/reference';
import { cStruct } from '@crisp/router';
import { globalCoverage, noiseFloor } from '@crisp/select';
import { synthThreads } from '@crisp/synth/node';
import type { Shape, VarlenPolicyName } from '../config.js';
import { deadlineReason, type SuiteContext, timeLeft } from '../context.js';
import { inputsProgress, latencyInputs } from '../inputs.js';
import { type Spread, spread } from '../stats.js';

/** crisp scaled to B = 64 (kMin 256, windows 64): the same decisions at the lengths a CPU test affords. */
const crispB64: Policy = Object.freeze({
  ...crisp,
  name: 'crisp-b64',
  blockSize: 64,
  kMin: 256,
  router: cStruct({ tauProxy: 0.2, wSink: 64, wLocal: 64 }),
  vs: noiseFloor({ alpha: 1.0, kMin: 256 }),
  pe: globalCoverage({ gamma: 0.95, kMin: 256 }),
});

export function varlenPolicy(name: VarlenPolicyName): Policy {
  return name === 'crisp' ? crisp : name === 'crisp-b64' ? crispB64 : dense;
}

/** `count` lengths drawn uniformly from [min, max] with a fixed seed (mulberry32, as every seeded draw here). */
export function drawLengths(count: number, [min, max]: readonly [number, number], seed: number): number[] {
  const r = mulberry32(seed);
  return Array.from({ length: count }, () => min + Math.floor(r() * (max - min + 1)));
}

/** Exclusive prefix sums: [0, l0, l0 + l1, ...] (FlashAttention's cu_seqlens). */
export function cuSeqlens(lengths: readonly number[]): number[] {
  const out = [0];
  for (const n of lengths) out.push(out[out.length - 1] + n);
  return out;
}

export interface Timed<T> {
  readonly ms: Spread;
  /** what each timed run returned, in run order */
  readonly runs: T[];
}

/**
 * `warmup` untimed runs (at least one), then `reps` timed ones (host wall clock). The
 * warm-up's last run projects the timed ones: when they would not fit before the run's
 * deadline nothing is timed and the reason comes back instead.
 */
export async function timeRuns<T>(ctx: SuiteContext, run: () => Promise<T>, reps: number, warmup: number): Promise<Timed<T> | { skipped: string }> {
  let last = 0;
  for (let i = 0; i < Math.max(1, warmup); i++) {
    const t0 = performance.now();
    await run();
    last = performance.now() - t0;
  }
  const projected = last * reps;
  const left = timeLeft(ctx);
  if (projected > left) return { skipped: deadlineReason(projected, left) };
  const ms: number[] = [];
  const runs: T[] = [];
  for (let i = 0; i < reps; i++) {
    const t0 = performance.now();
    runs.push(await run());
    ms.push(performance.now() - t0);
  }
  return { ms: spread(ms), runs };
}

/** The median of one field over the timed runs. */
export const medianOf = <T>(runs: readonly T[], pick: (r: T) => number): number => spread(runs.map(pick)).median;

export interface PackedQkv {
  readonly q: DeviceTensor;
  readonly k: DeviceTensor;
  readonly v: DeviceTensor;
}

/**
 * q [rows, H, d], k and v [rows, Hkv, d] and `outputs` output tensors [rows, H, d] on the
 * backend, each pushed to `made` (the caller disposes them, in reverse, when done or failed).
 */
export function allocatePacked(b: Backend, rows: number, s: Shape, dtype: DType, outputs: number, made: { dispose(): void }[]): { packed: PackedQkv; outs: DeviceTensor[] } {
  const alloc = (heads: number) => {
    const t = b.allocate(dtype, [rows, heads, s.headDim]);
    made.push(t);
    return t;
  };
  const [q, k, v] = [s.heads, s.kvHeads, s.kvHeads].map(alloc);
  return { packed: { q, k, v }, outs: Array.from({ length: outputs }, () => alloc(s.heads)) };
}

/**
 * The backend as the input generators see it: its three allocations (q, k, v of `n` rows, in
 * that order) are the rows [start, start + n) of the packed tensors (sliceRows views), so a
 * scenario streamed through it lands in the packed batch. Everything else is the backend.
 */
function intoRows(b: Backend, packed: PackedQkv, start: number, n: number): { backend: Backend; views: DeviceTensor[] } {
  const slice = b.sliceRows!.bind(b);
  const views = [slice(packed.q, start, n), slice(packed.k, start, n), slice(packed.v, start, n)];
  let next = 0;
  const backend = new Proxy(b, {
    get: (t, p) => {
      if (p === 'allocate') {
        return (dtype: DType, shape: readonly number[]) => {
          const view = views[next++];
          if (!view || view.dtype !== dtype || view.shape.join() !== shape.join()) {
            throw new Error(`packed inputs: allocation ${next} of [${shape}] ${dtype} does not match rows [${start}, ${start + n}) of q, k, v`);
          }
          return view;
        };
      }
      const x = Reflect.get(t, p, t);
      return typeof x === 'function' ? x.bind(t) : x;
    },
  });
  return { backend, views };
}

/**
 * The @crisp/synth llama-like scenario of `n` rows (seed `seed`) written into rows
 * [start, start + n) of the packed q, k, v, generated as the latency suite's `synth` inputs
 * are (worker threads from 32k tokens). Returns where the values came from.
 */
export async function writeScenarioRows(ctx: SuiteContext, b: Backend, packed: PackedQkv, start: number, n: number, s: Shape, dtype: DType, seed: number, label: string): Promise<string> {
  const { backend, views } = intoRows(b, packed, start, n);
  try {
    const c = ctx.config.latency;
    const made = await latencyInputs(backend, 'llama-like', n, s, dtype, seed, Number.POSITIVE_INFINITY, 'synth', inputsProgress((m) => ctx.log(m), label), c.synthThreads ?? synthThreads());
    return made.source;
  } finally {
    for (const v of views) v.dispose();
  }
}

interface RowReader {
  readRows(t: DeviceTensor, rows: Int32Array): { dtype: DType; shape: number[]; data: Float32Array | Uint16Array };
}

/**
 * Rows (first axis) of a device tensor on the host as f32, in the order given: the backend's
 * readRows where it has one (CUDA), else the whole tensor when every row is asked for, else a
 * one-row slice at a time.
 */
export async function hostRows(b: Backend, t: DeviceTensor, rows: readonly number[]): Promise<Float32Array> {
  const reader = b as Backend & Partial<RowReader>;
  if (typeof reader.readRows === 'function') return toFloat32(reader.readRows(t, Int32Array.from(rows)) as never);
  const per = t.shape.slice(1).reduce((a, x) => a * x, 1);
  if (rows.length === t.shape[0] && rows.every((r, i) => r === i)) return toFloat32(await b.download(t));
  const out = new Float32Array(rows.length * per);
  for (let i = 0; i < rows.length; i++) {
    const view = b.sliceRows!(t, rows[i], 1);
    try {
      out.set(toFloat32(await b.download(view)), i * per);
    } finally {
      view.dispose();
    }
  }
  return out;
}

/** max |a − b| over two equal-length arrays (Infinity where either is not finite). */
export function maxAbsDiff(a: Float32Array, b: Float32Array): number {
  let m = 0;
  for (let i = 0; i < a.length; i++) {
    const d = Math.abs(a[i] - b[i]);
    m = Math.max(m, Number.isFinite(d) ? d : Number.POSITIVE_INFINITY);
  }
  return m;
}

/** ‖a − ref‖ / ‖ref‖ in float64 over rows read with hostRows (@crisp/reference's relativeError, over every value). */
export function relErr(a: Float32Array, ref: Float32Array): number {
  const host = (x: Float32Array) => ({ dtype: 'f32' as const, shape: [x.length], data: x });
  return relativeError(host(a), host(ref)).overall;
}

interface FullRelError {
  relError(a: DeviceTensor, b: DeviceTensor): { relErr: number; nonFinite: number };
}

/** ‖a − b‖ / ‖b‖ over every element, on the device, where the backend has it (CUDA's relError). */
export function deviceRelErr(b: Backend, x: DeviceTensor, ref: DeviceTensor): { relErr: number; nonFinite: number } | undefined {
  const d = b as Backend & Partial<FullRelError>;
  return typeof d.relError === 'function' ? d.relError(x, ref) : undefined;
}
