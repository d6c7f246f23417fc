/**
 * Test helpers (not exported): TF.js started on its cpu or webgpu backend (Dawn in Node),
 * the seeded inputs of test-inputs.ts as tensors, and the float64 reference on the same values.
 */
import { type Backend, type BlockMask, hostTensor, toFloat32 } from '@crisp/core';
import { createReferenceBackend } from '@crisp/reference';
import * as tf from '@tensorflow/tfjs-core';
import { type Sizes, values } from './test-inputs.js';

export { tf };
export { type Sizes, smallCrisp, values } from './test-inputs.js';

export function freshSeed(): number {
  return Number(process.env.CRISP_SEED ?? Math.floor(Math.random() * 2 ** 31));
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

/** `b` seen as a backend that stores bf16 and f16 only (as CUDA does). */
export function sixteenBitOnly(b: Backend): Backend {
  return new Proxy(b, {
    get(t, p) {
      if (p === 'capabilities') return { ...t.capabilities, dtypes: ['bf16', 'f16'] };
      const x = Reflect.get(t, p);
      return typeof x === 'function' ? x.bind(t) : x;
    },
  });
}
