/**
 * A router made of routers: a head goes to PE when any of them routes it there, to VS only
 * when all agree it is VS.
 *
 * Each router reads a different sign that pooled estimation is the safer path: cStruct a weak
 * anchor mass, residualJsd a pooled estimate that explains the mass off the anchors. A head
 * that either flags is one whose VS lists, taken from the last queries, may not serve the
 * earlier ones (content-driven heads with a real sink pass C_struct and fail VS).
 * `crispGuarded` routes with `anyPe([cStruct(), residualJsd()])` and covers the other
 * direction (a PE head whose pooled map smooths away a needle the proxy rows see) with
 * `Policy.peWithVs`. When every part has a device form, so does the union (`device`).
 */
import type { DeviceRouterRule, OptionalStat, ProxyStats, Route, Router, RoutingDecision, StatsNeeds } from '@crisp/core';
import { checkedRouting, describeValue, InvalidArgumentError } from '@crisp/core';

export interface AnyPeRouter extends Router {
  readonly routers: readonly Router[];
}

/** The windows and statistics every router needs, merged; routers that disagree on a window throw. */
function mergeNeeds(routers: readonly Router[]): StatsNeeds {
  let tokenScores = false;
  let optional: Set<OptionalStat> | undefined = new Set();
  const windows: { wSink?: number; wLocal?: number } = {};
  for (const r of routers) {
    const n = r.needs;
    if (n?.tokenScores) tokenScores = true;
    if (n?.optionalStats === undefined) optional = undefined;
    else if (optional) for (const s of n.optionalStats) optional.add(s);
    for (const key of ['wSink', 'wLocal'] as const) {
      const w = n?.[key];
      if (w === undefined) continue;
      if (windows[key] !== undefined && windows[key] !== w) {
        throw new InvalidArgumentError(`anyPe: routers need ${key} = ${windows[key]} and ${w}; give them the same window`);
      }
      windows[key] = w;
    }
  }
  return Object.freeze({
    ...(tokenScores ? { tokenScores } : {}),
    ...windows,
    ...(optional ? { optionalStats: Object.freeze([...optional].sort()) } : {}),
  });
}

/**
 * 'pe' iff any of `routers` routes the head 'pe'. The decision's scores, score name and
 * threshold are the first router's (reports show that one; the others' flags show in the
 * routes). At least two routers; their `needs` are merged (windows must agree).
 */
export function anyPe(routers: readonly Router[]): AnyPeRouter {
  if (!Array.isArray(routers) || routers.length < 2 || routers.some((r) => !r || typeof r.route !== 'function' || typeof r.name !== 'string')) {
    throw new InvalidArgumentError(`anyPe needs an array of at least two routers (objects with a name and route(stats)); got ${describeValue(routers)}`);
  }
  const list = Object.freeze([...routers]);
  const needs = mergeNeeds(list);
  const name = `anyPe(${list.map((r) => r.name).join(', ')})`;
  const router: AnyPeRouter = {
    name,
    routers: list,
    needs,
    route(stats: ProxyStats): RoutingDecision {
      const H = stats.heads;
      // each part held to the Router contract, as the pipeline holds a router: a part that
      // returns too few routes, 'PE' or a Promise is an error naming that part, never 'vs'
      const decisions = list.map((r) => checkedRouting(r, stats, H));
      const routes: Route[] = [];
      for (let h = 0; h < H; h++) routes.push(decisions.some((d) => d.routes[h] === 'pe') ? 'pe' : 'vs');
      const first = decisions[0];
      return first.threshold === undefined
        ? { routes, scores: first.scores, scoreName: first.scoreName }
        : { routes, scores: first.scores, scoreName: first.scoreName, threshold: first.threshold };
    },
  };
  // A device form when every part has one (non-enumerable, as the parts' are): the planner
  // runs the union of the parts' PE decisions.
  const parts = list.map((r) => r.device);
  if (parts.every((d): d is DeviceRouterRule => d !== undefined)) {
    Object.defineProperty(router, 'device', { value: Object.freeze({ kind: 'anyPe' as const, rules: Object.freeze(parts) }), enumerable: false });
  }
  return Object.freeze(router);
}
