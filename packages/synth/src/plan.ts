/** Per-scenario planning: the kv groups (channel permutations, stripes, needles) and each head's targets. */
import { type Group, type HeadPlan, type Layout, NEEDLE_VALUE, type Needle, pick, S_GROUP, S_HEAD } from './layout.js';
import type { HeadKind, Profile } from './profiles.js';
import { type RowRng, rngFor } from './random.js';

/** Kinds whose heads read their kv group's planted needles. */
function readsNeedles(kind: HeadKind): boolean {
  return kind === 'retrieval' || kind === 'near-threshold-retrieval';
}

/**
 * `count` spans of 32-96 query rows that also ask for a needle at `position` (a fact later
 * questions keep coming back to), between 256 rows after it and `before - 64`; merged where
 * they overlap, ascending. Empty when there is no room.
 */
function midAskers(r: RowRng, count: number, position: number, before: number): [number, number][] {
  const lo = position + 256;
  const spans: [number, number][] = [];
  for (let s = 0; s < count; s++) {
    const len = r.int(32, 97);
    const hi = before - 64 - len;
    if (hi <= lo) break;
    const start = r.int(lo, hi);
    spans.push([start, start + len]);
  }
  spans.sort((a, b) => a[0] - b[0]);
  const merged: [number, number][] = [];
  for (const sp of spans) {
    const last = merged[merged.length - 1];
    if (last && sp[0] <= last[1]) last[1] = Math.max(last[1], sp[1]);
    else merged.push(sp);
  }
  return merged;
}

/** The kv groups of a scenario: channel permutation and sign, vertical stripes and planted needles. */
export function buildGroups(
  prof: Profile,
  seed: number,
  n: number,
  d: number,
  Hkv: number,
  group: number,
  kinds: readonly HeadKind[],
  L: Layout,
): { groups: Group[]; needles: Needle[] } {
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
    for (let h = g * group; h < (g + 1) * group; h++) if (readsNeedles(kinds[h])) readers.push(h);
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
        if (!hidden && prof.questionRows) {
          // One short question per needle, each in its own slot of the last 128 rows.
          const slot = Math.floor(128 / count);
          const qlen = Math.min(slot, r.int(prof.questionRows[0], prof.questionRows[1] + 1));
          const start = n - 128 + m * slot + r.int(0, slot - qlen + 1);
          askers.push([start, start + qlen]);
        } else if (!hidden) {
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
        if (!hidden && prof.needleAskerSpans > 0) askers.unshift(...midAskers(r, prof.needleAskerSpans, position, askers[0][0]));
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
    groups.push({ perm, sign, stripes, stripeSet: new Set(stripes), blockSalience: prof.blockSalience, needles: groupNeedles, positionFree });
  }
  return { groups, needles };
}

/** Each head's kind, strengths drawn from the profile, and mass targets (strengths solved later). */
export function planHeads(
  prof: Profile,
  seed: number,
  n: number,
  H: number,
  group: number,
  kinds: readonly HeadKind[],
  groups: readonly Group[],
  slashOffsets: readonly number[] | undefined,
): HeadPlan[] {
  const plans: HeadPlan[] = [];
  for (let h = 0; h < H; h++) {
    const r = rngFor(seed, S_HEAD, h);
    const kind = kinds[h];
    const g = Math.floor(h / group);
    const isDiffuse = kind === 'diffuse';
    if (kind === 'near-threshold-retrieval' || kind === 'sink-topic') {
      plans.push(failureHeadPlan(prof, r, kind, g, groups[g]));
      continue;
    }
    const slash: { offset: number; amp: number }[] = [];
    if (kind === 'slash' && n >= 1024) {
      const lines = Math.round(pick(r, prof.slashLines));
      for (let s = 0; s < lines; s++) {
        const given = slashOffsets;
        const offset = given?.length
          ? given[(h + s) % given.length]
          : r.int(200, Math.max(201, Math.min(Math.floor(n / 3), 16384)));
        slash.push({ offset, amp: pick(r, prof.slashAmp) });
      }
    }
    const needleTargets = new Map<number, number>();
    if (readsNeedles(kind)) for (const nd of groups[g].needles) needleTargets.set(nd.id, pick(r, prof.needleMass));
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
      focus: false,
      needleTargets,
      needleStrength: new Map(),
    });
  }
  return plans;
}

/**
 * Targets of the two kinds hard C_struct routing sends the wrong way. A near-threshold
 * retrieval head: a sink of 0.08-0.17 and a weak local window (capped later so C_struct stays
 * under 0.2), a moderate salience (the passages, not single spans, stand out), and 0.25-0.45
 * of its asker rows' mass on each of the group's needles. A sink-topic head: a 0.3-0.5 sink,
 * a weak background and strong per-query-block topics.
 */
function failureHeadPlan(prof: Profile, r: RowRng, kind: HeadKind, g: number, gr: Group): HeadPlan {
  const threshold = kind === 'near-threshold-retrieval';
  const needleTargets = new Map<number, number>();
  if (threshold) for (const nd of gr.needles) needleTargets.set(nd.id, pick(r, prof.thresholdNeedleMass));
  return {
    kind,
    g,
    sinkTarget: pick(r, threshold ? prof.thresholdSinkMass : prof.topicSinkMass),
    sink: 0,
    salience: pick(r, threshold ? prof.salienceThreshold : prof.salienceTopicSink),
    local: r.range(1, 2),
    slash: [],
    stripe: 0,
    stripeTarget: 0,
    topic: threshold ? 0.4 : pick(r, prof.topicSink),
    focus: !threshold,
    needleTargets,
    needleStrength: new Map(),
  };
}
