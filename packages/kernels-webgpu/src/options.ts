/** The backend's options, its selectable attention kernels, and what it reports about its device. */
import { InvalidArgumentError, assertKnownKeys } from '@crisp/core';
import { SUBGROUP_MATRIX_FORMS, type SubgroupMatrixForm } from './kernels/attention/subgroup-matrix.js';
import type { DeviceLimits } from './runtime/gpu-context.js';

/**
 * The length gate with the FMA kernel (every adapter), from crisp-bench on one NVIDIA H100
 * (Dawn over Vulkan, `attentionKernel: 'fma'`, H = 32, Hkv = 8, d = 128, f16, the llama fill,
 * what a layer of the same shape needs again reused; apps/bench/results/nvidia-h100-webgpu-reuse/fma):
 * `crisp` against the dense kernel, 2.7 vs 1.9 ms at 2k, 5.4 vs 5.7 at 4k, 9.6 vs 12.4 at 6k and
 * 12.0 vs 21.4 at 8k; the log-n interpolation of the ratio crosses 1 at 3,677 keys, and the gate
 * is the first size measured with `crisp` ahead, 4,096. Before the reuse it was 8,262 (an H200,
 * apps/bench/results/nvidia-h200/bench.md: 21.8 vs 21.6 ms at 8k).
 */
export const FMA_SPARSE_CROSSOVER = 4096;

/**
 * @deprecated The FMA kernel's gate under its first name (it was first measured on an H200);
 * use FMA_SPARSE_CROSSOVER.
 */
export const H200_SPARSE_CROSSOVER = FMA_SPARSE_CROSSOVER;

/**
 * The length gate with the tensor-core kernel (its default `'pipelined'` form), the plan on
 * the device and what a layer of the same shape needs again reused (GpuContext), from
 * crisp-bench on one NVIDIA H100 (Dawn over Vulkan, H = 32, Hkv = 8, d = 128, f16, the llama
 * fill; apps/bench/results/nvidia-h100-webgpu-reuse): `crisp` against the dense kernel, 4.85
 * against 5.26 ms at 8k in one run (sparse already faster at the smallest size measured), and
 * in two more 4.6 against 5.5 and 5.1 ms at 8k, crossing 1 (log-n interpolation) at 7,206 and
 * 7,366 keys; the gate is 8,192, the first size every run measured `crisp` ahead. Before the
 * reuse the plan's host work (buffers, uniform writes, bind groups: 3.3-3.7 ms at 8k, as long
 * as its GPU work) put it at 9,749-13,242 keys.
 */
export const TENSOR_CORE_SPARSE_CROSSOVER = 8192;

/**
 * The selectable attention kernels; see WebGpuBackendOptions.attentionKernel. The default is
 * 'subgroup-matrix' (tensor cores) where the adapter offers it, else 'fma'.
 */
export type AttentionKernel = 'fma' | 'subgroup-matrix';
export const ATTENTION_KERNELS: readonly AttentionKernel[] = ['fma', 'subgroup-matrix'];
/** A kernel a backend actually runs (the option's kernel, or 'fma' where the other is not eligible). */
export type ActiveAttentionKernel = AttentionKernel;

export interface WebGpuBackendOptions {
  /** Use this device (its features and limits as they are). */
  readonly device?: GPUDevice;
  /** Request a device from this adapter (with its real limits and the optional features). */
  readonly adapter?: GPUAdapter;
  /** Request an adapter from this GPU object (default: navigator.gpu). */
  readonly gpu?: GPU;
  /**
   * Override the measured length gate (keys below which dense is faster). Default: the
   * tensor-core kernel's TENSOR_CORE_SPARSE_CROSSOVER while it is in use, else the FMA
   * kernel's FMA_SPARSE_CROSSOVER.
   */
  readonly sparseCrossover?: number;
  /**
   * Upper bound on the multiply-adds one dispatch may hold (default 2^38, ~ 20-80 ms on a
   * large GPU): longer attention is split across heads and query tiles so no GPU watchdog
   * loses the device.
   */
  readonly maxDispatchWork?: number;
  /**
   * Attention kernel (dense and block-sparse use the same one).
   * - 'subgroup-matrix' (default): the tensor-core kernel for f16 at head dims 64 and 128
   *   (src/kernels/attention/subgroup-matrix.ts) where the adapter offers
   *   chromium-experimental-subgroup-matrix (16 x 16 x 16 f16 -> f32, 32-wide subgroups),
   *   `subgroups`, and the workgroup memory of its form (44 KiB at d = 128):
   *   NVIDIA GPUs through Dawn with the flags of @crisp/kernels-webgpu/node, or a browser
   *   that exposes the experimental feature. On one H100: 99-117 TFLOP/s dense at 8k-64k
   *   (f16, H = 32, Hkv = 8, d = 128), about 4x 'fma'; @crisp/conformance passes with it at
   *   n = 4000 and at the CI sizes (chunked prefill, varlen). f32 tensors, other head dims, ineligible adapters (every browser by default)
   *   or a failed build use 'fma' (`kernelNote` says why a build failed). Where it runs, the
   *   proxy statistics' two passes over every key (`proxyStats`) compute their score tiles on
   *   tensor cores too (`statisticsKernelFor`); with 'fma' they use the FMA tile.
   * - 'fma': FMA flash attention (src/kernels/attention/fma.ts), f16 and f32, any head dim
   *   that is a multiple of 4, 32 KiB of workgroup memory, every adapter. On one H200: 25.8 /
   *   26.8 / 27.1 / 26.8 TFLOP/s dense at 8k / 16k / 32k / 64k; @crisp/conformance passes with
   *   it there at n = 4000 and 65536.
   */
  readonly attentionKernel?: AttentionKernel;
  /**
   * The form of the 'subgroup-matrix' kernel (default 'pipelined'): 'pipelined' (K and V
   * tiles in workgroup memory, the next K tile loaded during this one), 'staged' (the same
   * without the next tile's loads), 'direct' (K and V fragments from storage), or 'two-pass'
   * (the first form, S computed twice), for measuring them side by side. See PERFORMANCE.md.
   */
  readonly subgroupMatrixForm?: SubgroupMatrixForm;
  /**
   * Rolled-loop WGSL (same arithmetic, far less code). Default: on for CPU adapters
   * (SwiftShader, fallback adapters), where pipeline compilation dominates; off on GPUs, where
   * the unrolled kernels were measured.
   */
  readonly compactKernels?: boolean;
  /**
   * Where a device plan cuts its PE heads' pooled maps to γ: 'device' (default; nothing is
   * read back before the attention, at the cost of every head's map and a rows buffer of
   * the same size on the device, 2 · H · Nb (Nb + 1) / 2 · 4 bytes: 134 MB at 128k for
   * H = 32) or 'host' (the routes and the PE heads' maps read back and cut on the host).
   * The two keep the same blocks. 'device' falls back to the host where the maps do not fit
   * one binding (or 1 GiB).
   */
  readonly peCut?: 'device' | 'host';
}

export interface WebGpuInfo {
  readonly vendor: string;
  readonly architecture: string;
  readonly description: string;
  readonly features: readonly string[];
  readonly limits: DeviceLimits;
}

const OPTION_KEYS = [
  'device',
  'adapter',
  'gpu',
  'sparseCrossover',
  'maxDispatchWork',
  'attentionKernel',
  'subgroupMatrixForm',
  'compactKernels',
  'peCut',
] as const;

function describe(x: unknown): string {
  if (x === null) return 'null';
  if (typeof x === 'string') return JSON.stringify(x);
  if (typeof x === 'object') return `an object (${Object.keys(x as object).slice(0, 5).join(', ') || 'no keys'})`;
  return `${typeof x} ${String(x)}`;
}

function hasMethods(x: unknown, names: readonly string[]): boolean {
  return typeof x === 'object' && x !== null && names.every((n) => typeof (x as Record<string, unknown>)[n] === 'function');
}

/** Methods this backend calls on a device, an adapter and a GPU object. */
const DEVICE_METHODS = ['createBuffer', 'createCommandEncoder', 'createShaderModule', 'createComputePipeline', 'createBindGroup', 'pushErrorScope', 'popErrorScope', 'destroy'];

/** True when `d` has what this backend uses of a GPUDevice (WebGPU has no reliable brand check across realms). */
export function looksLikeDevice(d: unknown): d is GPUDevice {
  const dev = d as GPUDevice;
  return (
    hasMethods(d, DEVICE_METHODS) &&
    hasMethods(dev.queue, ['submit', 'writeBuffer', 'onSubmittedWorkDone']) &&
    typeof dev.limits === 'object' &&
    dev.limits !== null &&
    hasMethods(dev.features, ['has']) &&
    typeof (dev.features as unknown as Iterable<unknown>)[Symbol.iterator] === 'function' &&
    typeof (dev.lost as Promise<unknown> | undefined)?.then === 'function'
  );
}

/**
 * Every option checked before any adapter or device is touched: INVALID_ARGUMENT naming the
 * option, what it got and what it takes. `extra` lists further keys a caller accepts.
 */
export function checkOptions(opts: unknown, entry = 'createWebGpuBackend', extra: readonly string[] = []): asserts opts is WebGpuBackendOptions {
  if (opts === null || typeof opts !== 'object' || Array.isArray(opts)) {
    throw new InvalidArgumentError(`${entry} takes an options object (or nothing); got ${describe(opts)}`);
  }
  const o = opts as Record<string, unknown>;
  const known = [...OPTION_KEYS, ...extra];
  assertKnownKeys(o, known, entry, 'option');
  if (o.device !== undefined && !looksLikeDevice(o.device)) {
    throw new InvalidArgumentError(`device must be a GPUDevice (from adapter.requestDevice()); got ${describe(o.device)}`);
  }
  if (o.adapter !== undefined && !(hasMethods(o.adapter, ['requestDevice']) && hasMethods((o.adapter as GPUAdapter).features, ['has']) && typeof (o.adapter as GPUAdapter).limits === 'object')) {
    throw new InvalidArgumentError(`adapter must be a GPUAdapter (from gpu.requestAdapter()); got ${describe(o.adapter)}`);
  }
  if (o.device !== undefined && o.adapter !== undefined) {
    throw new InvalidArgumentError('pass either device (used as is) or adapter (a device is requested from it), not both');
  }
  if (o.gpu !== undefined && !hasMethods(o.gpu, ['requestAdapter'])) {
    throw new InvalidArgumentError(`gpu must be a GPU object (navigator.gpu, or create() of the webgpu package); got ${describe(o.gpu)}`);
  }
  if (o.sparseCrossover !== undefined && (typeof o.sparseCrossover !== 'number' || !(o.sparseCrossover >= 0))) {
    throw new InvalidArgumentError(
      `sparseCrossover must be a non-negative number of keys (Infinity: always dense); got ${describe(o.sparseCrossover)}`,
    );
  }
  if (o.maxDispatchWork !== undefined && (typeof o.maxDispatchWork !== 'number' || !(o.maxDispatchWork > 0))) {
    throw new InvalidArgumentError(
      `maxDispatchWork must be a positive number of multiply-adds (default 2^38); got ${describe(o.maxDispatchWork)}`,
    );
  }
  if (o.attentionKernel !== undefined && !ATTENTION_KERNELS.includes(o.attentionKernel as AttentionKernel)) {
    throw new InvalidArgumentError(`attentionKernel must be one of ${ATTENTION_KERNELS.join(', ')}; got ${describe(o.attentionKernel)}`);
  }
  if (o.subgroupMatrixForm !== undefined && !SUBGROUP_MATRIX_FORMS.includes(o.subgroupMatrixForm as SubgroupMatrixForm)) {
    throw new InvalidArgumentError(`subgroupMatrixForm must be one of ${SUBGROUP_MATRIX_FORMS.join(', ')}; got ${describe(o.subgroupMatrixForm)}`);
  }
  if (o.compactKernels !== undefined && typeof o.compactKernels !== 'boolean') {
    throw new InvalidArgumentError(`compactKernels must be true or false; got ${describe(o.compactKernels)}`);
  }
  if (o.peCut !== undefined && o.peCut !== 'device' && o.peCut !== 'host') {
    throw new InvalidArgumentError(`peCut must be 'device' or 'host'; got ${describe(o.peCut)}`);
  }
}
