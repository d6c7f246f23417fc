import { type AttentionShape, type DeviceTensor, UnsupportedError, assertSupported, attentionShape } from '@crisp/core';
import { BACKEND_NAME, CUDA_CAPABILITIES } from '../runtime/context.js';

/** The shape proxy statistics and PE rows work on: supported, and q as long as k (no chunks). */
export function selectionShape(q: DeviceTensor, k: DeviceTensor): AttentionShape {
  const shape = attentionShape(q, k, k);
  assertSupported(CUDA_CAPABILITIES, shape, BACKEND_NAME);
  if (shape.queries !== shape.keys) {
    throw new UnsupportedError(
      `proxy statistics and PE rows need q and k of equal length (got ${shape.queries} and ${shape.keys}); chunked prefill runs dense or with a mask you pass`,
      { limit: 'chunkedPrefill' },
    );
  }
  return shape;
}
