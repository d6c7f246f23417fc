/**
 * Accuracy of a plan's mask on a scenario with ground truth, in float64 on the host, over
 * sampled query rows (docs/ALGORITHM.md, "Metrics"): mass recall, output error of the
 * masked attention against dense, needle recall (selection, and output within tolerance at
 * the rows that ask for the needle), density. Scoring the mask exactly on the host keeps
 * the metric about the selection; a backend's own numerics are the conformance suite's job.
 *
 * Shape legend: q [n, H, d], k and v [n, Hkv, d]; rows are query positions.
 */
import { type Backend, type DType, type HostTensor, type Policy, type ProxyStats, planPrefill } from '@crisp/core';
import { attentionRows, massRecall, sampleRows } from '@crisp/reference';
import { cStruct, jsd, routingAgreement } from '@crisp/router';
import { needleRecall, type Scenario } from '@crisp/synth';
import { cachingBackend, uploadHost } from './inputs.js';

/** A needle counts as recalled in output when its head's output row is within this relative error of dense. */
export const NEEDLE_OUTPUT_TOLERANCE = 0.05;

export interface MaskMetrics {
  readonly policy: string;
  readonly massRecall: number;
  readonly outputError: number;
  /** (needle, reader head) pairs whose key blocks are selected wherever they are asked for */
  readonly needleRecall: number;
  /** the same, and the output at the asking rows within NEEDLE_OUTPUT_TOLERANCE of dense */
  readonly needleOutputRecall: number;
  readonly needles: number;
  /**
   * needleRecall over the needles the proxy rows can see (an asker among the last rows); the
   * others no plan that reads only the last query block can find. Absent in older results.
   */
  readonly visibleNeedleRecall?: number;
  readonly visibleNeedles?: number;
  /** selected causal blocks / (Nb (Nb + 1) / 2), mean over heads */
  readonly density: number;
  /** heads routed to Vertical-Slash */
  readonly vsHeads: number;
  readonly planMs: number;
  /** the largest per-head output error (same rows as outputError) and the head it is on */
  readonly worstHeadError: number;
  readonly worstHead: number;
  /** the plan's per-head check (PrefillPlan.proxyRecall): its smallest value and its mean over heads */
  readonly minProxyRecall: number;
  readonly meanProxyRecall: number;
  /** heads the recall guard added blocks to (policies with Policy.recallTarget) */
  readonly guardedHeads: number;
}

export interface RoutingMetrics {
  readonly heads: number;
  /** fraction of heads C_struct (τ_proxy 0.2) and JSD (τ 0.1) route the same way */
  readonly cStructVsJsd: number;
  /** agreement with the scenario's intended route per head */
  readonly cStructVsTruth: number;
  readonly jsdVsTruth: number;
}

export interface HostQkv {
  readonly q: HostTensor;
  readonly k: HostTensor;
  readonly v: HostTensor;
}

function relErrRows(a: Float64Array, b: Float64Array, H: number, d: number, rowIdx: readonly number[], head?: number): number {
  let num = 0;
  let den = 0;
  for (const r of rowIdx) {
    for (let h = 0; h < H; h++) {
      if (head !== undefined && h !== head) continue;
      const base = (r * H + h) * d;
      for (let x = 0; x < d; x++) {
        const e = a[base + x] - b[base + x];
        num += e * e;
        den += b[base + x] * b[base + x];
      }
    }
  }
  return den > 0 ? Math.sqrt(num / den) : num === 0 ? 0 : Number.POSITIVE_INFINITY;
}

export function routingMetrics(stats: ProxyStats, sc: Scenario): RoutingMetrics {
  const a = cStruct({ tauProxy: 0.2 }).route(stats);
  const b = jsd({ tau: 0.1 }).route(stats);
  const truth = sc.truth.heads.map((h) => h.expectedRoute);
  return {
    heads: stats.heads,
    cStructVsJsd: routingAgreement(a, b),
    cStructVsTruth: routingAgreement(a, truth),
    jsdVsTruth: routingAgreement(b, truth),
  };
}

/** The dense float64 rows every mask is scored against: sampled rows plus each needle's asking row. */
export interface DenseReference {
  readonly base: number[];
  readonly all: number[];
  readonly pos: ReadonlyMap<number, number>;
  readonly baseIdx: number[];
  readonly output: Float64Array;
}

/**
 * Dense attention at the scored rows, on the host in float64. It depends only on the
 * scenario, so one computation serves every backend and policy scored on it.
 */
export function denseReference(sc: Scenario, host: HostQkv, sampleCount: number): DenseReference {
  const base = sampleRows(sc.n, sampleCount);
  // One asking row per (needle, asker range): the last row of the range.
  const needleRows = new Set<number>();
  for (const nd of sc.truth.needles) for (const [, end] of nd.askers) needleRows.add(end - 1);
  const all = [...new Set([...base, ...needleRows])].sort((x, y) => x - y);
  const pos = new Map(all.map((r, i) => [r, i]));
  const baseIdx = base.map((r) => pos.get(r)!);
  return { base, all, pos, baseIdx, output: attentionRows(host.q, host.k, host.v, all).output };
}

/**
 * Plan every policy on the same device inputs (one proxy-statistics pass shared by all)
 * and score each mask. Returns the metrics per policy and the shared statistics.
 */
export async function evaluatePolicies(
  b: Backend,
  sc: Scenario,
  host: HostQkv,
  policies: readonly Policy[],
  sampleCount: number,
  dtype: DType,
  ref: DenseReference = denseReference(sc, host, sampleCount),
): Promise<{ metrics: MaskMetrics[]; routing: RoutingMetrics }> {
  const { heads: H, headDim: d } = sc;
  const { base, all, pos, baseIdx } = ref;
  const dense = { output: ref.output };
  const inputs = uploadHost(b, host, dtype);
  const cached = cachingBackend(b);
  try {
    const metrics: MaskMetrics[] = [];
    let stats: ProxyStats | undefined;
    for (const policy of policies) {
      const plan = await planPrefill(cached, inputs, policy, { minSparseLength: 0 });
      stats ??= plan.stats;
      if (!plan.mask) {
        metrics.push({
          policy: policy.name,
          massRecall: 1,
          outputError: 0,
          needleRecall: 1,
          needleOutputRecall: 1,
          needles: 0,
          visibleNeedleRecall: 1,
          visibleNeedles: 0,
          density: 1,
          vsHeads: 0,
          planMs: plan.planMs,
          worstHeadError: 0,
          worstHead: 0,
          minProxyRecall: 1,
          meanProxyRecall: 1,
          guardedHeads: 0,
        });
        continue;
      }
      const mr = massRecall(host.q, host.k, plan.mask, { rows: base });
      const sparse = attentionRows(host.q, host.k, host.v, all, plan.mask);
      const nr = needleRecall(plan, sc.truth);
      let okOut = 0;
      for (const hit of nr.hits) {
        if (!hit.recalled) continue;
        const nd = sc.truth.needles.find((x) => x.id === hit.needle)!;
        const idx = nd.askers.map(([, end]) => pos.get(end - 1)!);
        if (relErrRows(sparse.output, dense.output, H, d, idx, hit.head) <= NEEDLE_OUTPUT_TOLERANCE) okOut++;
      }
      let worstHeadError = 0;
      let worstHead = 0;
      for (let h = 0; h < H; h++) {
        const e = relErrRows(sparse.output, dense.output, H, d, baseIdx, h);
        if (e > worstHeadError) {
          worstHeadError = e;
          worstHead = h;
        }
      }
      const pr = plan.proxyRecall ?? new Float64Array(H).fill(1);
      metrics.push({
        policy: policy.name,
        massRecall: mr.overall,
        outputError: relErrRows(sparse.output, dense.output, H, d, baseIdx),
        needleRecall: nr.recall,
        needleOutputRecall: nr.total ? okOut / nr.total : 1,
        needles: nr.total,
        visibleNeedleRecall: nr.visibleRecall,
        visibleNeedles: nr.visibleTotal,
        density: plan.overallDensity,
        vsHeads: plan.routing ? plan.routing.routes.filter((r) => r === 'vs').length : 0,
        planMs: plan.planMs,
        worstHeadError,
        worstHead,
        minProxyRecall: Math.min(...pr),
        meanProxyRecall: pr.reduce((a, x) => a + x, 0) / H,
        guardedHeads: plan.guardAdded ? plan.guardAdded.filter((x) => x > 0).length : 0,
      });
    }
    if (!stats) {
      stats = await cached.proxyStats(inputs.q, inputs.k, { blockSize: 128, wSink: 128, wLocal: 128 });
    }
    return { metrics, routing: routingMetrics(stats, sc) };
  } finally {
    inputs.dispose();
  }
}
