/** The backend's options, its selectable attention kernels, and what it reports about its device. */
import type { DeviceLimits } from './runtime/gpu-context.js';

/**
 * Measured by crisp-bench on one NVIDIA H200 (Dawn over Vulkan, H = 32, Hkv = 8, d = 128,
 * f16, the llama fill; apps/bench/results/nvidia-h200/bench.md, commit de95cb5): CRISP end
 * to end against the dense kernel: 21.8 vs 21.6 ms at 8k (dense wins by 1%), 50.1 vs 82.6 ms
 * at 16k; the log-n interpolation of the ratio crosses 1 at 8,262 keys.
 */
export const H200_SPARSE_CROSSOVER = 8262;

/**
 * The selectable attention kernels; see WebGpuBackendOptions.attentionKernel. 'fma' is the
 * default; 'subgroup-matrix' is EXPERIMENTAL.
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
  /** Override the measured length gate (keys below which dense is faster). */
  readonly sparseCrossover?: number;
  /**
   * Upper bound on the multiply-adds one dispatch may hold (default 2^38, ~ 20-80 ms on a
   * large GPU): longer attention is split across heads and query tiles so no GPU watchdog
   * loses the device.
   */
  readonly maxDispatchWork?: number;
  /**
   * Attention kernel (dense and block-sparse use the same one).
   * - 'fma' (default): FMA flash attention (src/kernels/attention/fma.ts), f16 and f32,
   *   32 KiB of workgroup memory. On one H200: 25.8 / 26.8 / 27.1 / 26.8 TFLOP/s dense at
   *   8k / 16k / 32k / 64k (f16, H = 32, Hkv = 8, d = 128); @crisp/conformance passes with
   *   it there at n = 4000 and 65536.
   * - 'subgroup-matrix': EXPERIMENTAL tensor-core kernel for f16
   *   (src/kernels/attention/subgroup-matrix.ts) when the adapter offers
   *   chromium-experimental-subgroup-matrix (16 x 16 x 16 f16 -> f32, 32-wide subgroups),
   *   `subgroups`, and 41 KiB of workgroup memory. It matches float64 on the H200 but runs at
   *   6.7-7.3 TFLOP/s there, a quarter of 'fma'. f32 tensors, ineligible adapters or a failed
   *   build use 'fma' (`kernelNote` says why a build failed).
   */
  readonly attentionKernel?: AttentionKernel;
  /**
   * Rolled-loop WGSL (same arithmetic, far less code). Default: on for CPU adapters
   * (SwiftShader, fallback adapters), where pipeline compilation dominates; off on GPUs, where
   * the unrolled kernels were measured.
   */
  readonly compactKernels?: boolean;
}

export interface WebGpuInfo {
  readonly vendor: string;
  readonly architecture: string;
  readonly description: string;
  readonly features: readonly string[];
  readonly limits: DeviceLimits;
}
