/** Device tensors: one storage buffer each, padded to 16 bytes, destroyed once the queue drains. */
import { type DType, DeviceTensorBase, LimitError, bytesPerElement, numel } from '@crisp/core';
import { type GpuContext, Usage } from './gpu-context.js';

export class WebGpuTensor extends DeviceTensorBase {
  readonly backend = 'webgpu';
  /** The backend that made it (compared by identity only). */
  readonly owner: object;
  readonly buffer: GPUBuffer;
  readonly byteLength: number;
  readonly #gpu: GpuContext;
  constructor(gpu: GpuContext, owner: object, dtype: DType, shape: readonly number[], buffer: GPUBuffer, byteLength: number) {
    super(dtype, shape);
    this.#gpu = gpu;
    this.owner = owner;
    this.buffer = buffer;
    this.byteLength = byteLength;
  }
  protected release(): void {
    // Work already submitted may still read it: destroy once the queue drains.
    this.#gpu.retire(this.buffer);
  }
}

/** A new tensor on `gpu` owned by `owner`; LIMIT_EXCEEDED past the device's maxBufferSize. */
export function newTensor(gpu: GpuContext, owner: object, dtype: DType, shape: readonly number[]): WebGpuTensor {
  const bytes = numel(shape) * bytesPerElement(dtype);
  const padded = Math.max(16, Math.ceil(bytes / 16) * 16);
  if (padded > gpu.limits.maxBufferSize) {
    throw new LimitError(
      `a ${dtype} tensor of shape [${shape}] needs ${bytes} bytes; this device's maxBufferSize is ${gpu.limits.maxBufferSize}`,
      { limit: 'maxBufferSize', max: gpu.limits.maxBufferSize },
    );
  }
  const buf = gpu.createBuffer(padded, Usage.STORAGE | Usage.COPY_DST | Usage.COPY_SRC, `tensor[${shape}]`);
  return new WebGpuTensor(gpu, owner, dtype, shape, buf, bytes);
}
