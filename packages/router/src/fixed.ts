/** A router that sends every head one way: ablations (VS-only, PE-only) and baselines. */
import { describeValue, InvalidArgumentError, type ProxyStats, type Route, type Router, type RoutingDecision } from '@crisp/core';
import { checkStats } from './stats-check.js';

/** Every head to `route`. The scores are all 1 for 'vs' and 0 for 'pe' (there is no measurement). */
export function fixed(route: Route): Router & { readonly to: Route } {
  if (route !== 'vs' && route !== 'pe') {
    throw new InvalidArgumentError(`fixed(route): route must be 'vs' or 'pe'; got ${describeValue(route)}`);
  }
  const name = `fixed-${route}`;
  return Object.freeze({
    name,
    to: route,
    needs: Object.freeze({ optionalStats: Object.freeze([]) }),
    route(stats: ProxyStats): RoutingDecision {
      checkStats(stats, name, []);
      const routes: Route[] = new Array(stats.heads).fill(route);
      return { routes, scores: new Float64Array(stats.heads).fill(route === 'vs' ? 1 : 0), scoreName: 'fixed' };
    },
  });
}
