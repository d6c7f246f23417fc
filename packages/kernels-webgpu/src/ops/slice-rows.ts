/**
 * sliceRows: rows [start, start + rows) of a tensor along its first axis. A view into the
 * parent's buffer when the rows start at a multiple of the device's
 * minStorageBufferOffsetAlignment (every dispatch binds tensors as { buffer, offset, size }),
 * else a copy (copyBufferToBuffer). A view can be written (an attention's `out`, `write`):
 * the writes land in the parent's rows, as on the other backends. A copy cannot: it is marked
 * (`sliceCopy`) and refused as `out` and as `write`'s target, since what is written to it would
 * not reach the parent. Disposing either kind never frees the parent's buffer.
 */
import { bytesPerElement, type DeviceTensor, InvalidArgumentError, numel, UnsupportedError } from '@crisp/core';
import type { Check } from '../runtime/gpu-context.js';
import { WebGpuTensor } from '../runtime/tensor.js';
import type { OpHost } from './host.js';

export function sliceRows(host: OpHost, t: DeviceTensor, start: number, rows: number): DeviceTensor {
  const pt = host.own(t, 'sliceRows: the tensor');
  if (pt.shape.length < 1) throw new InvalidArgumentError(`sliceRows needs a tensor with at least one axis; got shape [${pt.shape}]`);
  const [total, ...rest] = pt.shape;
  if (!Number.isSafeInteger(start) || !Number.isSafeInteger(rows) || start < 0 || rows < 1 || start + rows > total) {
    throw new InvalidArgumentError(
      `sliceRows: rows [${String(start)}, ${Number.isSafeInteger(start) && Number.isSafeInteger(rows) ? start + rows : '?'}) do not fit a tensor of ${total} rows; pass integers with 0 <= start, 1 <= rows, start + rows <= ${total}`,
    );
  }
  const rowBytes = numel(rest) * bytesPerElement(pt.dtype);
  const byteOffset = pt.byteOffset + start * rowBytes;
  const byteLength = rows * rowBytes;
  const shape = [rows, ...rest];
  // the view sees the parent's writes so far: their verdict becomes the view's too
  const parentVerdict: Check = pt.settle().then(
    () => undefined,
    (e: unknown) => e as never,
  );
  if (byteOffset % host.gpu.limits.minStorageBufferOffsetAlignment === 0) {
    const view = new WebGpuTensor(host.gpu, pt.owner, pt.dtype, shape, pt.buffer, byteLength, true, byteOffset);
    view.checks.push(parentVerdict);
    return view;
  }
  if (byteOffset % 4 !== 0) {
    throw new UnsupportedError(
      `sliceRows: row ${start} of this ${pt.dtype} tensor starts at byte ${byteOffset}, not a multiple of 4, which WebGPU cannot copy from; slice at an even row or use rows of an even element count`,
      { limit: 'sliceRows' },
    );
  }
  const copy = host.newTensor(pt.dtype, shape).markSliceCopy();
  copy.checks.push(parentVerdict);
  try {
    host.gpu.scoped(copy.checks, `a copy of rows [${start}, ${start + rows})`, () => {
      const enc = host.gpu.device.createCommandEncoder();
      enc.copyBufferToBuffer(pt.buffer, byteOffset, copy.buffer, 0, Math.ceil(byteLength / 4) * 4);
      host.gpu.submit(enc);
    });
  } catch (e) {
    copy.dispose();
    throw e;
  }
  return copy;
}

/**
 * INVALID_ARGUMENT for a sliceRows copy given as an output (`what`): its rows did not start at
 * a multiple of the device's offset alignment, so it is a copy, and what is written to it
 * would not reach the tensor it was sliced from.
 */
export function sliceCopyError(what: string, alignment: number): InvalidArgumentError {
  return new InvalidArgumentError(
    `${what} is a copy of rows of another tensor (sliceRows, whose rows did not start at a multiple of this device's ${alignment}-byte storage offset alignment), so what is written to it would not reach that tensor; write into a tensor of its own and copy, or slice at an aligned row (a view, which writes through)`,
    { sliceCopy: true },
  );
}
