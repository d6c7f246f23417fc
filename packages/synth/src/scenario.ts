/**
 * Seeded structured Q/K/V whose attention looks like a real long-context model's.
 *
 * Shape legend: n tokens, H query heads, Hkv kv heads (H % Hkv == 0), d head dim;
 * q [n, H, d], k and v [n, Hkv, d], row-major. Query head h reads kv head floor(h / (H / Hkv)).
 *
 * Each logit is a sum of features, each living in its own channels of q and k (then the
 * channels are permuted and sign-flipped per kv group so vectors do not look axis-aligned):
 *
 *   L_h(i, j) = S_h·sink(j)                       attention sink on the first tokens
 *             + σ_h·z(j)                          heavy-tailed salience: block masses span decades
 *             + A_h·K(i - j)                      rotary local window, K(δ) = mean_f cos(ω_f δ)
 *             + Σ_s A_s·K(i - j - o_s)            slash lines at offsets o_s
 *             + V_h·stripe(j)                     vertical stripes on a few key tokens
 *             + Σ_m N_hm·asks_m(i)·needle_m(j)    retrieval needles, only for asker rows i
 *             + κ_h·t_h(i)·t(j)                   content topics (diffuse heads)
 *             + noise
 *
 * with the softmax scale 1/sqrt(d). Strengths S, V and N are solved per head so the masses
 * hit their targets at the last query row whatever n is: the sink keeps 0.6-0.95 of a VS
 * head's mass at 4k and at 512k, as in the paper. Every value is a pure function of
 * (seed, row, head), so `rows(start, end)` is identical however a scenario is chunked.
 */
import {
  type DType,
  f32ToBf16Bits,
  f32ToF16Bits,
  type HostTensor,
  InvalidArgumentError,
  assertDType,
  wrapHost,
} from '@crisp/core';
import { assignKinds, getProfile, type HeadKind, type Profile, type ProfileName, type Range } from './profiles.js';
import { gaussFromBits, hash4, RowRng, rngFor } from './random.js';

export interface ScenarioOptions {
  /** tokens (default 4096) */
  readonly n?: number;
  /** query heads H (default 8) */
  readonly heads?: number;
  /** kv heads Hkv (default 2; H % Hkv == 0) */
  readonly kvHeads?: number;
  /** head dim d (default 64; even, >= 32) */
  readonly headDim?: number;
  /** element type of the generated tensors (default f32) */
  readonly dtype?: DType;
  /** any 32-bit integer (default 1) */
  readonly seed?: number;
  /** slash offsets (tokens) for slash heads; default: drawn per head from [200, min(n/3, 16384)] */
  readonly slashOffsets?: readonly number[];
}

/** One planted retrieval needle: key tokens [position, position + length) of one kv head. */
export interface NeedleTruth {
  readonly id: number;
  readonly kvHead: number;
  readonly position: number;
  readonly length: number;
  /** query heads that read it (the retrieval heads of its kv group) */
  readonly readers: readonly number[];
  /** query rows that attend to it: [start, end) ranges, ascending */
  readonly askers: readonly (readonly [number, number])[];
  /** whether its askers include the last rows (so the proxy map can see it) */
  readonly visibleToProxy: boolean;
}

export interface HeadTruth {
  readonly head: number;
  readonly kvHead: number;
  readonly kind: HeadKind;
  /** the route a correct router takes: diffuse heads are PE, the rest VS */
  readonly expectedRoute: 'vs' | 'pe';
  /** sink-token mass aimed for at the last query row */
  readonly sinkTarget: number;
  /** slash offsets in tokens (slash heads) */
  readonly slashOffsets: readonly number[];
  /** needle ids this head reads */
  readonly needles: readonly number[];
}

export interface GroundTruth {
  readonly heads: readonly HeadTruth[];
  readonly needles: readonly NeedleTruth[];
  /** vertical-stripe key tokens per kv head */
  readonly stripes: readonly (readonly number[])[];
  /** tokens carrying the attention sink */
  readonly sinkTokens: number;
}

export interface ScenarioChunk {
  /** [end - start, H, d] */
  readonly q: HostTensor;
  /** [end - start, Hkv, d] */
  readonly k: HostTensor;
  /** [end - start, Hkv, d] */
  readonly v: HostTensor;
}

/** The solved per-head logit strengths (nats), for reports and tests. */
export interface HeadStrengths {
  readonly sink: number;
  readonly salience: number;
  readonly local: number;
  readonly slash: readonly { readonly offset: number; readonly amp: number }[];
  readonly stripe: number;
  readonly topic: number;
  /** needle id -> strength */
  readonly needles: ReadonlyMap<number, number>;
}

export interface Scenario {
  readonly profile: ProfileName;
  readonly description: string;
  readonly n: number;
  readonly heads: number;
  readonly kvHeads: number;
  readonly headDim: number;
  readonly dtype: DType;
  readonly seed: number;
  /** the softmax scale the logits were designed for */
  readonly scale: number;
  readonly truth: GroundTruth;
  readonly strengths: readonly HeadStrengths[];
  /** Rows [start, end) of q, k and v as host tensors. Deterministic, chunk-invariant. */
  rows(start: number, end: number): ScenarioChunk;
}

// ---------------------------------------------------------------------------------------
// Channel layout and fixed generator constants.

const SINK_K = 4; // key value on sink tokens (times the sink weight)
const FLAG_K = 4; // key value on stripe and needle tokens
const TOPIC_K = 2; // key topic vectors are scaled by this
const SALIENCE_COARSE = 256; // tokens per coarse salience segment
const SALIENCE_FINE = 64; // tokens per fine salience span
const TOPIC_SEGMENT = 384; // tokens per content segment (a "document")
const QUERY_TOPIC_SPAN = 128; // query rows sharing one query topic (one block at B = 128)
const NOISE_LOGIT_STD = 0.35; // token-level logit jitter (nats)
const NEEDLE_VALUE = 3; // needle tokens carry a distinct, larger value vector
const DIFFUSE_LOCAL_CAP = 0.08; // most a diffuse head puts on the last 128 keys at the proxy rows
const SINK_BLOCK = 128; // the sink block whose mass is targeted (p_v[0] at B = 128)
const SINK_SAMPLE_ROWS = 4; // rows (every 32nd of the last 128, the proxy rows) where the non-sink mass is summed

// Streams for the counter hash.
const S_KNOISE = 1;
const S_VNOISE = 2;
const S_QNOISE = 3;
const S_TOPIC = 4;
const S_QTOPIC = 5;
const S_SAL_COARSE = 6;
const S_SAL_FINE = 7;
const S_SAL_TAIL = 8;
const S_KINDS = 21;
const S_HEAD = 22;
const S_GROUP = 23;

interface Layout {
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

function makeLayout(d: number): Layout {
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
function salience(seed: number, g: number, j: number): number {
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

/**
 * Salience of a needle key. A planted fact is not salient by itself: only its asker rows find
 * it, through the needle channel (N_hm). Inheriting the span's z(j) (up to 5, times σ_h ≈ 2.5-3
 * nats) would give a needle in a salient span percent-level mass on every row, and N_hm,
 * solved to hit the asker target, would shrink to almost nothing. So a needle key keeps the
 * span's z only where it is at most the background median (0).
 */
function needleSalience(z: number): number {
  return Math.min(z, 0);
}

function fillTopic(seed: number, stream: number, a: number, b: number, out: Float64Array, scale: number): void {
  const r = rngFor(seed, stream, a, b);
  for (let t = 0; t < out.length; t++) out[t] = r.gauss() * scale;
}

interface Needle {
  readonly id: number;
  readonly g: number;
  readonly position: number;
  readonly length: number;
  readonly dim: number; // index among needle channels
  readonly askers: [number, number][];
  readonly visible: boolean;
  readonly value: Float64Array; // [d] value vector on the needle tokens
}

interface Group {
  readonly perm: Int32Array; // channel c of the logical layout goes to perm[c]
  readonly sign: Float64Array;
  readonly stripes: number[];
  readonly stripeSet: Set<number>;
  readonly needles: Needle[];
  /** stripe and needle tokens: keys without rotary phase */
  readonly positionFree: Set<number>;
}

interface HeadPlan {
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
  readonly needleTargets: Map<number, number>;
  readonly needleStrength: Map<number, number>;
}

function pick(r: RowRng, range: Range): number {
  return r.range(range[0], range[1]);
}

function checkInt(name: string, x: unknown, lo: number, hi: number): number {
  if (typeof x !== 'number' || !Number.isInteger(x) || x < lo || x > hi) {
    throw new InvalidArgumentError(`${name} must be an integer in [${lo}, ${hi}]; got ${String(x)}`);
  }
  return x;
}

/** Rotary pairs slash lines use: the high-frequency half. */
function slashFreqs(L: Layout): number {
  return Math.ceil(L.freqs.length / 2);
}

/** K(δ) = mean_f cos(ω_f δ) for δ in [0, n): the rotary kernel, shared by all heads. */
function rotaryKernel(freqs: Float64Array, n: number): Float64Array {
  const K = new Float64Array(n);
  const F = freqs.length;
  for (let f = 0; f < F; f++) {
    const w = freqs[f];
    for (let t = 0; t < n; t++) K[t] += Math.cos(w * t);
  }
  for (let t = 0; t < n; t++) K[t] /= F;
  return K;
}

/** Build a scenario (metadata, ground truth, solved strengths); rows are generated on demand. */
export function scenario(profile: ProfileName | string, opts: ScenarioOptions = {}): Scenario {
  const prof: Profile = getProfile(profile);
  const n = checkInt('n', opts.n ?? 4096, 1, 2 ** 26);
  const H = checkInt('heads', opts.heads ?? 8, 1, 1024);
  const Hkv = checkInt('kvHeads', opts.kvHeads ?? 2, 1, H);
  if (H % Hkv !== 0) {
    throw new InvalidArgumentError(`heads (${H}) must be a multiple of kvHeads (${Hkv}) for GQA`);
  }
  const d = checkInt('headDim', opts.headDim ?? 64, 32, 1024);
  if (d % 2 !== 0) throw new InvalidArgumentError(`headDim must be even (rotary pairs); got ${d}`);
  const dtype = opts.dtype ?? 'f32';
  assertDType(dtype, 'dtype');
  const seed = checkInt('seed', opts.seed ?? 1, -(2 ** 31), 2 ** 32 - 1) >>> 0;
  if (opts.slashOffsets) {
    for (const o of opts.slashOffsets) checkInt('slashOffsets[]', o, 1, Math.max(1, n - 1));
  }
  const L = makeLayout(d);
  const group = H / Hkv;
  const kindRng = rngFor(seed, S_KINDS);
  const kinds = assignKinds(prof.mix, H, () => kindRng.uniform());

  // --- kv groups: channel permutation, stripes, needles --------------------------------
  const groups: Group[] = [];
  const needles: Needle[] = [];
  for (let g = 0; g < Hkv; g++) {
    const r = rngFor(seed, S_GROUP, g);
    const perm = Int32Array.from({ length: d }, (_, i) => i);
    for (let i = d - 1; i > 0; i--) {
      const j = r.int(0, i + 1);
      [perm[i], perm[j]] = [perm[j], perm[i]];
    }
    const sign = Float64Array.from({ length: d }, () => (r.uniform() < 0.5 ? -1 : 1));
    const stripes: number[] = [];
    if (n >= 1024) {
      const count = 4;
      for (let s = 0; s < count; s++) {
        const p = r.int(prof.sinkTokens + 64, n - 256);
        const w = r.int(1, 3);
        for (let t = 0; t < w; t++) stripes.push(p + t);
      }
    }
    stripes.sort((a, b) => a - b);
    const readers: number[] = [];
    for (let h = g * group; h < (g + 1) * group; h++) if (kinds[h] === 'retrieval') readers.push(h);
    const groupNeedles: Needle[] = [];
    if (readers.length > 0 && n >= 1024) {
      const count = Math.min(prof.needlesPerGroup, L.needleDims);
      // Needles sit in distinct 64-token slots (so one needle never straddles two blocks at
      // B = 64 or 128) between the sink block and the last 512 tokens.
      const slots = Math.floor((n - 512) / 64) - 2;
      const used = new Set<number>();
      for (let m = 0; m < count && used.size < slots; m++) {
        let slot: number;
        do slot = 2 + r.int(0, slots);
        while (used.has(slot));
        used.add(slot);
        const length = r.int(8, 17);
        const position = slot * 64 + r.int(0, 64 - length + 1);
        const hidden = m > 0 && r.uniform() < prof.hiddenNeedleShare;
        const askers: [number, number][] = [];
        if (!hidden) {
          // The question at the end: some rows of the last block ask for it.
          const qlen = r.int(24, 97);
          askers.push([n - qlen, n]);
        } else {
          // Only a span of mid-sequence queries refers back to it.
          const lo = position + 256;
          const hi = n - 256;
          const start = lo < hi ? r.int(lo, hi) : lo;
          askers.push([Math.min(start, n - 160), Math.min(start, n - 160) + 32]);
        }
        const value = new Float64Array(d);
        for (let c = 0; c < d; c++) value[c] = (r.uniform() < 0.5 ? -1 : 1) * NEEDLE_VALUE;
        const nd: Needle = {
          id: needles.length,
          g,
          position,
          length,
          dim: m,
          askers,
          visible: !hidden,
          value,
        };
        needles.push(nd);
        groupNeedles.push(nd);
      }
    }
    const positionFree = new Set(stripes);
    for (const nd of groupNeedles) for (let t = 0; t < nd.length; t++) positionFree.add(nd.position + t);
    groups.push({ perm, sign, stripes, stripeSet: new Set(stripes), needles: groupNeedles, positionFree });
  }

  // --- heads: kinds and parameters -----------------------------------------------------
  const plans: HeadPlan[] = [];
  for (let h = 0; h < H; h++) {
    const r = rngFor(seed, S_HEAD, h);
    const kind = kinds[h];
    const g = Math.floor(h / group);
    const isDiffuse = kind === 'diffuse';
    const slash: { offset: number; amp: number }[] = [];
    if (kind === 'slash' && n >= 1024) {
      const lines = Math.round(pick(r, prof.slashLines));
      for (let s = 0; s < lines; s++) {
        const given = opts.slashOffsets;
        const offset = given?.length
          ? given[(h + s) % given.length]
          : r.int(200, Math.max(201, Math.min(Math.floor(n / 3), 16384)));
        slash.push({ offset, amp: pick(r, prof.slashAmp) });
      }
    }
    const needleTargets = new Map<number, number>();
    if (kind === 'retrieval') for (const nd of groups[g].needles) needleTargets.set(nd.id, pick(r, prof.needleMass));
    plans.push({
      kind,
      g,
      sinkTarget: isDiffuse ? pick(r, prof.diffuseSinkMass) : pick(r, prof.sinkMass),
      sink: 0,
      salience: isDiffuse ? pick(r, prof.salienceDiffuse) : pick(r, prof.salienceVs),
      local: isDiffuse ? r.range(0.5, 1.5) : pick(r, prof.localAmp),
      slash,
      stripe: 0,
      stripeTarget: kind === 'vertical' && groups[g].stripes.length > 0 ? pick(r, prof.stripeMass) : 0,
      topic: isDiffuse ? pick(r, prof.topicDiffuse) : 0.4,
      needleTargets,
      needleStrength: new Map(),
    });
  }

  // --- solve strengths so masses hit their targets at the calibration rows --------------
  const K = rotaryKernel(L.freqs, n);
  // Slash lines use only the high-frequency half of the rotary pairs: a thin diagonal (a few
  // tokens wide) instead of the local window's broad, slowly decaying band.
  const Ks = rotaryKernel(L.freqs.subarray(0, slashFreqs(L)), n);
  const sinkW = Float64Array.from({ length: Math.min(prof.sinkTokens, n) }, (_, j) => prof.sinkWeight(j));
  const sinkCount = sinkW.length;
  const topicKeys = new Map<string, Float64Array>();
  const keyTopic = (g: number, seg: number): Float64Array => {
    const key = `${g}:${seg}`;
    let t = topicKeys.get(key);
    if (!t) {
      t = new Float64Array(L.topicDims);
      // Segment 0 (the prompt's start, holding the sink block) has no topic: content heads
      // do not pile mass there by chance, so their sink block stays small.
      if (seg > 0) fillTopic(seed, S_TOPIC, g, seg, t, 1 / Math.sqrt(L.topicDims));
      topicKeys.set(key, t);
    }
    return t;
  };
  const queryTopic = (h: number, i: number): Float64Array => {
    const t = new Float64Array(L.topicDims);
    fillTopic(seed, S_QTOPIC, h, Math.floor(i / QUERY_TOPIC_SPAN), t, 1);
    return t;
  };
  const salienceCache: Float64Array[] = [];
  const salienceOf = (g: number): Float64Array => {
    if (!salienceCache[g]) {
      const z = Float64Array.from({ length: n }, (_, j) => salience(seed, g, j));
      for (const nd of groups[g].needles) {
        for (let j = nd.position; j < nd.position + nd.length; j++) z[j] = needleSalience(z[j]);
      }
      salienceCache[g] = z;
    }
    return salienceCache[g];
  };

  /** Logits of head h at query row i over keys 0..i without the sink, stripes and needles. */
  const baseLogits = (h: number, i: number, upto = i): Float64Array => {
    const p = plans[h];
    const z = salienceOf(p.g);
    const positionFree = groups[p.g].positionFree;
    const out = new Float64Array(upto + 1);
    const tq = queryTopic(h, i);
    let seg = -1;
    let topicDot = 0;
    for (let j = 0; j <= upto; j++) {
      const s = Math.floor(j / TOPIC_SEGMENT);
      if (s !== seg) {
        seg = s;
        const tk = keyTopic(p.g, s);
        topicDot = 0;
        for (let t = 0; t < tq.length; t++) topicDot += tq[t] * tk[t];
      }
      let x = p.salience * z[j] + p.topic * topicDot;
      // Sink, stripe and needle keys carry no rotary phase (position-free, like real models'
      // massive sink activations, always-attended delimiters and content-matched facts), so
      // their mass does not swing from row to row with the rotary terms.
      if (j >= sinkCount && !positionFree.has(j)) {
        x += p.local * K[i - j];
        for (const sl of p.slash) x += sl.amp * Ks[Math.abs(i - j - sl.offset)];
      }
      out[j] = x;
    }
    return out;
  };

  /**
   * A diffuse (PE) head's content topics can happen to favour the segment the last queries
   * sit in, piling mass on the local window and making C_struct look like a VS head's. Lower
   * (down to negative: a recency penalty) its rotary local amplitude until the last-block mass
   * at the proxy rows is at most DIFFUSE_LOCAL_CAP.
   */
  const capLocalMass = (p: HeadPlan, h: number) => {
    const rows = [n - 1, Math.max(0, n - 128)];
    const share = (A: number) => {
      let worst = 0;
      for (const row of rows) {
        const b = baseLogits(h, row);
        let all = 0;
        let local = 0;
        for (let j = 0; j <= row; j++) {
          const e = Math.exp(b[j] + (j >= sinkCount ? (A - p.local) * K[row - j] : 0));
          all += e;
          if (j >= n - 128) local += e;
        }
        worst = Math.max(worst, local / all);
      }
      return worst;
    };
    if (share(p.local) <= DIFFUSE_LOCAL_CAP) return;
    let lo = -8;
    let hi = p.local;
    for (let it = 0; it < 30; it++) {
      const mid = (lo + hi) / 2;
      if (share(mid) > DIFFUSE_LOCAL_CAP) hi = mid;
      else lo = mid;
    }
    p.local = lo;
  };
  const asks = (nd: Needle, i: number) => nd.askers.some(([a, b]) => i >= a && i < b);
  for (let h = 0; h < H; h++) {
    const p = plans[h];
    const gr = groups[p.g];
    const i = n - 1;
    if (p.kind === 'diffuse') capLocalMass(p, h);
    const base = baseLogits(h, i);
    const inSet = new Uint8Array(i + 1);
    for (let j = 0; j < sinkW.length; j++) inSet[j] = 1;
    const stripeTokens = p.stripeTarget > 0 ? gr.stripes : [];
    for (const j of stripeTokens) inSet[j] = 1;
    const active = gr.needles.filter((nd) => p.needleTargets.has(nd.id) && asks(nd, i));
    for (const nd of active) for (let j = nd.position; j < nd.position + nd.length; j++) inSet[j] = 1;
    let rest = 0;
    for (let j = 0; j <= i; j++) if (!inSet[j]) rest += Math.exp(base[j]);
    let structured = p.sinkTarget + p.stripeTarget;
    for (const nd of active) structured += p.needleTargets.get(nd.id)!;
    // Keep at least 5% for everything else, so the targets stay reachable.
    const squeeze = structured > 0.95 ? 0.95 / structured : 1;
    const Z = rest / Math.max(1 - structured * squeeze, 0.05);
    const sumExp = (tokens: Iterable<number>) => {
      let s = 0;
      for (const j of tokens) s += Math.exp(base[j]);
      return s;
    };
    if (p.stripeTarget > 0) p.stripe = Math.log((p.stripeTarget * squeeze * Z) / sumExp(stripeTokens));
    for (const nd of active) {
      const toks = Array.from({ length: nd.length }, (_, t) => nd.position + t);
      p.needleStrength.set(nd.id, Math.log((p.needleTargets.get(nd.id)! * squeeze * Z) / sumExp(toks)));
    }
    p.sink = solveSink(base, sinkW, p.sinkTarget * squeeze * Z);
    // The sink's own logits move from row to row (rotary phase, query topic), and the
    // calibration tools read the mean over the last block of queries (the proxy rows): refine S
    // so the mean sink mass over a sample of those rows meets the target.
    // "other" (everything after the sink block) is a sum over n tokens and moves slowly, so
    // it is computed on every 32nd row; the sink block's own logits on every proxy row.
    const others: { row: number; other: number }[] = [];
    for (let t = 0; t < SINK_SAMPLE_ROWS && t * 32 < n; t++) {
      const row = n - 1 - 32 * t;
      const b = t === 0 ? base : baseLogits(h, row);
      let other = 0;
      for (let j = Math.min(SINK_BLOCK, row + 1); j <= row; j++) {
        let x = b[j];
        if (p.stripe !== 0 && gr.stripeSet.has(j)) x += p.stripe;
        for (const nd of active) {
          if (j >= nd.position && j < nd.position + nd.length && asks(nd, row)) x += p.needleStrength.get(nd.id)!;
        }
        other += Math.exp(x);
      }
      others.push({ row, other });
    }
    const sample: SinkSample[] = [];
    for (let row = n - 1; row >= Math.max(sinkW.length, n - 32 * SINK_SAMPLE_ROWS); row--) {
      // the nearest sampled row that shares this row's query topic span
      const span = Math.floor(row / QUERY_TOPIC_SPAN);
      let best = others[0];
      for (const o of others) {
        const same = Math.floor(o.row / QUERY_TOPIC_SPAN) === span;
        const bestSame = Math.floor(best.row / QUERY_TOPIC_SPAN) === span;
        if ((same && !bestSame) || (same === bestSame && Math.abs(o.row - row) < Math.abs(best.row - row))) best = o;
      }
      // Block-0 tokens after the sink count toward the sink block's mass, as p_v[0] does.
      const head = baseLogits(h, row, Math.min(SINK_BLOCK, row + 1) - 1);
      let blockRest = 0;
      for (let j = sinkW.length; j < head.length; j++) {
        blockRest += Math.exp(head[j] + (p.stripe !== 0 && gr.stripeSet.has(j) ? p.stripe : 0));
      }
      sample.push({ sinkBase: head.subarray(0, sinkW.length), blockRest, other: best.other });
    }
    if (sample.length === 0) sample.push({ sinkBase: base.subarray(0, sinkW.length), blockRest: 0, other: others[0].other });
    p.sink = solveMeanSink(sample, sinkW, p.sinkTarget);
    // The stripe and needle strengths were solved against the sink's target at the last row;
    // the sink now has its final strength, so solve them once more against the real rest.
    if (p.stripeTarget > 0 || active.length > 0) {
      const full = (j: number) => {
        let x = base[j];
        if (j < sinkW.length) x += p.sink * sinkW[j];
        if (p.stripe !== 0 && gr.stripeSet.has(j)) x += p.stripe;
        for (const nd of active) if (j >= nd.position && j < nd.position + nd.length) x += p.needleStrength.get(nd.id)!;
        return x;
      };
      const resolve = (tokens: number[], current: number, target: number) => {
        let inside = 0;
        let total = 0;
        for (let j = 0; j <= i; j++) total += Math.exp(full(j));
        for (const j of tokens) inside += Math.exp(full(j));
        const rest = total - inside;
        // e^{S'} · inside · e^{-S} = target / (1 - target) · rest
        return current + Math.log(((target / (1 - target)) * rest) / inside);
      };
      if (p.stripeTarget > 0) p.stripe = resolve(stripeTokens, p.stripe, p.stripeTarget);
      for (const nd of active) {
        const toks = Array.from({ length: nd.length }, (_, t) => nd.position + t);
        p.needleStrength.set(nd.id, resolve(toks, p.needleStrength.get(nd.id)!, p.needleTargets.get(nd.id)!));
      }
    }
    // Needles only mid-sequence rows ask for: solve at their last asker row.
    for (const nd of gr.needles) {
      if (!p.needleTargets.has(nd.id) || p.needleStrength.has(nd.id)) continue;
      const row = nd.askers[nd.askers.length - 1][1] - 1;
      const b = baseLogits(h, row);
      let other = 0;
      let inside = 0;
      for (let j = 0; j <= row; j++) {
        if (j >= nd.position && j < nd.position + nd.length) {
          inside += Math.exp(b[j]);
          continue;
        }
        let x = b[j];
        if (j < sinkW.length) x += p.sink * sinkW[j];
        if (p.stripe !== 0 && gr.stripeSet.has(j)) x += p.stripe;
        other += Math.exp(x);
      }
      const f = p.needleTargets.get(nd.id)!;
      p.needleStrength.set(nd.id, Math.log(((f / (1 - f)) * other) / inside));
    }
  }

  const strengths: HeadStrengths[] = plans.map((p) => ({
    sink: p.sink,
    salience: p.salience,
    local: p.local,
    slash: p.slash.map((s) => ({ ...s })),
    stripe: p.stripe,
    topic: p.topic,
    needles: new Map(p.needleStrength),
  }));

  const truth: GroundTruth = {
    sinkTokens: sinkW.length,
    stripes: groups.map((gr) => [...gr.stripes]),
    needles: needles.map((nd) => ({
      id: nd.id,
      kvHead: nd.g,
      position: nd.position,
      length: nd.length,
      readers: plans.flatMap((p, h) => (p.needleTargets.has(nd.id) ? [h] : [])),
      askers: nd.askers.map(([a, b]) => [a, b] as const),
      visibleToProxy: nd.visible,
    })),
    heads: plans.map((p, h) => ({
      head: h,
      kvHead: p.g,
      kind: p.kind,
      expectedRoute: p.kind === 'diffuse' ? 'pe' : 'vs',
      sinkTarget: p.sinkTarget,
      slashOffsets: p.slash.map((s) => s.offset),
      needles: [...p.needleTargets.keys()],
    })),
  };

  const gen = new RowGenerator(seed, n, H, Hkv, L, groups, plans, sinkW, dtype);
  return {
    profile: prof.name,
    description: prof.description,
    n,
    heads: H,
    kvHeads: Hkv,
    headDim: d,
    dtype,
    seed,
    scale: 1 / Math.sqrt(d),
    truth,
    strengths,
    rows: (start, end) => gen.rows(start, end),
  };
}

interface SinkSample {
  /** base logits of the sink tokens at one row */
  readonly sinkBase: Float64Array;
  /** Σ exp(logit) of the other tokens of the sink block */
  readonly blockRest: number;
  /** Σ exp(logit) of every token after the sink block */
  readonly other: number;
}

/** S with the mean over sampled rows of the sink block's mass equal to `target` (monotone in S). */
function solveMeanSink(sample: SinkSample[], w: Float64Array, target: number): number {
  const mean = (S: number) => {
    let m = 0;
    for (const { sinkBase, blockRest, other } of sample) {
      let s = blockRest;
      for (let j = 0; j < sinkBase.length; j++) s += Math.exp(S * w[j] + sinkBase[j]);
      m += s / (s + other);
    }
    return m / sample.length;
  };
  let lo = -40;
  let hi = 80;
  for (let it = 0; it < 100; it++) {
    const mid = (lo + hi) / 2;
    if (mean(mid) < target) lo = mid;
    else hi = mid;
  }
  return (lo + hi) / 2;
}

/** S with Σ_j exp(S·w_j + base_j) over sink tokens equal to `target` (monotone in S). */
function solveSink(base: Float64Array, w: Float64Array, target: number): number {
  const f = (S: number) => {
    let s = 0;
    for (let j = 0; j < w.length && j < base.length; j++) s += Math.exp(S * w[j] + base[j]);
    return s;
  };
  let lo = -40;
  let hi = 80;
  for (let it = 0; it < 100; it++) {
    const mid = (lo + hi) / 2;
    if (f(mid) < target) lo = mid;
    else hi = mid;
  }
  return (lo + hi) / 2;
}

// ---------------------------------------------------------------------------------------

/** Produces rows; holds the per-head constants of q so each row costs O((H + Hkv) d). */
class RowGenerator {
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
        const z = salience(this.seed, g, i);
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
            fillTopic(this.seed, S_QTOPIC, h, span, this.#qTopic[h], 1);
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
