/** Tensors in and out of the device: upload, allocate, write (f16 halves at odd offsets too), download. */
import {
  assertDType,
  assertShape,
  bytesPerElement,
  checkElementRange,
  type DeviceTensor,
  type DType,
  DTypeError,
  type HostData,
  type HostTensor,
  InvalidArgumentError,
  numel,
  UnsupportedError,
  wrapHost,
} from '@crisp/core';
import { writeHalvesProgram } from '../kernels/write.js';
import { Usage } from '../runtime/gpu-context.js';
import type { WebGpuTensor } from '../runtime/tensor.js';
import type { OpHost } from './host.js';
import { sliceCopyError } from './slice-rows.js';

export function upload(host: OpHost, t: HostTensor): DeviceTensor {
  host.alive();
  if (!t || typeof t !== 'object') throw new InvalidArgumentError('upload needs a host tensor { dtype, shape, data }');
  const h = wrapHost(t.dtype, t.shape, t.data);
  const dt = allocate(host, h.dtype, h.shape) as WebGpuTensor;
  try {
    write(host, dt, 0, h.data);
  } catch (e) {
    dt.dispose();
    throw e;
  }
  return dt;
}

export function allocate(host: OpHost, dtype: DType, shape: readonly number[]): DeviceTensor {
  host.alive();
  assertDType(dtype);
  assertShape(shape as number[]);
  if (dtype === 'bf16') {
    throw new UnsupportedError('the WebGPU backend stores f32 and f16 only (WGSL has no bf16); cast to f16 or f32', {
      limit: 'dtype',
    });
  }
  return host.newTensor(dtype, shape);
}

export function write(host: OpHost, t: DeviceTensor, elementOffset: number, data: HostData): void {
  const wt = host.own(t, 'write target');
  if (wt.sliceCopy) throw sliceCopyError('the write target', host.gpu.limits.minStorageBufferOffsetAlignment);
  if (!ArrayBuffer.isView(data)) {
    throw new InvalidArgumentError(
      `write needs a ${wt.dtype === 'f32' ? 'Float32Array' : 'Uint16Array of f16 bit patterns'}; got ${data === null ? 'null' : typeof data}`,
    );
  }
  if (wt.dtype === 'f32' ? !(data instanceof Float32Array) : !(data instanceof Uint16Array)) {
    throw new DTypeError(
      `write into a ${wt.dtype} tensor needs a ${wt.dtype === 'f32' ? 'Float32Array' : 'Uint16Array of bit patterns'}`,
    );
  }
  const total = numel(wt.shape);
  if (!Number.isInteger(elementOffset) || elementOffset < 0 || elementOffset + data.length > total) {
    throw new InvalidArgumentError(
      `write of ${data.length} elements at offset ${elementOffset} does not fit a tensor of ${total} elements`,
    );
  }
  if (data.length === 0) return;
  const bpe = bytesPerElement(wt.dtype);
  const byteOff = elementOffset * bpe;
  // (the verdict joins the tensor's: its next use reports a failed write)
  host.gpu.scoped(wt.checks, `a write of ${data.length} elements`, () => {
    if (byteOff % 4 === 0 && data.byteLength % 4 === 0) {
      host.gpu.writeBuffer(wt.buffer, wt.byteOffset + byteOff, data);
      return;
    }
    // f16 at an odd element offset or of odd length: whole words go straight in, the one or
    // two boundary halves through a tiny kernel that keeps the neighbouring half intact.
    writeHalves(host, wt, elementOffset, data as Uint16Array);
  });
}

export function writeHalves(host: OpHost, wt: WebGpuTensor, off: number, data: Uint16Array): void {
  const firstWord = Math.floor(off / 2);
  const lastWord = Math.floor((off + data.length - 1) / 2);
  const words = lastWord - firstWord + 1;
  const packed = new Uint16Array(words * 2);
  packed.set(data, off - firstWord * 2);
  const src = host.gpu.createBuffer(packed.byteLength, Usage.STORAGE | Usage.COPY_DST, 'halves');
  let uni: GPUBuffer;
  try {
    uni = host.gpu.uniform([firstWord, words, off, data.length]);
  } catch (e) {
    host.gpu.retire(src);
    throw e;
  }
  host.gpu.writeBuffer(src, 0, packed);
  const prog = writeHalvesProgram();
  const enc = host.gpu.device.createCommandEncoder();
  // Pipelines build asynchronously; this one is tiny and compiled synchronously instead.
  const module = host.gpu.device.createShaderModule({ code: prog.wgsl, label: prog.name });
  const pipe = host.gpu.device.createComputePipeline({ layout: 'auto', compute: { module, entryPoint: prog.entryPoint } });
  host.gpu.dispatch(enc, pipe, [uni, src, wt.binding], [Math.ceil(words / 256)]);
  host.gpu.submit(enc, [uni, src]);
}

export async function download(host: OpHost, t: DeviceTensor): Promise<HostTensor> {
  const wt = host.own(t, 'downloaded');
  await wt.settle();
  const n = numel(wt.shape);
  const ab = await host.gpu.read(wt.buffer, wt.byteOffset, wt.byteLength);
  const data = wt.dtype === 'f32' ? new Float32Array(ab, 0, n) : new Uint16Array(ab, 0, n);
  return { dtype: wt.dtype, shape: [...wt.shape], data };
}

/**
 * Elements [elementOffset, elementOffset + count) of a tensor (or of a sliceRows view), through
 * a staging buffer of that range alone (copies start and end on 4-byte words: an f16 range at an odd element is
 * read from the word before and cut).
 */
export async function read(host: OpHost, t: DeviceTensor, elementOffset: number, count: number): Promise<HostData> {
  const wt = host.own(t, 'read source');
  checkElementRange(elementOffset, count, numel(wt.shape), 'read');
  await wt.settle();
  const bpe = bytesPerElement(wt.dtype);
  if (count === 0) return wt.dtype === 'f32' ? new Float32Array(0) : new Uint16Array(0);
  // (a view made by sliceRows starts at its byteOffset in its parent's buffer)
  const start = wt.byteOffset + elementOffset * bpe;
  const first = Math.floor(start / 4) * 4;
  const last = Math.ceil((start + count * bpe) / 4) * 4;
  const ab = await host.gpu.read(wt.buffer, first, last - first);
  const skip = (start - first) / bpe;
  return wt.dtype === 'f32' ? new Float32Array(ab, 0, count) : new Uint16Array(ab, skip * 2, count);
}

/**
 * A device tensor over a GPUBuffer made elsewhere on this backend's device (another
 * library's tensor, TF.js's `dataToGPU()`): nothing is copied. The buffer stays the caller's:
 * the tensor's dispose() leaves it alive, and the caller must keep it alive and unwritten
 * until the work that uses it has finished (`synchronize()`). WebGPU cannot tell which
 * device made a buffer: one from another device fails at its first use (BACKEND_ERROR).
 */
export function wrapBuffer(host: OpHost, buffer: GPUBuffer, dtype: DType, shape: readonly number[]): DeviceTensor {
  host.alive();
  const b = buffer as Partial<GPUBuffer> | null;
  if (b === null || typeof b !== 'object' || typeof b.size !== 'number' || typeof b.usage !== 'number' || typeof b.destroy !== 'function') {
    throw new InvalidArgumentError(`wrapBuffer needs a GPUBuffer; got ${b === null ? 'null' : typeof b}`);
  }
  assertDType(dtype);
  assertShape(shape as number[]);
  if (dtype === 'bf16') throw new UnsupportedError('the WebGPU backend stores f32 and f16 only (WGSL has no bf16)', { limit: 'dtype' });
  const need = Usage.STORAGE | Usage.COPY_SRC;
  if ((b.usage & need) !== need) {
    throw new InvalidArgumentError(`wrapBuffer needs a buffer with STORAGE and COPY_SRC usage; this one has usage 0x${b.usage.toString(16)}`);
  }
  const bytes = numel(shape) * bytesPerElement(dtype);
  // (f16 kernels read whole 32-bit words)
  const words = Math.ceil(bytes / 4) * 4;
  if (b.size < words) {
    throw new InvalidArgumentError(`a ${dtype} tensor of shape [${shape}] needs ${words} bytes; the buffer holds ${b.size}`, {
      bytes: words,
      size: b.size,
    });
  }
  if (b.size > host.gpu.limits.maxBufferSize) {
    throw new InvalidArgumentError(`the buffer (${b.size} bytes) is larger than this device's maxBufferSize: it was made on another device`);
  }
  return host.wrapTensor(buffer, dtype, shape, bytes);
}
