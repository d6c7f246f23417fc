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
import { assertDType, InvalidArgumentError } from '@crisp/core';
import {
  DIFFUSE_LOCAL_CAP,
  THRESHOLD_LOCAL_CAP,
  fillQueryTopic,
  fillTopic,
  type HeadPlan,
  makeLayout,
  type Needle,
  needleSalience,
  QUERY_TOPIC_SPAN,
  rotaryKernel,
  S_KINDS,
  S_TOPIC,
  SINK_BLOCK,
  SINK_SAMPLE_ROWS,
  keySalience,
  slashFreqs,
  TOPIC_SEGMENT,
} from './layout.js';
import { buildGroups, planHeads } from './plan.js';
import { assignKinds, EXPECTED_ROUTE, getProfile, type Profile, type ProfileName } from './profiles.js';
import { rngFor } from './random.js';
import { RowGenerator } from './rows.js';
import type { GroundTruth, HeadStrengths, Scenario, ScenarioOptions } from './scenario-types.js';
import { type SinkSample, solveMeanSink, solveSink } from './sink.js';

export type {
  GroundTruth,
  HeadStrengths,
  HeadTruth,
  NeedleTruth,
  Scenario,
  ScenarioChunk,
  ScenarioOptions,
} from './scenario-types.js';

function checkInt(name: string, x: unknown, lo: number, hi: number): number {
  if (typeof x !== 'number' || !Number.isInteger(x) || x < lo || x > hi) {
    throw new InvalidArgumentError(`${name} must be an integer in [${lo}, ${hi}]; got ${String(x)}`);
  }
  return x;
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

  const { groups, needles } = buildGroups(prof, seed, n, d, Hkv, group, kinds, L);

  // --- heads: kinds and parameters -----------------------------------------------------
  const plans = planHeads(prof, seed, n, H, group, kinds, groups, opts.slashOffsets);

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
    fillQueryTopic(seed, h, plans[h].g, Math.floor(i / QUERY_TOPIC_SPAN), plans[h].focus, t);
    return t;
  };
  const salienceCache: Float64Array[] = [];
  const salienceOf = (g: number): Float64Array => {
    if (!salienceCache[g]) {
      const z = Float64Array.from({ length: n }, (_, j) => keySalience(seed, g, j, groups[g].blockSalience));
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
   * at the proxy rows is at most `cap` (DIFFUSE_LOCAL_CAP). A near-threshold retrieval head gets
   * the same treatment with THRESHOLD_LOCAL_CAP, so its C_struct is its sink plus a few percent.
   */
  const capLocalMass = (p: HeadPlan, h: number, cap: number) => {
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
    if (share(p.local) <= cap) return;
    let lo = -8;
    let hi = p.local;
    for (let it = 0; it < 30; it++) {
      const mid = (lo + hi) / 2;
      if (share(mid) > cap) hi = mid;
      else lo = mid;
    }
    p.local = lo;
  };
  const asks = (nd: Needle, i: number) => nd.askers.some(([a, b]) => i >= a && i < b);
  for (let h = 0; h < H; h++) {
    const p = plans[h];
    const gr = groups[p.g];
    const i = n - 1;
    if (p.kind === 'diffuse') capLocalMass(p, h, DIFFUSE_LOCAL_CAP);
    if (p.kind === 'near-threshold-retrieval') capLocalMass(p, h, THRESHOLD_LOCAL_CAP);
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
      expectedRoute: EXPECTED_ROUTE[p.kind],
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
