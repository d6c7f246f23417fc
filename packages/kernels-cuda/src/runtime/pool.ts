/**
 * A simple device-memory pool: freed blocks go to a free list keyed by their rounded size
 * and are handed out again before the driver is asked for more. Every kernel runs on one
 * stream, so a block released after a launch can be reused by the next launch safely
 * (stream order). On CUDA_ERROR_OUT_OF_MEMORY the pool is emptied and the allocation
 * retried once; a request beyond the device's whole memory fails at once (no driver call,
 * the pool kept).
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
  /** the device's total memory: no request above it reaches the driver */
  readonly #limit: number;
  readonly #free = new Map<number, number[]>();
  #pooledBytes = 0;
  #liveBytes = 0;
  #misses = 0;
  /** slabs carved by allocBatch: base pointer -> the children's pointers and size class */
  readonly #slabs = new Map<number, { size: number; children: number[] }>();
  /** every driver allocation not freed yet (freeAll frees them on dispose, live tensors' too) */
  readonly #owned = new Set<number>();

  constructor(libs: CudaLibs, limit = Number.MAX_SAFE_INTEGER) {
    this.#libs = libs;
    this.#limit = limit;
  }

  get pooledBytes(): number {
    return this.#pooledBytes;
  }
  get liveBytes(): number {
    return this.#liveBytes;
  }
  /** allocations the free lists could not serve (each a cuMemAlloc) */
  get misses(): number {
    return this.#misses;
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
    const ptr = this.#driverAlloc(size);
    this.#liveBytes += size;
    return { ptr, size };
  }

  /** A fresh driver allocation of `size` bytes (one retry after emptying the pool). */
  #driverAlloc(size: number): number {
    if (!(Number.isSafeInteger(size) && size <= this.#limit)) {
      throw new CrispError(
        'OUT_OF_MEMORY',
        `a device buffer of ${(size / 2 ** 30).toFixed(2)} GiB is larger than the device's ${(this.#limit / 2 ** 30).toFixed(2)} GiB; use a shorter sequence or fewer heads`,
        { bytes: size, totalMemory: this.#limit },
      );
    }
    const out = [0];
    this.#misses++;
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
    const ptr = Number(out[0]);
    this.#owned.add(ptr);
    return ptr;
  }

  /** #libs.cu.cuMemFree for a driver allocation of this pool. */
  #free1(ptr: number): void {
    this.#owned.delete(ptr);
    this.#libs.cu.cuMemFree(ptr);
  }

  /**
   * Every driver allocation of this pool back to the driver, live tensors' too (dispose: a
   * disposed backend's tensors are unusable, and the device's primary context, which would
   * free them with itself, may outlive the backend). The pool is empty after it.
   */
  freeAll(): void {
    this.#libs.cu.cuCtxSynchronize();
    for (const p of this.#owned) this.#libs.cu.cuMemFree(p);
    this.#owned.clear();
    this.#slabs.clear();
    this.#free.clear();
    this.#pooledBytes = 0;
    this.#liveBytes = 0;
  }

  /**
   * alloc, but a miss allocates `count` blocks of the size class in one cuMemAlloc (a slab)
   * and keeps the rest pooled: for blocks that are held a while (retained statistics), so
   * that a run of calls pays for one driver allocation, not one each (cuMemAlloc took
   * ~0.3 ms for 0.8 MB on the H200 host). trim frees a slab once all its blocks are pooled.
   */
  allocBatch(bytes: number, count: number): DeviceBlock {
    const size = sizeClass(bytes);
    const list = this.#free.get(size);
    if ((list && list.length > 0) || count <= 1) return this.alloc(bytes);
    const base = this.#driverAlloc(size * count);
    const children: number[] = [];
    for (let i = 0; i < count; i++) children.push(base + i * size);
    this.#slabs.set(base, { size, children });
    const free = list ?? [];
    this.#free.set(size, free);
    for (let i = count - 1; i >= 1; i--) free.push(children[i]);
    this.#pooledBytes += (count - 1) * size;
    this.#liveBytes += size;
    return { ptr: children[0], size };
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
    const pooled = new Set<number>();
    for (const [, list] of this.#free) for (const p of list) pooled.add(p);
    // a slab goes back whole, once every block of it is pooled; until then its pooled blocks stay
    const keep = new Set<number>();
    for (const [base, slab] of this.#slabs) {
      if (slab.children.every((c) => pooled.has(c))) {
        this.#free1(base);
        for (const c of slab.children) pooled.delete(c);
        this.#slabs.delete(base);
      } else {
        for (const c of slab.children) if (pooled.has(c)) keep.add(c);
      }
    }
    for (const p of pooled) if (!keep.has(p)) this.#free1(p);
    for (const [size, list] of this.#free) {
      const left = list.filter((p) => keep.has(p));
      if (left.length) this.#free.set(size, left);
      else this.#free.delete(size);
    }
    this.#pooledBytes = [...this.#free].reduce((a, [size, list]) => a + size * list.length, 0);
  }
}
