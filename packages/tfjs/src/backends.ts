/**
 * Which CRISP backend serves a call, and the ones this package made (kept for the process,
 * released by disposeCrispBackends()).
 *
 * - Tensors on tfjs-backend-webgpu: CRISP's WebGPU backend on TF.js's own GPUDevice, one per
 *   device (the zero-copy path).
 * - Anywhere else: the host path, to CUDA in Node when a driver is there, else the float64
 *   reference.
 */
import { type Backend, CrispError } from '@crisp/core';
import { type WebGpuBackend, createWebGpuBackend } from '@crisp/kernels-webgpu';
import { createReferenceBackend } from '@crisp/reference';

export type BackendChoice = 'auto' | 'webgpu' | 'cuda' | 'reference';
export const BACKEND_CHOICES: readonly BackendChoice[] = ['auto', 'webgpu', 'cuda', 'reference'];

const onDevice = new Map<GPUDevice, Promise<WebGpuBackend>>();
let cuda: Promise<Backend | string> | undefined;
let reference: Backend | undefined;

/** CRISP's WebGPU backend on this device (made once per device; the device stays TF.js's). */
export function webgpuBackendOn(device: GPUDevice): Promise<WebGpuBackend> {
  const known = onDevice.get(device);
  if (known) return known;
  const b = createWebGpuBackend({ device });
  onDevice.set(device, b);
  // a failed start is not cached: a later call tries again and says why again
  b.catch(() => onDevice.delete(device));
  return b;
}

/** The CUDA backend, or why there is none (cached either way: driver facts do not change). */
export function cudaBackend(): Promise<Backend | string> {
  cuda ??= (async () => {
    try {
      // (a variable specifier: browser bundlers leave the Node-only package alone)
      const pkg = '@crisp/kernels-cuda';
      const m = (await import(/* @vite-ignore */ pkg)) as typeof import('@crisp/kernels-cuda');
      return await m.createCudaBackend();
    } catch (e) {
      return `CUDA: ${e instanceof Error ? e.message : String(e)}`;
    }
  })();
  return cuda;
}

export function referenceBackend(): Backend {
  reference ??= createReferenceBackend();
  return reference;
}

/** The backend of the host path for this choice (CUDA, else the reference, for 'auto'). */
export async function hostPathBackend(choice: Exclude<BackendChoice, 'webgpu'>): Promise<Backend> {
  if (choice === 'reference') return referenceBackend();
  const c = await cudaBackend();
  if (typeof c !== 'string') return c;
  if (choice === 'cuda') throw new CrispError('BACKEND_UNAVAILABLE', `crispAttention: backend 'cuda' asked for but ${c}`);
  return referenceBackend();
}

/** Release every backend this package made (TF.js's device stays alive). */
export async function disposeCrispBackends(): Promise<void> {
  // Every cache is emptied before the first await, so a call made while this one settles (it
  // need not be awaited) makes fresh backends, which it leaves alone.
  const made = [...onDevice.values()];
  onDevice.clear();
  const c = cuda;
  cuda = undefined;
  const ref = reference;
  reference = undefined;
  ref?.dispose();
  for (const b of made) (await b.catch(() => undefined))?.dispose();
  const cb = await c;
  if (cb && typeof cb !== 'string') cb.dispose();
}
