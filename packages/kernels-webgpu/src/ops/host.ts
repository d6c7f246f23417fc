/**
 * What an operation's host side needs from its backend. WebGpuBackend supplies one; each
 * file in src/ops/ is one operation written against it.
 */
import type { BackendCapabilities, DType, DeviceTensor } from '@crisp/core';
import type { StorageDType } from '../kernels/common.js';
import type { GpuContext } from '../runtime/gpu-context.js';
import type { WebGpuTensor } from '../runtime/tensor.js';

export interface OpHost {
  readonly name: string;
  readonly gpu: GpuContext;
  readonly capabilities: BackendCapabilities;
  /** Upper bound on the multiply-adds of one dispatch (WebGpuBackendOptions.maxDispatchWork). */
  readonly maxWork: number;
  /** Where a device plan cuts the PE heads' maps (WebGpuBackendOptions.peCut). */
  readonly peCut: 'device' | 'host';
  /** Throw if the backend was disposed, the device is lost or an asynchronous error is pending. */
  alive(): void;
  /** `t` as one of this backend's tensors (WRONG_BACKEND or DISPOSED otherwise). */
  own(t: DeviceTensor, what: string): WebGpuTensor;
  /** A new tensor of this backend (LIMIT_EXCEEDED past maxBufferSize). */
  newTensor(dtype: DType, shape: readonly number[]): WebGpuTensor;
  /** A tensor of this backend over someone else's buffer (not destroyed on dispose). */
  wrapTensor(buffer: GPUBuffer, dtype: DType, shape: readonly number[], byteLength: number): WebGpuTensor;
  /** The attention pipeline for this dtype and head dim (the backend's kernel choice). */
  attentionPipeline(dtype: StorageDType, D: number): Promise<GPUComputePipeline>;
  /** The varlen (ragged batch) form of the FMA attention kernel for this dtype and head dim. */
  varlenPipeline(dtype: StorageDType, D: number): Promise<GPUComputePipeline>;
}
