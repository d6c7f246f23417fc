/**
 * How long a run will take on the reference backend (float64 TypeScript), from a quick
 * calibration of this machine: dense attention timed on a small slice of the same shape
 * (H heads, head dim d) gives ms per key scanned; dense costs H·n(n+1)/2 of those per pass,
 * a sparse pass its density times that plus its plan (planned once here to know the density),
 * the exact rows their keys at a measured multiple of dense's cost per key.
 */
import { type Backend, type DeviceTensor, type HostTensor, mulberry32, type Policy, planPrefill } from '@crisp/core';
import { createReferenceBackend } from '@crisp/reference';
import type { Inputs } from './inputs.js';

export interface RunEstimate {
  /** ms per key scanned by dense attention here (one query row, one head, one key) */
  readonly msPerKey: number;
  /** ms the calibration itself took (the slices and the plans) */
  readonly calibrationMs: number;
  /** all dense passes (warm-up and timed); null under --no-dense */
  readonly denseMs: number | null;
  /** per policy: its density and all its passes (plan and attention) */
  readonly sparse: readonly { readonly policy: string; readonly density: number; readonly planMs: number; readonly ms: number }[];
  /** the exact rows of the mass-recall check */
  readonly checkMs: number;
  /** denseMs + every sparse ms + checkMs */
  readonly totalMs: number;
}

/** Cost of an exact row's key against dense attention's (see estimateRun). */
const CHECK_COST_PER_KEY = 4;

/** Keys scanned by causal dense attention over n tokens and H heads. */
export function denseKeys(n: number, H: number): number {
  return (H * n * (n + 1)) / 2;
}

/**
 * Ms per key of the reference's dense attention on this machine, on slices [n0, H, d] of
 * random data. The first calls run before V8 has optimised the loops (several times slower),
 * so slices grow until one takes `minMs`, then repeat until two in a row agree within 15%
 * (at most `maxMs` in all); the faster of those two is the rate (a shared CPU's pauses only
 * ever add time).
 */
export async function calibrateDense(H: number, Hkv: number, d: number, maxN: number, minMs = 150, maxMs = 2000): Promise<number> {
  const be = createReferenceBackend();
  const rnd = mulberry32(0x5eed);
  const made: DeviceTensor[] = [];
  const tensor = (rows: number, heads: number): DeviceTensor => {
    const data = new Float32Array(rows * heads * d);
    for (let i = 0; i < data.length; i++) data[i] = 2 * rnd() - 1;
    const t = be.upload({ dtype: 'f32', shape: [rows, heads, d], data } satisfies HostTensor);
    made.push(t);
    return t;
  };
  const start = performance.now();
  try {
    let n0 = Math.min(256, maxN);
    let prev = Number.POSITIVE_INFINITY;
    for (;;) {
      const [q, k, v] = [tensor(n0, H), tensor(n0, Hkv), tensor(n0, Hkv)];
      const t0 = performance.now();
      (await be.denseAttention(q, k, v)).output.dispose();
      const ms = performance.now() - t0;
      const rate = ms / denseKeys(n0, H);
      const spent = performance.now() - start;
      if (ms < minMs && n0 * 2 <= maxN && n0 < 8192 && spent < maxMs) n0 *= 2;
      else if (Math.abs(rate - prev) <= 0.15 * Math.min(rate, prev) || spent >= maxMs) return Math.min(rate, prev);
      prev = rate;
      for (const t of made.splice(0)) t.dispose();
    }
  } finally {
    for (const t of made) t.dispose();
    be.dispose();
  }
}

export interface EstimateRequest {
  readonly backend: Backend;
  readonly inp: Inputs;
  readonly policies: readonly Policy[];
  /** passes per attention (warm-up and timed runs) */
  readonly passes: number;
  readonly dense: boolean;
  readonly sample: readonly number[];
  readonly blockSize: number;
  readonly gate: boolean;
}

export async function estimateRun(r: EstimateRequest): Promise<RunEstimate> {
  const { inp } = r;
  const t0 = performance.now();
  const msPerKey = await calibrateDense(inp.H, inp.Hkv, inp.d, inp.n);
  const perDense = msPerKey * denseKeys(inp.n, inp.H);
  const sparse: { policy: string; density: number; planMs: number; ms: number }[] = [];
  for (const policy of r.policies) {
    const p0 = performance.now();
    const plan = await planPrefill(r.backend, inp, policy, { minSparseLength: r.gate ? undefined : 0 });
    const planMs = performance.now() - p0;
    const density = plan.mask ? plan.overallDensity : 1;
    sparse.push({ policy: policy.name, density, planMs, ms: r.passes * (planMs + density * perDense) });
  }
  // The exact rows scan H·(i+1) keys each, one row at a time with an exp per key: measured at
  // 3.5-5x dense's cost per key on a 2-core CPU (n 2048-4096), where they are cheap anyway.
  const checkMs = CHECK_COST_PER_KEY * msPerKey * inp.H * r.sample.reduce((s, i) => s + i + 1, 0);
  const denseMs = r.dense ? r.passes * perDense : null;
  const totalMs = (denseMs ?? 0) + sparse.reduce((s, x) => s + x.ms, 0) + checkMs;
  return { msPerKey, calibrationMs: performance.now() - t0, denseMs, sparse, checkMs, totalMs };
}

/** "12 s", "3.5 min", "1.2 h" */
export function duration(ms: number): string {
  const s = ms / 1000;
  if (s < 90) return `${s < 10 ? s.toFixed(1) : Math.round(s)} s`;
  if (s < 5400) return `${(s / 60).toFixed(1)} min`;
  return `${(s / 3600).toFixed(1)} h`;
}

/** Over this, the estimate is a warning with what to change. */
export const LONG_RUN_MS = 60_000;
/** Under this, no line: the run is over before it would matter (the JSON still has the estimate). */
export const NOTE_RUN_MS = 10_000;

/** The line printed on stderr before the work starts ('' for a short run). */
export function estimateLine(e: RunEstimate, passes: number): string {
  if (e.totalMs < NOTE_RUN_MS) return '';
  const parts: string[] = [];
  if (e.denseMs !== null) parts.push(`dense ${passes > 1 ? `${passes} × ` : ''}${duration(e.denseMs / passes)}`);
  for (const s of e.sparse) parts.push(`${s.policy} ${duration(s.ms)} at density ${(100 * s.density).toFixed(1)}%`);
  if (e.checkMs > 0) parts.push(`exact rows ${duration(e.checkMs)}`);
  const what = `about ${duration(e.totalMs)} on this machine (${parts.join(', ')}; from a ${duration(e.calibrationMs)} calibration)`;
  if (e.totalMs <= LONG_RUN_MS) return `note: this run takes ${what}\n`;
  const advice = [e.denseMs !== null ? '--no-dense skips the dense baseline' : '', 'a smaller --n is quadratically faster', 'a GPU --backend is far faster'].filter(Boolean);
  return `warning: this run takes ${what}; ${advice.join(', ')}\n`;
}
