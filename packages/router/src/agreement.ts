/** Routing agreement: how often two routers send a head the same way (the paper: 94.0% Llama, 88.1% Qwen). */
import { InvalidArgumentError, type Route, type RoutingDecision } from '@crisp/core';

function routesOf(x: RoutingDecision | readonly Route[], which: string): readonly Route[] {
  const r = Array.isArray(x) ? x : (x as RoutingDecision)?.routes;
  if (!Array.isArray(r)) {
    throw new InvalidArgumentError(`routingAgreement: ${which} must be a RoutingDecision or an array of 'vs'/'pe'`);
  }
  for (const v of r) {
    if (v !== 'vs' && v !== 'pe') throw new InvalidArgumentError(`routingAgreement: ${which} holds ${String(v)}, not 'vs'/'pe'`);
  }
  return r;
}

/**
 * Fraction of heads routed the same by `a` and `b` (decisions on the same heads, same
 * order). Pool several layers by concatenating their routes.
 */
export function routingAgreement(a: RoutingDecision | readonly Route[], b: RoutingDecision | readonly Route[]): number {
  const ra = routesOf(a, 'a');
  const rb = routesOf(b, 'b');
  if (ra.length !== rb.length || ra.length === 0) {
    throw new InvalidArgumentError(
      `routingAgreement: both decisions must cover the same, non-zero number of heads; got ${ra.length} and ${rb.length}`,
    );
  }
  let same = 0;
  for (let h = 0; h < ra.length; h++) if (ra[h] === rb[h]) same++;
  return same / ra.length;
}
