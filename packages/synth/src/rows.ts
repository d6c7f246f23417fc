/** Row generation: q, k and v for rows [start, end) from a scenario's solved plan. */
import { type DType, f32ToBf16Bits, f32ToF16Bits, InvalidArgumentError, wrapHost } from '@crisp/core';
import {
  FLAG_K,
  fillQueryTopic,
  fillTopic,
  type Group,
  type HeadPlan,
  type Layout,
  type Needle,
  NOISE_LOGIT_STD,
  needleSalience,
  QUERY_TOPIC_SPAN,
  S_KNOISE,
  S_QNOISE,
  S_TOPIC,
  S_VNOISE,
  keySalience,
  SINK_K,
  slashFreqs,
  TOPIC_K,
  TOPIC_SEGMENT,
} from './layout.js';
import { hash4, RowRng } from './random.js';
import type { ScenarioChunk } from './scenario-types.js';


/** Produces rows; holds the per-head constants of q so each row costs O((H + Hkv) d). */
export class RowGenerator {
  readonly #rng = new RowRng();
  readonly #row: Float64Array;
  readonly #cos: Float64Array;
  readonly #sin: Float64Array;
  /** per head, per frequency: Σ_c a_c (cos ω o_c, sin ω o_c) of the local window and slash lines */
  readonly #rotP: Float64Array[];
  readonly #rotQ: Float64Array[];
  readonly #qNoise: number;
  readonly #topicCache = new Map<number, Float64Array>();
  /** per head: the query topic of the last span generated (query topics change every 64 rows) */
  readonly #qTopic: Float64Array[];
  readonly #qTopicSpan: Float64Array;

  constructor(
    readonly seed: number,
    readonly n: number,
    readonly H: number,
    readonly Hkv: number,
    readonly L: Layout,
    readonly groups: Group[],
    readonly plans: HeadPlan[],
    readonly sinkW: Float64Array,
    readonly dtype: DType,
  ) {
    const F = L.freqs.length;
    const Fs = slashFreqs(L);
    this.#row = new Float64Array(L.d);
    this.#cos = new Float64Array(F);
    this.#sin = new Float64Array(F);
    const sd = Math.sqrt(L.d);
    this.#rotP = plans.map((p) => {
      const P = new Float64Array(F);
      for (let f = 0; f < F; f++) {
        P[f] = (p.local / F) * sd;
        if (f < Fs) for (const s of p.slash) P[f] += (s.amp / Fs) * sd * Math.cos(L.freqs[f] * s.offset);
      }
      return P;
    });
    this.#rotQ = plans.map((p) => {
      const Q = new Float64Array(F);
      for (let f = 0; f < Fs; f++) for (const s of p.slash) Q[f] += (s.amp / Fs) * sd * Math.sin(L.freqs[f] * s.offset);
      return Q;
    });
    this.#qTopic = plans.map(() => new Float64Array(L.topicDims));
    this.#qTopicSpan = new Float64Array(plans.length).fill(-1);
    this.#qNoise = L.noiseDims > 0 ? NOISE_LOGIT_STD * Math.sqrt(L.d / L.noiseDims) : 0;
  }

  #keyTopic(g: number, seg: number): Float64Array {
    const key = seg * 4096 + g;
    let t = this.#topicCache.get(key);
    if (!t) {
      if (this.#topicCache.size > 4096) this.#topicCache.clear();
      t = new Float64Array(this.L.topicDims);
      if (seg > 0) fillTopic(this.seed, S_TOPIC, g, seg, t, 1 / Math.sqrt(this.L.topicDims));
      this.#topicCache.set(key, t);
    }
    return t;
  }

  rows(start: number, end: number): ScenarioChunk {
    const { n, H, Hkv, L } = this;
    if (!Number.isInteger(start) || !Number.isInteger(end) || start < 0 || end > n || start >= end) {
      throw new InvalidArgumentError(`rows(start, end) needs integers 0 <= start < end <= ${n}; got ${start}, ${end}`);
    }
    const m = end - start;
    const d = L.d;
    const f32 = this.dtype === 'f32';
    const alloc = (len: number) => (f32 ? new Float32Array(len) : new Uint16Array(len));
    const q = alloc(m * H * d);
    const k = alloc(m * Hkv * d);
    const v = alloc(m * Hkv * d);
    const conv = this.dtype === 'bf16' ? f32ToBf16Bits : f32ToF16Bits;
    const row = this.#row;
    const put = (dst: Float32Array | Uint16Array, off: number, perm: Int32Array, sign: Float64Array) => {
      if (f32) for (let c = 0; c < d; c++) dst[off + perm[c]] = sign[c] * row[c];
      else for (let c = 0; c < d; c++) dst[off + perm[c]] = conv(sign[c] * row[c]);
    };
    const F = L.freqs.length;
    const sd = Math.sqrt(d);
    const rng = this.#rng;
    for (let i = start; i < end; i++) {
      const r = i - start;
      for (let f = 0; f < F; f++) {
        this.#cos[f] = Math.cos(L.freqs[f] * i);
        this.#sin[f] = Math.sin(L.freqs[f] * i);
      }
      // Keys and values, per kv head.
      for (let g = 0; g < Hkv; g++) {
        const gr = this.groups[g];
        row.fill(0);
        if (i < this.sinkW.length) row[L.sink] = SINK_K * this.sinkW[i];
        if (gr.stripeSet.has(i)) row[L.stripe] = FLAG_K;
        let needleHere: Needle | undefined;
        for (const nd of gr.needles) {
          if (i >= nd.position && i < nd.position + nd.length) {
            row[L.needle0 + nd.dim] = FLAG_K;
            needleHere = nd;
          }
        }
        const z = keySalience(this.seed, g, i, gr.blockSalience);
        row[L.salience] = needleHere ? needleSalience(z) : z;
        if (i >= this.sinkW.length && !gr.positionFree.has(i)) {
          for (let f = 0; f < F; f++) {
            row[L.rot0 + 2 * f] = this.#cos[f];
            row[L.rot0 + 2 * f + 1] = this.#sin[f];
          }
        }
        const tk = this.#keyTopic(g, Math.floor(i / TOPIC_SEGMENT));
        for (let t = 0; t < L.topicDims; t++) row[L.topic0 + t] = TOPIC_K * tk[t];
        // Sink keys carry no noise: one token holds most of a VS head's mass, so its logit
        // must be the one the strengths were solved for (a 0.35-nat jitter there would move
        // every other mass by up to a factor of two).
        if (i >= this.sinkW.length) rng.reset(hash4(this.seed, S_KNOISE, i, g)).fillGauss(row, L.noise0, d);
        put(k, (r * Hkv + g) * d, gr.perm, gr.sign);
        // Values: Gaussian, except needle tokens carry their needle's own vector.
        if (needleHere) row.set(needleHere.value);
        else {
          rng.reset(hash4(this.seed, S_VNOISE, i, g)).fillGauss(row, 0, d);
        }
        put(v, (r * Hkv + g) * d, gr.perm, gr.sign);
      }
      // Queries, per head.
      for (let h = 0; h < H; h++) {
        const p = this.plans[h];
        const gr = this.groups[p.g];
        row.fill(0);
        row[L.sink] = (p.sink * sd) / SINK_K;
        row[L.salience] = p.salience * sd;
        row[L.stripe] = (p.stripe * sd) / FLAG_K;
        for (const nd of gr.needles) {
          const s = p.needleStrength.get(nd.id);
          if (s === undefined) continue;
          for (const [a, b] of nd.askers) {
            if (i >= a && i < b) row[L.needle0 + nd.dim] = (s * sd) / FLAG_K;
          }
        }
        // Rotary: (cos ωi·P + sin ωi·Q, sin ωi·P − cos ωi·Q) = Σ_c a_c (cos ω(i−o_c), sin ω(i−o_c)).
        const P = this.#rotP[h];
        const Q = this.#rotQ[h];
        for (let f = 0; f < F; f++) {
          row[L.rot0 + 2 * f] = this.#cos[f] * P[f] + this.#sin[f] * Q[f];
          row[L.rot0 + 2 * f + 1] = this.#sin[f] * P[f] - this.#cos[f] * Q[f];
        }
        if (p.topic !== 0) {
          const span = Math.floor(i / QUERY_TOPIC_SPAN);
          if (this.#qTopicSpan[h] !== span) {
            this.#qTopicSpan[h] = span;
            fillQueryTopic(this.seed, h, p.g, span, p.focus, this.#qTopic[h]);
          }
          const qTopic = this.#qTopic[h];
          const c = (p.topic * sd) / TOPIC_K;
          for (let t = 0; t < L.topicDims; t++) row[L.topic0 + t] = c * qTopic[t];
        }
        rng.reset(hash4(this.seed, S_QNOISE, i, h)).fillGauss(row, L.noise0, d, this.#qNoise);
        put(q, (r * H + h) * d, gr.perm, gr.sign);
      }
    }
    return {
      q: wrapHost(this.dtype, [m, H, d], q),
      k: wrapHost(this.dtype, [m, Hkv, d], k),
      v: wrapHost(this.dtype, [m, Hkv, d], v),
    };
  }
}
