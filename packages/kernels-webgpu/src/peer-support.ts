/**
 * What the WebGPU peers (tfjs-peer.ts, ort-peer.ts) share: the WebGPU entry point they start
 * from (navigator.gpu, else Dawn from the `webgpu` package with its globals installed),
 * navigator.gpu lent to a library while it starts, the argument check, and the timing summary.
 * Not an entry of the package; each peer entry bundles it.
 */
import { CrispError } from '@crisp/core';

/**
 * Dawn instances and devices the peers make stay referenced for the process (dawn.node 0.6.2
 * crashed when a GPU object was reachable only through its device; see node.ts).
 */
const keep: unknown[] = [];

export function keepAlive(x: unknown): void {
  keep.push(x);
}

export const errText = (e: unknown): string => (e instanceof Error ? e.message : String(e));

/**
 * The WebGPU entry point: `given`, else navigator.gpu, else Dawn. In Node the libraries read
 * GPUBufferUsage, GPUDevice & co. from globalThis, so Dawn's globals are installed whenever
 * they are missing. A string says why there is none.
 */
export async function webgpuEntry(given: GPU | undefined): Promise<GPU | string> {
  const nav = (globalThis as { navigator?: { gpu?: GPU } }).navigator;
  let gpu = given ?? nav?.gpu;
  if (typeof (globalThis as { GPUBufferUsage?: unknown }).GPUBufferUsage === 'undefined' || !gpu) {
    try {
      const pkg = 'webgpu';
      const dawn = (await import(/* @vite-ignore */ pkg)) as typeof import('webgpu');
      Object.assign(globalThis, dawn.globals);
      if (!gpu) {
        gpu = dawn.create(['enable-dawn-features=allow_unsafe_apis,vulkan_enable_f16_on_nvidia']);
        keepAlive(gpu);
      }
    } catch (e) {
      if (!gpu) return `no navigator.gpu and the webgpu package (Dawn) did not load: ${errText(e)}`;
    }
  }
  return gpu ?? 'no WebGPU entry point';
}

/**
 * navigator.gpu is `gpu` while `f` runs, then as it was (callers' own navigator checks stay
 * honest): for libraries that look for navigator.gpu when they start (tfjs-backend-webgpu
 * when it is imported, ONNX Runtime Web when its WebGPU backend starts).
 */
export async function withNavigatorGpu<T>(gpu: GPU, f: () => Promise<T>): Promise<T> {
  const g = globalThis as { navigator?: { gpu?: GPU } };
  const navDesc = Object.getOwnPropertyDescriptor(globalThis, 'navigator');
  const nav = g.navigator;
  const gpuDesc = nav ? Object.getOwnPropertyDescriptor(nav, 'gpu') : undefined;
  const swapNav = !nav;
  const swapGpu = !!nav && nav.gpu !== gpu;
  if (swapNav) Object.defineProperty(globalThis, 'navigator', { value: { gpu }, configurable: true });
  if (swapGpu) Object.defineProperty(nav, 'gpu', { value: gpu, configurable: true });
  try {
    return await f();
  } finally {
    if (swapNav) {
      if (navDesc) Object.defineProperty(globalThis, 'navigator', navDesc);
      else delete g.navigator;
    }
    if (swapGpu && nav) {
      if (gpuDesc) Object.defineProperty(nav, 'gpu', gpuDesc);
      else delete nav.gpu;
    }
  }
}

/** `x` as an integer >= min, else CrispError INVALID_ARGUMENT naming the function and the argument. */
export function positiveInt(fn: string, name: string, x: unknown, min = 1): number {
  if (typeof x !== 'number' || !Number.isInteger(x) || x < min) {
    throw new CrispError('INVALID_ARGUMENT', `${fn}: ${name} must be an integer >= ${min}, got ${String(x)}`);
  }
  return x;
}

/** `x` as a finite number >= 0, else CrispError INVALID_ARGUMENT naming the function and the argument. */
export function nonNegativeMs(fn: string, name: string, x: unknown): number {
  if (typeof x !== 'number' || !Number.isFinite(x) || x < 0) {
    throw new CrispError('INVALID_ARGUMENT', `${fn}: ${name} must be a finite number of milliseconds >= 0, got ${String(x)}`);
  }
  return x;
}

/**
 * The untimed runs before the timed ones: `warmup` of them, then more until `warmMs` have
 * passed (checked before each). crisp-bench warms CRISP's own kernels up the same way, so a peer
 * and CRISP are timed at the clock the GPU holds under load, not at the one of its first runs
 * after idle. Returns how many ran.
 */
export async function warmUp(run: () => Promise<unknown>, warmup: number, warmMs: number): Promise<number> {
  let count = 0;
  for (; count < warmup; count++) await run();
  for (const t0 = performance.now(); warmMs > 0 && performance.now() - t0 < warmMs; count++) await run();
  return count;
}

export interface PeerTimes {
  readonly medianMs: number;
  readonly minMs: number;
  readonly maxMs: number;
  /** every timed run, ms */
  readonly runs: number[];
  /** 4·d·H·n(n+1)/2 causal flops per ms median, in TFLOP/s */
  readonly tflops: number;
  /** untimed runs before the timed ones (`warmup`, and those `warmMs` added) */
  readonly warmupRuns: number;
}

/** Median, range and causal-attention TFLOP/s of timed runs at sequence length n. */
export function peerTimes(runs: number[], n: number, heads: number, headDim: number, warmupRuns: number): PeerTimes {
  const sorted = [...runs].sort((a, b) => a - b);
  const mid = sorted.length >> 1;
  const medianMs = sorted.length % 2 ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2;
  return {
    medianMs,
    minMs: sorted[0],
    maxMs: sorted[sorted.length - 1],
    runs,
    tflops: (4 * headDim * heads * ((n * (n + 1)) / 2)) / medianMs / 1e9,
    warmupRuns,
  };
}
