/**
 * Test helpers (not exported): TF.js started on its cpu or webgpu backend (Dawn in Node),
 * seeded structured inputs, the float64 reference on the same values, and a small policy
 * whose plans are sparse at test sizes.
 */
import { type BlockMask, type Policy, hostTensor, mulberry32, toFloat32 } from '@crisp/core';
import { createReferenceBackend } from '@crisp/reference';
import { crisp } from '@crisp/presets';
import { cStruct } from '@crisp/router';
import { globalCoverage, noiseFloor } from '@crisp/select';
import * as tf from '@tensorflow/tfjs-core';

export { tf };

export function freshSeed(): number {
  return Number(process.env.CRISP_SEED ?? Math.floor(Math.random() * 2 ** 31));
}

export interface Sizes {
  readonly n: number;
  readonly H: number;
  readonly Hkv: number;
  readonly d: number;
}

/** q, k, v host values: uniform noise, a few sink keys, and keys every 37 rows sharing q's direction. */
export function values(seed: number, s: Sizes, batch = 1): { q: Float32Array; k: Float32Array; v: Float32Array } {
  const r = mulberry32(seed);
  const u = (len: number, amp: number) => Float32Array.from({ length: len }, () => (r() * 2 - 1) * amp);
  const q = u(batch * s.n * s.H * s.d, 1.5);
  const k = u(batch * s.n * s.Hkv * s.d, 1.5);
  const row = s.Hkv * s.d;
  for (let b = 0; b < batch; b++) {
    for (let i = 0; i < s.n; i++) {
      if (i % 37 === 0 || i < 4) for (let x = 0; x < row; x += 3) k[(b * s.n + i) * row + x] += i < 4 ? 2 : 1;
    }
  }
  return { q, k, v: u(batch * s.n * s.Hkv * s.d, 1) };
}

/** The inputs as tf.Tensors on TF.js's current backend ([batch, ...] when batch is given). */
export function tensors(seed: number, s: Sizes, batch?: number): { q: tf.Tensor; k: tf.Tensor; v: tf.Tensor; host: ReturnType<typeof values> } {
  const host = values(seed, s, batch ?? 1);
  const lead = batch === undefined ? [] : [batch];
  return {
    q: tf.tensor(host.q, [...lead, s.n, s.H, s.d], 'float32'),
    k: tf.tensor(host.k, [...lead, s.n, s.Hkv, s.d], 'float32'),
    v: tf.tensor(host.v, [...lead, s.n, s.Hkv, s.d], 'float32'),
    host,
  };
}

const ref = createReferenceBackend();

/** float64 attention of one sequence over `mask` (dense when absent), as f32 values. */
export async function referenceOutput(h: { q: Float32Array; k: Float32Array; v: Float32Array }, s: Sizes, mask?: BlockMask): Promise<Float32Array> {
  const q = ref.upload(hostTensor('f32', [s.n, s.H, s.d], h.q));
  const k = ref.upload(hostTensor('f32', [s.n, s.Hkv, s.d], h.k));
  const v = ref.upload(hostTensor('f32', [s.n, s.Hkv, s.d], h.v));
  const r = mask ? await ref.sparseAttention(q, k, v, mask) : await ref.denseAttention(q, k, v);
  const out = toFloat32(await ref.download(r.output));
  for (const t of [q, k, v, r.output]) t.dispose();
  return out;
}

export function maxAbsDiff(a: ArrayLike<number>, b: ArrayLike<number>): number {
  if (a.length !== b.length) throw new Error(`lengths differ: ${a.length} vs ${b.length}`);
  let e = 0;
  for (let i = 0; i < a.length; i++) e = Math.max(e, Math.abs(a[i] - b[i]));
  return e;
}

/** CRISP with 64-token blocks and budgets, so 1k-token test sequences get sparse plans. */
export const smallCrisp: Policy = Object.freeze({
  ...crisp,
  name: 'crisp-64',
  blockSize: 64,
  router: cStruct({ tauProxy: 0.2, wSink: 64, wLocal: 64 }),
  kMin: 64,
  vs: noiseFloor({ alpha: 1.0, kMin: 64 }),
  pe: globalCoverage({ gamma: 0.95, kMin: 64 }),
});

/** The CrispError code a call ends with (undefined when it succeeds). */
export async function code(f: () => unknown): Promise<string | undefined> {
  try {
    await f();
  } catch (e) {
    return (e as { code?: string }).code ?? `not a CrispError: ${String(e)}`;
  }
  return undefined;
}

/** TF.js on its pure-JS cpu backend. */
export async function startTfCpu(): Promise<void> {
  await import('@tensorflow/tfjs-backend-cpu');
  await tf.setBackend('cpu');
  await tf.ready();
}

/**
 * TF.js on tfjs-backend-webgpu over Dawn (Node has no navigator.gpu: Dawn's is put there
 * before the backend registers). Resolves with the reason when there is no adapter.
 */
export async function startTfWebGpu(): Promise<string | undefined> {
  const { webgpuAvailability } = await import('@crisp/kernels-webgpu/node');
  const a = await webgpuAvailability();
  if (!a.available) return a.reason ?? 'no WebGPU adapter';
  const dawn = await import('webgpu');
  Object.assign(globalThis, dawn.globals);
  const gpu = dawn.create([]);
  keep.push(gpu);
  Object.defineProperty(globalThis, 'navigator', { value: { gpu }, configurable: true });
  await import('@tensorflow/tfjs-backend-webgpu');
  if (!(await tf.setBackend('webgpu'))) return 'tfjs-backend-webgpu did not start';
  await tf.ready();
  return undefined;
}
/** (dawn.node frees an instance reachable only through its device) */
const keep: unknown[] = [];
