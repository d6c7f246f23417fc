import { type AttentionShape, type DeviceTensor, assertSupported, attentionShape } from '@crisp/core';
import { BACKEND_NAME, CUDA_CAPABILITIES } from '../runtime/context.js';

/**
 * The shape proxy statistics and PE rows work on, checked against the backend's
 * capabilities: q [m, H, d] the last m of n positions (m = n, or a chunk over a cached
 * prefix), k [n, Hkv, d].
 */
export function selectionShape(q: DeviceTensor, k: DeviceTensor): AttentionShape {
  const shape = attentionShape(q, k, k);
  assertSupported(CUDA_CAPABILITIES, shape, BACKEND_NAME);
  return shape;
}
