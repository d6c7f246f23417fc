// Test helpers (not exported from the package): exact float64 attention probabilities of one
// query row, straight from host tensors, independent of any backend.
import { type HostTensor, toFloat32 } from '@crisp/core';

/** Softmax probabilities of query row i of head h over keys 0..i (causal), float64. */
export function attentionProbs(q: HostTensor, k: HostTensor, h: number, i: number, scale: number): Float64Array {
  const [, H, d] = q.shape;
  const Hkv = k.shape[1];
  const g = Math.floor(h / (H / Hkv));
  const qv = toFloat32(q);
  const kv = toFloat32(k);
  const logits = new Float64Array(i + 1);
  let max = Number.NEGATIVE_INFINITY;
  for (let j = 0; j <= i; j++) {
    let s = 0;
    for (let c = 0; c < d; c++) s += qv[(i * H + h) * d + c] * kv[(j * Hkv + g) * d + c];
    logits[j] = s * scale;
    if (logits[j] > max) max = logits[j];
  }
  let z = 0;
  for (let j = 0; j <= i; j++) {
    logits[j] = Math.exp(logits[j] - max);
    z += logits[j];
  }
  for (let j = 0; j <= i; j++) logits[j] /= z;
  return logits;
}
