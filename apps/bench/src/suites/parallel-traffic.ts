/**
 * What a context-parallel prefill (@crisp/parallel) moves and computes per rank, as pure
 * functions of the single-backend plan and the zig-zag layout: every rank makes the plan a
 * single backend makes, so the traffic and the attention's load follow from that plan alone.
 *
 * - K/V bytes: a rank receives, per kv head g, every key block J its query blocks select that
 *   another rank holds (`neededBlocks`), K and V, rows(J) · d values each;
 * - plan bytes: what `parallelPrefill` receives before the exchange, message by message, as
 *   shard-stats.ts and prefill.ts pack it (float64 payloads; every gathered part carries one
 *   status byte; the shard header and the plan digest check the ranks agree);
 * - work: selected (head, query block, key block) triples of the query blocks a rank holds.
 *
 * Shape legend: H heads, Hkv kv heads, d head dim, B block size, Nb = ceil(n / B) blocks,
 * b = min(B, n) proxy rows, P ranks.
 */
import type { Policy, PrefillPlan } from '@crisp/core';
import { neededBlocks, type ShardLayout } from '@crisp/parallel';

/** Per rank, and summed over the ranks. */
export interface PerRank {
  readonly perRank: number[];
  readonly total: number;
  readonly max: number;
  readonly mean: number;
}

export function perRank(values: readonly number[]): PerRank {
  const total = values.reduce((a, x) => a + x, 0);
  return { perRank: [...values], total, max: Math.max(...values), mean: total / values.length };
}

const blockRows = (layout: ShardLayout, J: number) => Math.min(layout.blockSize, layout.n - J * layout.blockSize);

/**
 * K/V bytes each rank receives under `plan`: Σ over the (g, J) it needs and does not hold of
 * rows(J) · d · 2 (K and V) · elementBytes. A plan without a mask (dense) needs every block up
 * to the rank's last: the causal dense exchange.
 */
export function kvBytesPerRank(plan: PrefillPlan, layout: ShardLayout, headDim: number, elementBytes: number): number[] {
  const { numBlocks: Nb, owner } = layout;
  const Hkv = plan.shape.kvHeads;
  return Array.from({ length: layout.size }, (_, r) => {
    const need = neededBlocks(plan, layout, r);
    let rows = 0;
    for (let g = 0; g < Hkv; g++) for (let J = 0; J < Nb; J++) if (need[g * Nb + J] && owner[J] !== r) rows += blockRows(layout, J);
    return rows * headDim * 2 * elementBytes;
  });
}

/** The plan-phase messages, summed over every receiving rank. */
export interface PlanParts {
  /** Q̂: b·H·d values (each with its position) from the ranks holding the last b rows */
  readonly proxyRows: number;
  /** each proxy row's log-sum-exp over a rank's keys: H·b values per rank */
  readonly lse: number;
  /** C_struct, entropy, p_v, p_s (2H + 2H·Nb values per rank; plus 2H·n token scores for a policy that reads them) */
  readonly partialSums: number;
  /** K̄: Hkv·d values per block */
  readonly keyMeans: number;
  /** Q̄: H·d values per block, when the plan has PE heads */
  readonly queryMeans: number;
  /** the shard header, the plan digest and every part's status byte */
  readonly control: number;
}

export interface PlanTraffic {
  /** bytes each rank receives while planning (what ParallelTraffic.planBytesReceived counts) */
  readonly perRank: number[];
  /** the same, summed over the ranks, by message */
  readonly parts: PlanParts;
}

/** Whether the policy's router or VS selector reads token scores (the statistics then carry 2H·n more values). */
export function readsTokenScores(policy: Policy): boolean {
  return Boolean(policy.router?.needs?.tokenScores || policy.vs?.needs?.tokenScores);
}

/**
 * The bytes `parallelPrefill` receives per rank before its K/V exchange, for this plan: the
 * shard check, then (sparse plans only) the proxy rows, the log-sum-exps, the partial sums,
 * the key block means and (PE heads only) the query block means, then the plan check. Every
 * rank receives every other rank's part of each (an all-gather); payloads are float64.
 * `header`: the shard check's message (`shardHeaderBytes` of @crisp/parallel).
 */
export function planTraffic(plan: PrefillPlan, layout: ShardLayout, tokens: boolean, header: number): PlanTraffic {
  const { heads: H, kvHeads: Hkv, headDim: d } = plan.shape;
  const { n, size: P, blockSize: B, numBlocks: Nb } = layout;
  const b = Math.min(B, n);
  const owned = new Array<number>(P).fill(0);
  for (let J = 0; J < Nb; J++) owned[layout.owner[J]]++;
  const proxyHeld = layout.ranges.map((rs) => rs.reduce((a, r) => a + Math.max(0, r.end - Math.max(r.start, n - b)), 0));
  const sparse = plan.denseReason === undefined;
  const pe = sparse && (plan.routing?.routes.some((x) => x === 'pe') ?? false);
  // what rank s sends in each gather (payload bytes; the status byte is counted in control)
  const sent = (s: number) => ({
    proxyRows: sparse ? 8 * proxyHeld[s] * (1 + H * d) : 0,
    lse: sparse ? 8 * H * b : 0,
    partialSums: sparse ? 8 * (2 * H + 2 * H * Nb + (tokens ? 2 * H * n : 0)) : 0,
    keyMeans: sparse ? 8 * owned[s] * Hkv * d : 0,
    queryMeans: pe ? 8 * owned[s] * H * d : 0,
    // the header and the digest (two int32), one status byte per gather: 2, + 5 (decode, rows, lse, sums, key means) + 1 (query means)
    control: 1 + header + 1 + 8 + (sparse ? 5 : 0) + (pe ? 1 : 0),
  });
  const parts = { proxyRows: 0, lse: 0, partialSums: 0, keyMeans: 0, queryMeans: 0, control: 0 };
  const received = new Array<number>(P).fill(0);
  for (let s = 0; s < P; s++) {
    const x = sent(s);
    const bytes = Object.values(x).reduce((a, v) => a + v, 0);
    for (let r = 0; r < P; r++) {
      if (r === s) continue;
      received[r] += bytes;
      for (const k of Object.keys(parts) as (keyof PlanParts)[]) parts[k] += x[k];
    }
  }
  return { perRank: received, parts };
}

/**
 * Selected (head, key block) pairs of every query block I, summed over the heads: the union of
 * a head's vertical blocks J <= I, its slash blocks I - O, and its PE row, counted once each.
 * A plan without a mask: every causal block, H·(I + 1). O(H·Nb·k) with no expansion kept.
 */
export function selectedPerQueryBlock(plan: PrefillPlan): Float64Array {
  const Nb = plan.numBlocks;
  const H = plan.shape.heads;
  const out = new Float64Array(Nb);
  const mask = plan.mask;
  if (!mask) {
    for (let I = 0; I < Nb; I++) out[I] = H * (I + 1);
    return out;
  }
  const stamp = new Int32Array(Nb).fill(-1);
  let row = 0;
  for (let h = 0; h < H; h++) {
    const vs = mask.vs;
    const v0 = vs ? vs.verticalPtr[h] : 0;
    const v1 = vs ? vs.verticalPtr[h + 1] : 0;
    const s0 = vs ? vs.slashPtr[h] : 0;
    const s1 = vs ? vs.slashPtr[h + 1] : 0;
    for (let I = 0; I < Nb; I++, row++) {
      let c = 0;
      const add = (J: number) => {
        if (stamp[J] !== row) {
          stamp[J] = row;
          c++;
        }
      };
      for (let p = v0; p < v1 && vs!.vertical[p] <= I; p++) add(vs!.vertical[p]);
      for (let p = s0; p < s1 && vs!.slash[p] <= I; p++) add(I - vs!.slash[p]);
      if (mask.rows) for (let p = mask.rows.rowPtr[h * Nb + I]; p < mask.rows.rowPtr[h * Nb + I + 1]; p++) add(mask.rows.cols[p]);
      out[I] += c;
    }
  }
  return out;
}

/** Σ of `perBlock` over the query blocks each rank holds. */
export function byOwner(perBlock: Float64Array, layout: ShardLayout): number[] {
  const out = new Array<number>(layout.size).fill(0);
  for (let J = 0; J < layout.numBlocks; J++) out[layout.owner[J]] += perBlock[J];
  return out;
}
