/**
 * One attention block of a small TF.js model, with its attention call swapped for
 * crispAttention. The block is a pre-norm Llama-style layer written with @tensorflow/tfjs-core
 * ops: RMSNorm, Q/K/V projections, rotary position embedding, causal attention (GQA), the
 * output projection and the residual. `blockForward(x, weights, attention)` takes the
 * attention as a function, so TF.js's own dense attention and CRISP run on the same weights.
 *
 * Run it (TF.js cpu backend, the float64 reference behind CRISP):
 *   pnpm --filter @crisp/tfjs test attention-block
 */
import * as tf from '@tensorflow/tfjs-core';
import { type CrispAttentionOptions, crispAttention, tfDenseAttention } from '../src/index.js';

export interface BlockConfig {
  readonly dModel: number;
  readonly heads: number;
  readonly kvHeads: number;
  readonly headDim: number;
}

export interface BlockWeights {
  readonly config: BlockConfig;
  readonly norm: tf.Tensor1D;
  readonly wq: tf.Tensor2D;
  readonly wk: tf.Tensor2D;
  readonly wv: tf.Tensor2D;
  readonly wo: tf.Tensor2D;
}

/** q [n, H, d], k and v [n, Hkv, d] in, [n, H, d] out: the block's attention call. */
export type Attention = (q: tf.Tensor, k: tf.Tensor, v: tf.Tensor) => Promise<tf.Tensor>;

/** Seeded random weights (tf.randomNormal with a seed per matrix). */
export function randomWeights(config: BlockConfig, seed: number): BlockWeights {
  const { dModel: D, heads: H, kvHeads: Hkv, headDim: d } = config;
  const w = (rows: number, cols: number, s: number) => tf.randomNormal([rows, cols], 0, 1 / Math.sqrt(rows), 'float32', seed + s) as tf.Tensor2D;
  return { config, norm: tf.ones([D]) as tf.Tensor1D, wq: w(D, H * d, 1), wk: w(D, Hkv * d, 2), wv: w(D, Hkv * d, 3), wo: w(H * d, D, 4) };
}

/** Rotary position embedding over the last axis of [n, heads, d] (pairs (i, i + d/2)). */
function rope(x: tf.Tensor): tf.Tensor {
  return tf.tidy(() => {
    const [n, , d] = x.shape;
    // (tf.Tensor's chained methods need tfjs-core's chained-ops import; plain functions do not)
    const half = d / 2;
    const inv = tf.pow(10000, tf.div(tf.range(0, half), -half)) as tf.Tensor1D;
    const angles = tf.reshape(tf.outerProduct(tf.range(0, n), inv), [n, 1, half]);
    const [cos, sin] = [tf.cos(angles), tf.sin(angles)];
    const [a, b] = tf.split(x, 2, 2);
    return tf.concat([tf.sub(tf.mul(a, cos), tf.mul(b, sin)), tf.add(tf.mul(a, sin), tf.mul(b, cos))], 2);
  });
}

/** x [n, dModel] through the block; `attention` is the only part that differs between runs. */
export async function blockForward(x: tf.Tensor2D, w: BlockWeights, attention: Attention): Promise<tf.Tensor2D> {
  const { heads: H, kvHeads: Hkv, headDim: d } = w.config;
  const n = x.shape[0];
  const [q, k, v] = tf.tidy(() => {
    const rms = tf.rsqrt(tf.add(tf.mean(tf.square(x), 1, true), 1e-6));
    const h = tf.mul(tf.mul(x, rms), w.norm);
    return [rope(tf.reshape(tf.matMul(h, w.wq), [n, H, d])), rope(tf.reshape(tf.matMul(h, w.wk), [n, Hkv, d])), tf.reshape(tf.matMul(h, w.wv), [n, Hkv, d])];
  });
  const o = await attention(q, k, v);
  const y = tf.tidy(() => tf.add(x, tf.matMul(tf.reshape(o, [n, H * d]), w.wo))) as tf.Tensor2D;
  tf.dispose([q, k, v, o]);
  return y;
}

/** TF.js's own dense attention, as the block's default. */
export const denseAttention: Attention = async (q, k, v) => tfDenseAttention(q, k, v);

/** crispAttention in the block's place (the plan is dropped; keep it if you want the routes). */
export function crispAttentionFor(options: CrispAttentionOptions = {}): Attention {
  return async (q, k, v) => (await crispAttention(q, k, v, options)).output;
}

/** The block with both attentions on the same input and weights: max |Δ| / max |dense|. */
export async function compare(n: number, config: BlockConfig, seed: number, options: CrispAttentionOptions = {}): Promise<number> {
  const w = randomWeights(config, seed);
  const x = tf.randomNormal([n, config.dModel], 0, 1, 'float32', seed) as tf.Tensor2D;
  const ref = await blockForward(x, w, denseAttention);
  const mine = await blockForward(x, w, crispAttentionFor(options));
  // (read asynchronously: tfjs-backend-webgpu cannot read synchronously without a canvas)
  const [num, den] = tf.tidy(() => [tf.max(tf.abs(tf.sub(mine, ref))), tf.max(tf.abs(ref))]);
  const rel = (await num.data())[0] / (await den.data())[0];
  tf.dispose([num, den]);
  tf.dispose([x, ref, mine, w.norm, w.wq, w.wk, w.wv, w.wo]);
  return rel;
}
