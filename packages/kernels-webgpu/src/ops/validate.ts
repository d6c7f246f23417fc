/** Argument checks every operation shares: scale, binding-size limits, q/k/v shapes. */
import {
  assertSupported,
  type AttentionShape,
  attentionShape,
  bytesPerElement,
  defaultScale,
  type DeviceTensor,
  InvalidArgumentError,
  LimitError,
  MaskError,
} from '@crisp/core';
import type { WebGpuTensor } from '../runtime/tensor.js';
import type { OpHost } from './host.js';

export function checkScale(scale: number | undefined, d: number): number {
  if (scale === undefined) return defaultScale(d);
  if (typeof scale !== 'number' || !Number.isFinite(scale) || scale <= 0) {
    throw new InvalidArgumentError(`scale must be a positive finite number; got ${String(scale)}`);
  }
  return scale;
}

/** Binding-size limit: the largest n that fits for this H, d and dtype, named in the error. */
export function checkBindings(host: OpHost, shape: AttentionShape): void {
  const lim = host.gpu.limits.maxStorageBufferBindingSize;
  const bpe = bytesPerElement(shape.dtype);
  const row = shape.heads * shape.headDim * bpe;
  const qBytes = shape.queries * row;
  const kBytes = shape.keys * shape.kvHeads * shape.headDim * bpe;
  if (qBytes > lim || kBytes > lim) {
    const maxN = Math.floor(lim / row);
    throw new LimitError(
      `q of ${qBytes} bytes exceeds this device's maxStorageBufferBindingSize (${lim} bytes): with H = ${shape.heads}, d = ${shape.headDim}, ${shape.dtype} the largest n that fits is ${maxN}. Split the sequence into chunks (chunked prefill with the LSE merge) or use a device with a larger limit`,
      { limit: 'maxStorageBufferBindingSize', max: maxN, bytes: Math.max(qBytes, kBytes) },
    );
  }
}

export function prepare(
  host: OpHost,
  q: DeviceTensor,
  k: DeviceTensor,
  v: DeviceTensor | undefined,
): { shape: AttentionShape; qt: WebGpuTensor; kt: WebGpuTensor; vt?: WebGpuTensor } {
  const qt = host.own(q, 'q');
  const kt = host.own(k, 'k');
  const vt = v ? host.own(v, 'v') : undefined;
  const shape = attentionShape(qt, kt, vt ?? kt);
  assertSupported(host.capabilities, shape, host.name);
  checkBindings(host, shape);
  return { shape, qt, kt, vt };
}

/**
 * Wait until these tensors' allocations and writes are known good (OUT_OF_MEMORY or
 * BACKEND_ERROR otherwise), after the synchronous checks and before any work.
 */
export async function ready(...ts: (WebGpuTensor | undefined)[]): Promise<void> {
  await Promise.all(ts.map((t) => t?.settle()));
}

/**
 * The mask's arrays are there and are Int32Arrays (INVALID_MASK otherwise), before core's
 * validateMask reads their lengths and entries.
 */
export function checkMaskArrays(mask: unknown): void {
  if (mask === null || typeof mask !== 'object') {
    throw new MaskError('the mask must be a BlockMask { heads, numBlocks, blockSize, vs?, rows? }');
  }
  const m = mask as { vs?: unknown; rows?: unknown };
  const parts: [string, unknown, readonly string[]][] = [
    ['vs', m.vs, ['verticalPtr', 'vertical', 'slashPtr', 'slash']],
    ['rows', m.rows, ['rowPtr', 'cols']],
  ];
  for (const [name, part, keys] of parts) {
    if (part === undefined) continue;
    if (part === null || typeof part !== 'object') throw new MaskError(`mask.${name} must be an object of Int32Arrays (${keys.join(', ')})`);
    for (const k of keys) {
      if (!((part as Record<string, unknown>)[k] instanceof Int32Array)) {
        throw new MaskError(`mask.${name}.${k} must be an Int32Array; got ${describeValue((part as Record<string, unknown>)[k])}`);
      }
    }
  }
}

function describeValue(x: unknown): string {
  if (x === null) return 'null';
  if (typeof x === 'object') return (x as object).constructor?.name ?? 'an object';
  return typeof x;
}
