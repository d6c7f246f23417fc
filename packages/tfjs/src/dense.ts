/**
 * TF.js's own dense causal attention, written as a TF.js user would (tf.matMul, a causal
 * mask, tf.softmax, tf.matMul, one head at a time so memory stays O(n²) per head): the
 * baseline crispAttention is compared with in the tests, the example and the benchmarks.
 * Same layout and GQA rule as crispAttention (query head h reads kv head ⌊h / (H / Hkv)⌋).
 */
import * as tf from '@tensorflow/tfjs-core';
import { checkInputs, type TfTensor } from './tensors.js';

export function tfDenseAttention(q: TfTensor, k: TfTensor, v: TfTensor, options: { readonly scale?: number } = {}): TfTensor {
  const layout = checkInputs(tf, q, k, v);
  const { n, heads: H, kvHeads: Hkv, headDim: d } = layout;
  const scale = options.scale ?? 1 / Math.sqrt(d);
  return tf.tidy(() => {
    // 0 on and below the diagonal, -1e9 above it
    const above = tf.mul(tf.sub(1, tf.linalg.bandPart(tf.ones([n, n]), -1, 0)), -1e9);
    const one = (qs: TfTensor, ks: TfTensor, vs: TfTensor): TfTensor => {
      const qh = tf.unstack(tf.transpose(qs, [1, 0, 2]));
      const kh = tf.unstack(tf.transpose(ks, [1, 0, 2]));
      const vh = tf.unstack(tf.transpose(vs, [1, 0, 2]));
      // one tidy per head: its n x n scores and probabilities go before the next head's
      const outs = qh.map((qq, h) =>
        tf.tidy(() => {
          const g = Math.floor(h / (H / Hkv));
          const s = tf.add(tf.mul(tf.matMul(qq, kh[g], false, true), scale), above);
          return tf.matMul(tf.softmax(s), vh[g]);
        }),
      );
      return tf.stack(outs, 1);
    };
    if (!layout.batched) return one(q, k, v);
    const [qb, kb, vb] = [q, k, v].map((t) => tf.unstack(t));
    return tf.stack(qb.map((_, b) => one(qb[b], kb[b], vb[b])));
  });
}
