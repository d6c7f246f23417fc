/**
 * The device planner's case for FlexPrefill's rules (backends whose planner runs the jsd router
 * and the cumulative coverage selector): statistics with token scores and deferRead, then
 * routing, selection over the token scores' coverage count, PE rows and expansion in one
 * request. Exactly what the host parts give on the same statistics: jsd's routes (a distance
 * within the planner's margin of τ may go either way, as the pipeline allows), cumulativeCoverage's
 * lists, the backend's own PE rows, the union's block counts, and the attention on the unread
 * plan equal to the attention on the host mask.
 */
import {
  assertFiniteStats,
  type DeviceTensor,
  deviceRouteTerms,
  type DType,
  headSlice,
  jsDistance,
  numBlocks,
  plannerMargin,
  type ProxyStats,
  type Route,
  routeMarginal,
  selectVsLists,
} from '@crisp/core';
import { cumulativeCoverage } from '@crisp/select';
import { type ConformanceCase, makeCase, outcome, type ShapeCase, shapeName, upload } from './case-support.js';
import { checkAgainstHostParts, queueOnUnreadPlan } from './device-plan-cases.js';
import { attentionInputs } from './random.js';

/** Each head's JS distance between the pooled estimate and p_v (jsd's score). */
function distances(stats: ProxyStats): number[] {
  const Nb = stats.numBlocks;
  return Array.from({ length: stats.heads }, (_, h) => jsDistance(headSlice(stats.pooledEstimate, h, Nb), headSlice(stats.verticalBlocks, h, Nb)));
}

/** τ between the two middle distinct distances (both routes occur; split: more than 4 margins apart), or above them all. */
function splitJsd(ds: readonly number[], margin: number): { tau: number; split: boolean } {
  const distinct = [...new Set(ds.filter(Number.isFinite))].sort((a, b) => a - b);
  if (distinct.length < 2) return { tau: 0.1, split: false };
  const m = Math.floor(distinct.length / 2);
  return { tau: (distinct[m - 1] + distinct[m]) / 2, split: distinct[m] - distinct[m - 1] > 4 * margin };
}

export function devicePlanCoverageCase(dtype: DType, s: ShapeCase): ConformanceCase {
  const c = makeCase(`devicePlanCoverage/${shapeName(s)}/${dtype}`, dtype, s, s.blockSize, async (ctx, r) => {
    const x = attentionInputs(r, dtype, s);
    const B = s.blockSize;
    const be = ctx.backend;
    const d = upload(be, x);
    const H = s.heads;
    const Nb = numBlocks(s.n, B);
    const opts = { blockSize: B, wSink: B, wLocal: B, optionalStats: ['pooledEstimate' as const] };
    const margin = plannerMargin(be.planner);
    const { tau, split } = splitJsd(distances(await be.proxyStats(d.q, d.k, opts)), margin);
    const peGamma = 0.8 + 0.15 * r();
    // γ of the coverage: anywhere the device form is offered, (0, 0.99]
    const gamma = 0.5 + 0.49 * r();
    const peK = 2;
    const stats = await be.proxyStats(d.q, d.k, { ...opts, tokenScores: true, deferRead: true });
    const res = await be.planner!.plan({
      stats,
      route: { kind: 'jsd', tau },
      vs: { kind: 'cumulativeCoverage', gamma, kMin: 2 * B },
      peK,
      pe: { q: d.q, k: d.k, gamma: peGamma },
    });
    const lines: string[] = [];
    const outs: DeviceTensor[] = [];
    const ctxText = `jsd τ ${tau}, coverage γ ${gamma}`;
    try {
      const queued = await queueOnUnreadPlan(be, d, dtype, { heads: H, numBlocks: Nb, blockSize: B }, res.prepared, outs);
      const plan = await res.read();
      await stats.settle?.();
      assertFiniteStats(stats);
      const ds = distances(stats);
      const routes = ds.map((v): Route => (v < tau ? 'pe' : 'vs'));
      const terms = deviceRouteTerms({ kind: 'jsd', tau })!;
      const off = plan.routes.flatMap((x, h) => (x !== routes[h] && !routeMarginal(terms, stats, h, margin) ? [h] : []));
      if (off.length) lines.push(`routes ${plan.routes.join(',')}, expected ${routes.join(',')} (${ctxText}; distances ${ds.map((v) => v.toPrecision(6)).join(',')})`);
      // the lists on the device's routes (they differ from the host's only within the margin)
      const want = selectVsLists(stats, plan.routes, cumulativeCoverage({ gamma, kMin: 2 * B }), peK);
      const peHeads = plan.routes.flatMap((x, h) => (x === 'pe' ? [h] : []));
      if (split && (!peHeads.length || peHeads.length === H)) lines.push(`τ ${tau} gave one route to every head`);
      await checkAgainstHostParts(be, d, dtype, { heads: H, numBlocks: Nb, blockSize: B, gamma: peGamma, peHeads, want, context: ctxText }, plan, res.prepared, queued, outs, lines);
    } finally {
      res.prepared.release();
      for (const t of [...outs, ...Object.values(d)]) t.dispose();
    }
    return outcome(lines.length ? 1 : 0, 0, lines);
  });
  return { ...c, needs: { ...c.needs, deviceSelector: 'cumulativeCoverage', deviceRouter: 'jsd' } };
}
