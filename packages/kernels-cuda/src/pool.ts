/**
 * A simple device-memory pool: freed blocks go to a free list keyed by their rounded size
 * and are handed out again before the driver is asked for more. Every kernel runs on one
 * stream, so a block released after a launch can be reused by the next launch safely
 * (stream order). On CUDA_ERROR_OUT_OF_MEMORY the pool is emptied and the allocation
 * retried once.
 */
import { CrispError } from '@crisp/core';
import { type CudaLibs, check } from './ffi.js';

export interface DeviceBlock {
  readonly ptr: number;
  readonly size: number;
}

/** Round so that repeated runs of one shape hit the same size class. */
export function sizeClass(bytes: number): number {
  const b = Math.max(256, bytes);
  if (b <= 1 << 20) return Math.ceil(b / 256) * 256;
  return Math.ceil(b / (2 << 20)) * (2 << 20);
}

export class DevicePool {
  readonly #libs: CudaLibs;
  readonly #free = new Map<number, number[]>();
  #pooledBytes = 0;
  #liveBytes = 0;

  constructor(libs: CudaLibs) {
    this.#libs = libs;
  }

  get pooledBytes(): number {
    return this.#pooledBytes;
  }
  get liveBytes(): number {
    return this.#liveBytes;
  }

  alloc(bytes: number): DeviceBlock {
    const size = sizeClass(bytes);
    const list = this.#free.get(size);
    if (list && list.length > 0) {
      const ptr = list.pop() as number;
      this.#pooledBytes -= size;
      this.#liveBytes += size;
      return { ptr, size };
    }
    const out = [0];
    let r = this.#libs.cu.cuMemAlloc(out, size);
    if (r === 2) {
      this.trim();
      r = this.#libs.cu.cuMemAlloc(out, size);
    }
    try {
      check(this.#libs, r, `cuMemAlloc(${size} bytes)`);
    } catch (e) {
      if (e instanceof CrispError && e.code === 'OUT_OF_MEMORY') {
        throw new CrispError(
          'OUT_OF_MEMORY',
          `${e.message} (${(this.#liveBytes / 2 ** 30).toFixed(2)} GiB held by live CRISP tensors)`,
          e.details,
        );
      }
      throw e;
    }
    this.#liveBytes += size;
    return { ptr: Number(out[0]), size };
  }

  release(block: DeviceBlock): void {
    let list = this.#free.get(block.size);
    if (!list) {
      list = [];
      this.#free.set(block.size, list);
    }
    list.push(block.ptr);
    this.#pooledBytes += block.size;
    this.#liveBytes -= block.size;
  }

  /** Give every pooled block back to the driver. */
  trim(): void {
    // queued kernels may still read blocks released after their launch
    this.#libs.cu.cuCtxSynchronize();
    for (const [, list] of this.#free) {
      for (const p of list) this.#libs.cu.cuMemFree(p);
    }
    this.#free.clear();
    this.#pooledBytes = 0;
  }
}
