/**
 * Device tensors: one storage buffer each, padded to 16 bytes, destroyed once the queue
 * drains; or a view of rows of another tensor's buffer (sliceRows) at an aligned offset,
 * which its parent owns.
 */
import { type CrispError, type DType, DeviceTensorBase, LimitError, type MemoryRange, bytesPerElement, numel } from '@crisp/core';
import { type Check, type GpuContext, Usage } from './gpu-context.js';

export class WebGpuTensor extends DeviceTensorBase {
  readonly backend = 'webgpu';
  /** The backend that made it (compared by identity only). */
  readonly owner: object;
  readonly buffer: GPUBuffer;
  readonly byteLength: number;
  /** where the tensor starts in `buffer` (bytes; 0 except for a view made by sliceRows) */
  readonly byteOffset: number;
  readonly #gpu: GpuContext;
  /** a buffer someone else made and frees (wrapBuffer): dispose() leaves it alone */
  readonly borrowed: boolean;
  /** verdicts of the allocation and the writes not yet looked at */
  readonly #pending: Check[] = [];
  #settling: Promise<void> | undefined;
  /** set when the allocation or a write failed: the contents are undefined from then on */
  #failure: CrispError | undefined;
  #sliceCopy = false;
  constructor(gpu: GpuContext, owner: object, dtype: DType, shape: readonly number[], buffer: GPUBuffer, byteLength: number, borrowed = false, byteOffset = 0) {
    super(dtype, shape);
    this.byteOffset = byteOffset;
    this.#gpu = gpu;
    this.borrowed = borrowed;
    this.owner = owner;
    this.buffer = buffer;
    this.byteLength = byteLength;
  }

  /**
   * The binding of this tensor's bytes (rounded up to 16 inside the buffer): what every
   * dispatch binds, so a view is read at its own offset.
   */
  get binding(): GPUBufferBinding {
    if (this.byteOffset === 0) return { buffer: this.buffer };
    const size = Math.min(Math.ceil(this.byteLength / 16) * 16, this.buffer.size - this.byteOffset);
    return { buffer: this.buffer, offset: this.byteOffset, size };
  }

  /**
   * This tensor's bytes in `buffer`, marked `wholeResource`: WebGPU refuses a dispatch that
   * writes a buffer it also binds for reading, wherever the bytes lie, so an output conflicts
   * with every input in its buffer.
   */
  get memoryRange(): MemoryRange {
    return { resource: this.buffer, start: this.byteOffset, end: this.byteOffset + this.byteLength, wholeResource: true };
  }

  /**
   * Made by sliceRows as a copy of its parent's rows (they did not start at an aligned
   * offset): refused as an attention's `out` and as `write`'s target, since what is written
   * to it would not reach the parent, as it does through a view.
   */
  get sliceCopy(): boolean {
    return this.#sliceCopy;
  }

  /** @internal Mark this tensor as sliceRows' copy of rows (never undone). */
  markSliceCopy(): this {
    this.#sliceCopy = true;
    return this;
  }

  /** Where the verdicts of this tensor's allocation and writes go (GpuContext.scoped). */
  get checks(): Check[] {
    return this.#pending;
  }

  /** Why this tensor is unusable (its allocation or a write failed), if it is. */
  get failure(): CrispError | undefined {
    return this.#failure;
  }

  /**
   * Resolves once the allocation and writes so far are known good; rejects with their
   * error (OUT_OF_MEMORY, BACKEND_ERROR), and with it on every later call.
   */
  settle(): Promise<void> {
    if (this.#failure) return Promise.reject(this.#failure);
    if (this.#pending.length === 0 && this.#settling === undefined) return Promise.resolve();
    const batch = this.#pending.splice(0);
    const prev = this.#settling;
    const p = (async () => {
      await prev;
      const e = await this.#gpu.verdict(batch);
      if (e) {
        this.#failure = e;
        throw e;
      }
    })();
    this.#settling = p;
    const clear = () => {
      if (this.#settling === p) this.#settling = undefined;
    };
    p.then(clear, clear);
    return p;
  }

  protected release(): void {
    if (this.borrowed) return;
    // Work already submitted may still read it: destroy once the queue drains.
    this.#gpu.retire(this.buffer);
  }
}

/**
 * A new tensor on `gpu` owned by `owner`; LIMIT_EXCEEDED past the device's maxBufferSize
 * before anything is allocated. An out-of-memory allocation surfaces at the tensor's first
 * use (settle()).
 */
export function newTensor(gpu: GpuContext, owner: object, dtype: DType, shape: readonly number[]): WebGpuTensor {
  const bytes = numel(shape) * bytesPerElement(dtype);
  const padded = Math.max(16, Math.ceil(bytes / 16) * 16);
  if (!(padded <= gpu.limits.maxBufferSize)) {
    throw new LimitError(
      `a ${dtype} tensor of shape [${shape}] needs ${bytes} bytes; this device's maxBufferSize is ${gpu.limits.maxBufferSize}. Use a shorter sequence or fewer heads, or a device with a larger limit`,
      { limit: 'maxBufferSize', max: gpu.limits.maxBufferSize, bytes },
    );
  }
  const checks: Check[] = [];
  const label = `tensor[${shape}]`;
  const buf = gpu.scoped(checks, `a ${dtype} tensor of shape [${shape}] (${bytes} bytes)`, () =>
    gpu.createBuffer(padded, Usage.STORAGE | Usage.COPY_DST | Usage.COPY_SRC, label),
  );
  const t = new WebGpuTensor(gpu, owner, dtype, shape, buf, bytes);
  t.checks.push(...checks);
  return t;
}
