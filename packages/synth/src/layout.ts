/**
 * The logical channel layout of q and k, the generator's fixed constants and hash streams,
 * and the per-token features (salience, topics, rotary kernel) shared by the strength
 * solver and the row generator.
 */
import type { HeadKind, Range } from './profiles.js';
import { gaussFromBits, hash4, type RowRng, rngFor, unitFromBits } from './random.js';

// ---------------------------------------------------------------------------------------
// Channel layout and fixed generator constants.

export const SINK_K = 4; // key value on sink tokens (times the sink weight)
export const FLAG_K = 4; // key value on stripe and needle tokens
export const TOPIC_K = 2; // key topic vectors are scaled by this
export const SALIENCE_COARSE = 256; // tokens per coarse salience segment
export const SALIENCE_FINE = 64; // tokens per fine salience span
export const TOPIC_SEGMENT = 384; // tokens per content segment (a "document")
export const QUERY_TOPIC_SPAN = 128; // query rows sharing one query topic (one block at B = 128)
export const NOISE_LOGIT_STD = 0.35; // token-level logit jitter (nats)
export const NEEDLE_VALUE = 3; // needle tokens carry a distinct, larger value vector
export const DIFFUSE_LOCAL_CAP = 0.08; // most a diffuse head puts on the last 128 keys at the proxy rows
export const THRESHOLD_LOCAL_CAP = 0.04; // the same for near-threshold retrieval heads, before the sink's share
export const SINK_BLOCK = 128; // the sink block whose mass is targeted (p_v[0] at B = 128)
export const SINK_SAMPLE_ROWS = 4; // rows (every 32nd of the last 128, the proxy rows) where the non-sink mass is summed

// Streams for the counter hash.
export const S_KNOISE = 1;
export const S_VNOISE = 2;
export const S_QNOISE = 3;
export const S_TOPIC = 4;
export const S_QTOPIC = 5;
export const S_SAL_COARSE = 6;
export const S_SAL_FINE = 7;
export const S_SAL_TAIL = 8;
export const S_SAL_BLOCK = 9;
export const S_SAL_BLOCK_TAIL = 10;
export const S_QFOCUS = 11;
export const S_KINDS = 21;
export const S_HEAD = 22;
export const S_GROUP = 23;

export interface Layout {
  readonly d: number;
  readonly sink: number;
  readonly salience: number;
  readonly stripe: number;
  readonly needle0: number;
  readonly needleDims: number;
  readonly rot0: number;
  readonly freqs: Float64Array;
  readonly topic0: number;
  readonly topicDims: number;
  readonly noise0: number;
  readonly noiseDims: number;
}

export function makeLayout(d: number): Layout {
  const needleDims = d >= 64 ? 8 : 4;
  const F = d >= 64 ? 8 : 6;
  const topicDims = d >= 64 ? 8 : 4;
  const rot0 = 3 + needleDims;
  const topic0 = rot0 + 2 * F;
  const noise0 = topic0 + topicDims;
  // Rotary frequencies, geometric from 1 rad/token down to 1/256: a local window a few
  // hundred tokens wide with RoPE's slow long-range decay.
  const freqs = Float64Array.from({ length: F }, (_, f) => 256 ** (-f / (F - 1)));
  return {
    d,
    sink: 0,
    salience: 1,
    stripe: 2,
    needle0: 3,
    needleDims,
    rot0,
    freqs,
    topic0,
    topicDims,
    noise0,
    noiseDims: d - noise0,
  };
}

/** Heavy-tailed salience z(j) for one kv group: a coarse and a fine level, Laplace-like tails. */
export function salience(seed: number, g: number, j: number): number {
  const c = Math.floor(j / SALIENCE_COARSE);
  const f = Math.floor(j / SALIENCE_FINE);
  // A Gaussian scale mixture: heavier tails than a Gaussian, so a few spans stand far out.
  const coarse = gaussFromBits(hash4(seed, S_SAL_COARSE, g, c)) * Math.exp(0.6 * gaussFromBits(hash4(seed, S_SAL_TAIL, g, c)));
  const fine = gaussFromBits(hash4(seed, S_SAL_FINE, g, f)) * Math.exp(0.6 * gaussFromBits(hash4(seed, S_SAL_TAIL, g, f + 0x40000000)));
  const z = 0.9 * coarse + 0.6 * fine;
  // The sink block's own background is never salient: its mass is the sink's, solved per
  // head, and a salient span there would put it out of the solver's reach.
  return Math.min(j < SINK_BLOCK ? 0 : 5, Math.max(-5, z));
}

export const SALIENCE_BLOCK = 128; // tokens sharing one block-level salience (one key block at B = 128)
export const PASSAGE_SHARE = 0.25; // share of key blocks that are salient passages when a profile has block salience
export const PASSAGE_LEVEL = 2; // their salience level, in units of the profile's block salience

/**
 * The salience of key j in kv group g with the profile's block-level term (scale `amp`; none
 * at 0, where this is `salience`). One key block in five is a salient passage, raised by
 * `amp * PASSAGE_LEVEL`; every block gets a Gaussian level of std `amp / 2` too. On top of the
 * heavy-tailed span salience, a handful of passages then hold most of the non-anchor mass, as
 * the paragraphs a question is about do in a real prompt. The sink block keeps its plain
 * salience (its mass is solved per head).
 */
export function keySalience(seed: number, g: number, j: number, amp: number): number {
  const z = salience(seed, g, j);
  if (amp === 0 || j < SINK_BLOCK) return z;
  const b = Math.floor(j / SALIENCE_BLOCK);
  const passage = unitFromBits(hash4(seed, S_SAL_BLOCK, g, b)) < PASSAGE_SHARE ? PASSAGE_LEVEL : 0;
  const level = passage + 0.5 * gaussFromBits(hash4(seed, S_SAL_BLOCK_TAIL, g, b));
  return Math.min(7, Math.max(-7, z + amp * level));
}

/**
 * Salience of a needle key. A planted fact is not salient by itself: only its asker rows find
 * it, through the needle channel (N_hm). Inheriting the span's z(j) (up to 5, times σ_h ≈ 2.5-3
 * nats) would give a needle in a salient span percent-level mass on every row, and N_hm,
 * solved to hit the asker target, would shrink to almost nothing. So a needle key keeps the
 * span's z only where it is at most the background median (0).
 */
export function needleSalience(z: number): number {
  return Math.min(z, 0);
}

export function fillTopic(seed: number, stream: number, a: number, b: number, out: Float64Array, scale: number): void {
  const r = rngFor(seed, stream, a, b);
  for (let t = 0; t < out.length; t++) out[t] = r.gauss() * scale;
}

/**
 * The query topic of head h for query span `span` (QUERY_TOPIC_SPAN rows). A plain head draws
 * a random topic per span. A focused head (`sink-topic`) points each span at one earlier
 * content segment of its kv group g, drawn per span: the unit vector of that segment's key
 * topic, so the focused segment gets about the head's topic strength in nats whichever it is,
 * and the sink's share stays steady from one query block to the next. Spans in the first two
 * segments have no earlier segment with a topic and get none.
 */
export function fillQueryTopic(seed: number, h: number, g: number, span: number, focus: boolean, out: Float64Array): void {
  if (!focus) {
    fillTopic(seed, S_QTOPIC, h, span, out, 1);
    return;
  }
  const current = Math.floor((span * QUERY_TOPIC_SPAN) / TOPIC_SEGMENT);
  if (current < 2) {
    out.fill(0);
    return;
  }
  const seg = 1 + Math.floor(unitFromBits(hash4(seed, S_QFOCUS, h, span)) * (current - 1));
  fillTopic(seed, S_TOPIC, g, seg, out, 1);
  let norm = 0;
  for (let t = 0; t < out.length; t++) norm += out[t] * out[t];
  norm = Math.sqrt(norm);
  for (let t = 0; t < out.length; t++) out[t] /= norm;
}

export interface Needle {
  readonly id: number;
  readonly g: number;
  readonly position: number;
  readonly length: number;
  readonly dim: number; // index among needle channels
  readonly askers: [number, number][];
  readonly visible: boolean;
  readonly value: Float64Array; // [d] value vector on the needle tokens
}

export interface Group {
  readonly perm: Int32Array; // channel c of the logical layout goes to perm[c]
  readonly sign: Float64Array;
  readonly stripes: number[];
  readonly stripeSet: Set<number>;
  /** std of the block-level salience term (0: none) */
  readonly blockSalience: number;
  readonly needles: Needle[];
  /** stripe and needle tokens: keys without rotary phase */
  readonly positionFree: Set<number>;
}

export interface HeadPlan {
  readonly kind: HeadKind;
  readonly g: number;
  readonly sinkTarget: number;
  sink: number;
  readonly salience: number;
  local: number;
  readonly slash: { offset: number; amp: number }[];
  stripe: number;
  readonly stripeTarget: number;
  readonly topic: number;
  /** query topics point at one earlier content segment per query span (fillQueryTopic) */
  readonly focus: boolean;
  readonly needleTargets: Map<number, number>;
  readonly needleStrength: Map<number, number>;
}

export function pick(r: RowRng, range: Range): number {
  return r.range(range[0], range[1]);
}

/** Rotary pairs slash lines use: the high-frequency half. */
export function slashFreqs(L: Layout): number {
  return Math.ceil(L.freqs.length / 2);
}

/** K(δ) = mean_f cos(ω_f δ) for δ in [0, n): the rotary kernel, shared by all heads. */
export function rotaryKernel(freqs: Float64Array, n: number): Float64Array {
  const K = new Float64Array(n);
  const F = freqs.length;
  for (let f = 0; f < F; f++) {
    const w = freqs[f];
    for (let t = 0; t < n; t++) K[t] += Math.cos(w * t);
  }
  for (let t = 0; t < n; t++) K[t] /= F;
  return K;
}
