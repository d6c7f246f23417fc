/**
 * Scenario profiles: how many heads of each kind, and the ranges their parameters are drawn
 * from. Targets follow what the CRISP paper reports for real long-context models: VS heads
 * put 0.6-0.95 of a proxy row's mass on the sink block, the top-1 mass block of >= 90% of
 * heads is the sink or the local window (Llama 91.3%, Qwen 98.3%), and block masses span
 * several decades on a log axis (paper Figure 1).
 */
import { InvalidArgumentError } from '@crisp/core';

/**
 * Head kinds (ground truth):
 * - `sink-local`: attention sink + rotary local window over a heavy-tailed background (VS);
 * - `slash`: as sink-local plus slash lines at fixed offsets (VS);
 * - `vertical`: as sink-local plus vertical stripes on a few key tokens (VS);
 * - `retrieval`: as sink-local plus retrieval needles that only some query rows attend to (VS);
 * - `diffuse`: weak sink, content (topic) driven, high entropy (PE);
 * - `near-threshold-retrieval`: a sharp sink holding only 0.08-0.17 of the mass and a capped
 *   local window, so C_struct sits just under τ_proxy = 0.2, plus retrieval needles the last
 *   rows ask for (and earlier query spans too) over a block-correlated background. Its mass is
 *   on a few key blocks and token-level needles, which the noise floor finds and a pooled map
 *   of block means dilutes: VS is the right route, and C_struct sends it to PE;
 * - `sink-topic`: a real sink (C_struct well above τ_proxy) whose remaining mass follows
 *   content topics that change from one query block to the next. The last rows' vertical and
 *   slash lists describe only their own topic; the pooled map has a row per query block: PE is
 *   the right route, and C_struct sends it to VS.
 */
export type HeadKind = 'sink-local' | 'slash' | 'vertical' | 'retrieval' | 'diffuse' | 'near-threshold-retrieval' | 'sink-topic';
export const HEAD_KINDS: readonly HeadKind[] = [
  'sink-local',
  'slash',
  'vertical',
  'retrieval',
  'diffuse',
  'near-threshold-retrieval',
  'sink-topic',
];

/** The route that serves a head of each kind best (the ground truth a router is scored on). */
export const EXPECTED_ROUTE: Readonly<Record<HeadKind, 'vs' | 'pe'>> = Object.freeze({
  'sink-local': 'vs',
  slash: 'vs',
  vertical: 'vs',
  retrieval: 'vs',
  diffuse: 'pe',
  'near-threshold-retrieval': 'vs',
  'sink-topic': 'pe',
});

export type ProfileName = 'llama-like' | 'qwen-like' | 'retrieval' | 'diffuse' | 'mixed-threshold' | 'vs-trap';
/** Profiles calibrated to the CRISP paper's measurements of real models. */
export const PROFILE_NAMES: readonly ProfileName[] = ['llama-like', 'qwen-like', 'retrieval', 'diffuse'];
/**
 * Profiles built around a known failure of hard C_struct routing (heads a fixed threshold
 * sends the wrong way), to measure guarded or soft routing on. They miss the calibration
 * targets on purpose (near-threshold heads have a 0.08-0.17 sink).
 */
export const ROUTING_FAILURE_PROFILE_NAMES: readonly ProfileName[] = ['mixed-threshold', 'vs-trap'];
/** Every profile `scenario` accepts. */
export const ALL_PROFILE_NAMES: readonly ProfileName[] = [...PROFILE_NAMES, ...ROUTING_FAILURE_PROFILE_NAMES];

export type Range = readonly [number, number];

export interface Profile {
  readonly name: ProfileName;
  readonly description: string;
  /** share of query heads per kind (rounded by largest remainder, then shuffled by seed); a kind left out gets none */
  readonly mix: Readonly<Partial<Record<HeadKind, number>>>;
  /** sink-block mass targets of VS heads at the last query row */
  readonly sinkMass: Range;
  /** sink-block mass targets of diffuse heads */
  readonly diffuseSinkMass: Range;
  /** tokens carrying the sink, and the sink weight of token j < sinkTokens (1 at j = 0) */
  readonly sinkTokens: number;
  readonly sinkWeight: (j: number) => number;
  /** needles per kv group that has a retrieval head */
  readonly needlesPerGroup: number;
  /** mass a reader head puts on one needle at its calibration row */
  readonly needleMass: Range;
  /** share of needles attended only by mid-sequence queries (invisible to the proxy) */
  readonly hiddenNeedleShare: number;
  /** heavy-tailed background: std (nats) of the salience field for VS and diffuse heads */
  readonly salienceVs: Range;
  readonly salienceDiffuse: Range;
  /** rotary local-window peak (nats) */
  readonly localAmp: Range;
  /** slash-line peak (nats) and lines per slash head */
  readonly slashAmp: Range;
  readonly slashLines: Range;
  /** total mass on vertical stripes for vertical heads */
  readonly stripeMass: Range;
  /** topic (content) logit std for diffuse heads (nats) */
  readonly topicDiffuse: Range;
  /**
   * std of a heavy-tailed salience level shared by the 128 tokens of each key block (0: none),
   * added to the background of every head of the profile: a few key blocks then hold much of
   * the non-anchor mass, as topical passages do in real prompts
   */
  readonly blockSalience: number;
  /** mid-sequence query spans that ask for each visible needle besides the last rows (0: none) */
  readonly needleAskerSpans: number;
  /**
   * When set, each visible needle's question is its own span of this many rows (inclusive)
   * inside the last 128 rows, one question per needle, instead of the last 24-96 rows asking
   * for every visible needle at once
   */
  readonly questionRows?: Range;
  /** `near-threshold-retrieval` heads: sink-block mass targets (C_struct adds at most ~0.03 of local mass) */
  readonly thresholdSinkMass: Range;
  /** `near-threshold-retrieval` heads: mass on one needle at its asker rows, and the salience std */
  readonly thresholdNeedleMass: Range;
  readonly salienceThreshold: Range;
  /** `sink-topic` heads: sink-block mass targets, topic logit std (nats) and salience std */
  readonly topicSinkMass: Range;
  readonly topicSink: Range;
  readonly salienceTopicSink: Range;
}

const llama: Profile = {
  name: 'llama-like',
  description: 'Llama-3.1-like: a sharp one-token sink, mostly VS heads, a few retrieval and diffuse heads',
  mix: { 'sink-local': 0.4, slash: 0.2, vertical: 0.15, retrieval: 0.17, diffuse: 0.08 },
  sinkMass: [0.74, 0.93],
  diffuseSinkMass: [0.02, 0.05],
  sinkTokens: 4,
  sinkWeight: (j) => (j === 0 ? 1 : 0.55),
  needlesPerGroup: 2,
  needleMass: [0.06, 0.18],
  hiddenNeedleShare: 0.34,
  salienceVs: [2.4, 3.0],
  salienceDiffuse: [0.8, 1.2],
  localAmp: [3.5, 5.5],
  slashAmp: [4.5, 6],
  slashLines: [1, 2],
  stripeMass: [0.06, 0.14],
  topicDiffuse: [1.8, 2.4],
  blockSalience: 0,
  needleAskerSpans: 0,
  thresholdSinkMass: [0.08, 0.17],
  thresholdNeedleMass: [0.35, 0.55],
  salienceThreshold: [0.8, 1.1],
  topicSinkMass: [0.22, 0.4],
  topicSink: [3, 4],
  salienceTopicSink: [0.5, 0.8],
};

const qwen: Profile = {
  ...llama,
  name: 'qwen-like',
  description: 'Qwen2.5-like: sink mass spread over the first 32 tokens and more varied across heads',
  mix: { 'sink-local': 0.38, slash: 0.25, vertical: 0.15, retrieval: 0.17, diffuse: 0.05 },
  sinkMass: [0.66, 0.93],
  salienceVs: [2.6, 3.1],
  sinkTokens: 32,
  // A slowly falling weight spreads the sink over ~32 tokens instead of one.
  sinkWeight: (j) => 1 - (0.1 * j) / 32,
};

const retrieval: Profile = {
  ...llama,
  name: 'retrieval',
  description: 'needle-in-a-haystack: half the heads read planted needles, some only from mid-sequence queries',
  mix: { 'sink-local': 0.2, slash: 0.1, vertical: 0.1, retrieval: 0.5, diffuse: 0.1 },
  sinkMass: [0.62, 0.86],
  needlesPerGroup: 4,
  needleMass: [0.04, 0.16],
  hiddenNeedleShare: 0.25,
};

const diffuse: Profile = {
  ...llama,
  name: 'diffuse',
  description: 'mostly diffuse, content-driven high-entropy heads (the PE path)',
  mix: { 'sink-local': 0.15, slash: 0.1, vertical: 0.05, retrieval: 0.1, diffuse: 0.6 },
};

const mixedThreshold: Profile = {
  ...llama,
  name: 'mixed-threshold',
  description: 'retrieval heads whose sink keeps C_struct just under tau_proxy (VS needed, routed PE), among ordinary VS and diffuse heads',
  mix: { 'near-threshold-retrieval': 0.5, 'sink-local': 0.15, slash: 0.1, retrieval: 0.1, diffuse: 0.15 },
  needlesPerGroup: 6,
  needleMass: [0.08, 0.16],
  hiddenNeedleShare: 0,
  needleAskerSpans: 2,
  questionRows: [6, 12],
  blockSalience: 1.5,
};

const vsTrap: Profile = {
  ...llama,
  name: 'vs-trap',
  description: 'heads with a real sink whose other mass follows per-query-block topics (PE needed, routed VS), among ordinary VS heads',
  mix: { 'sink-topic': 0.5, 'sink-local': 0.2, slash: 0.1, vertical: 0.1, diffuse: 0.1 },
  blockSalience: 1,
};

export const PROFILES: Readonly<Record<ProfileName, Profile>> = Object.freeze({
  'llama-like': llama,
  'qwen-like': qwen,
  retrieval,
  diffuse,
  'mixed-threshold': mixedThreshold,
  'vs-trap': vsTrap,
});

export function getProfile(name: string): Profile {
  const p = (PROFILES as Record<string, Profile>)[name];
  if (!p) {
    throw new InvalidArgumentError(`unknown scenario profile '${name}'; use one of ${ALL_PROFILE_NAMES.join(', ')}`);
  }
  return p;
}

/** Kinds per head: counts by largest remainder, order shuffled by the seed's generator. */
export function assignKinds(mix: Readonly<Partial<Record<HeadKind, number>>>, heads: number, uniform: () => number): HeadKind[] {
  const total = HEAD_KINDS.reduce((s, k) => s + (mix[k] ?? 0), 0);
  const exact = HEAD_KINDS.map((k) => ((mix[k] ?? 0) / total) * heads);
  const counts = exact.map(Math.floor);
  let left = heads - counts.reduce((s, c) => s + c, 0);
  const order = HEAD_KINDS.map((_, i) => i).sort((a, b) => exact[b] - counts[b] - (exact[a] - counts[a]) || a - b);
  for (let i = 0; left > 0; i = (i + 1) % order.length, left--) counts[order[i]]++;
  const kinds: HeadKind[] = [];
  HEAD_KINDS.forEach((k, i) => {
    for (let c = 0; c < counts[i]; c++) kinds.push(k);
  });
  for (let i = kinds.length - 1; i > 0; i--) {
    const j = Math.floor(uniform() * (i + 1));
    [kinds[i], kinds[j]] = [kinds[j], kinds[i]];
  }
  return kinds;
}
