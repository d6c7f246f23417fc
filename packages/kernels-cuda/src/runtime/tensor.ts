import { type DType, DeviceTensorBase, type MemoryRange } from '@crisp/core';
import type { DeviceBlock } from './pool.js';

/** What a tensor's memory goes back to (the backend's context; a no-op after dispose). */
export interface BlockOwner {
  releaseBlock(b: DeviceBlock): void;
}

export class CudaTensor extends DeviceTensorBase {
  readonly backend = 'cuda';
  readonly ptr: number;
  readonly bytes: number;
  readonly #owner: BlockOwner;
  readonly #block: DeviceBlock;
  /** the tensor whose memory a row slice shares (sliceRows); undefined for a tensor that owns its block */
  readonly #parent: CudaTensor | undefined;
  constructor(owner: BlockOwner, dtype: DType, shape: readonly number[], block: DeviceBlock, bytes: number, parent?: CudaTensor) {
    super(dtype, shape);
    this.#owner = owner;
    this.#block = block;
    this.#parent = parent;
    this.ptr = block.ptr;
    this.bytes = bytes;
  }
  /** a slice is disposed with its parent (its memory is the parent's) */
  override get disposed(): boolean {
    return super.disposed || (this.#parent?.disposed ?? false);
  }
  protected release(): void {
    // a slice frees nothing: the block is its parent's
    if (!this.#parent) this.#owner.releaseBlock(this.#block);
  }
  /**
   * Rows [start, start + rows) along the first axis, sharing this tensor's memory (no copy).
   * A slice of a tensor already found finite starts out checked.
   */
  sliceRows(start: number, rows: number, rowElements: number, elementBytes: number): CudaTensor {
    const bytes = rows * rowElements * elementBytes;
    const block = { ptr: this.ptr + start * rowElements * elementBytes, size: bytes };
    const t = new CudaTensor(this.#owner, this.dtype, [rows, ...this.shape.slice(1)], block, bytes, this);
    if (this.checkedFinite) t.setCheckedFinite();
    return t;
  }
  /**
   * Its bytes in the device's address space: [ptr, ptr + bytes) of its context's memory. A
   * row slice lies inside its parent's range.
   */
  get memoryRange(): MemoryRange {
    return { resource: this.#owner, start: this.ptr, end: this.ptr + this.bytes };
  }
  /** @internal the backend context whose memory this is (a tensor runs on that backend only) */
  get owner(): BlockOwner {
    return this.#owner;
  }
  /** bumped by every write through the backend; the NaN/Inf check is cached per version */
  #version = 0;
  /** the version last found finite, or -1 */
  #finiteAt = -1;
  /**
   * Call after writing this tensor's memory yourself (through `ptr`, outside this backend):
   * the backend checks inputs for NaN/Inf once per version and would otherwise trust the
   * previous check.
   */
  markWritten(): void {
    this.#version++;
  }
  /** @internal the write version (markWritten and the backend's writes bump it) */
  get version(): number {
    return this.#version;
  }
  /** @internal */
  get checkedFinite(): boolean {
    return this.#finiteAt === this.#version;
  }
  /** @internal */
  setCheckedFinite(): void {
    this.#finiteAt = this.#version;
  }
}
