/**
 * A DeviceRouterRule as the two tests a device planner runs per head, and the one place the
 * device's routes may differ from the host router's.
 *
 * Every rule reduces to: PE iff C_struct < tauProxy (−Infinity when no cStruct part; the
 * largest τ of several), or one JS distance test: the residual one (a residualJsd part) or
 * the distance over every block (a jsd part), at most one of the two. The cStruct
 * test compares the same f64 value on both sides. The residual test's distance is a sum of
 * logarithms the device adds in another order with its own log, so it can differ from the
 * host's in the last bits: a head whose distance (or residual mass) lies within
 * RESIDUAL_MARGIN of its threshold may be routed either way, and the plan keeps the device's
 * route there (the mask was built from it).
 */
import { describeValue, InvalidArgumentError } from '../errors.js';
import { jsDistance, residualDistance } from '../divergence.js';
import type { DeviceRouterRule } from '../policy.js';
import { headSlice, type ProxyStats } from '../stats.js';

/** The device plan's two tests; undefined when the rule has no such form (two residual parts). */
export interface DeviceRouteTerms {
  /** PE iff C_struct < tauProxy; −Infinity: no cStruct part */
  readonly tauProxy: number;
  /** PE iff residual >= minResidual and distance < tau */
  readonly residual?: { readonly tau: number; readonly minResidual: number };
  /** PE iff the JS distance over every block < tau (never with `residual`) */
  readonly jsd?: { readonly tau: number };
}

/**
 * How far from its threshold a residual distance or mass must be for the device's and the
 * host's test to agree, where the device computes in f64 (a planner in other arithmetic
 * declares its own: DevicePlanner.margin).
 */
export const RESIDUAL_MARGIN = 1e-9;

/** The largest margin a planner may declare: beyond it its routes would not be the rule's. */
export const MAX_PLANNER_MARGIN = 0.01;

/**
 * A planner's margin (DevicePlanner.margin): RESIDUAL_MARGIN when it declares none. A declared
 * margin outside [RESIDUAL_MARGIN, MAX_PLANNER_MARGIN) is the planner's mistake and throws
 * InvalidArgumentError (quietly checking its routes at another margin would hide it).
 */
export function plannerMargin(planner: { readonly margin?: number } | undefined): number {
  const m = planner?.margin;
  if (m === undefined) return RESIDUAL_MARGIN;
  if (typeof m !== 'number' || !(m >= RESIDUAL_MARGIN && m < MAX_PLANNER_MARGIN)) {
    throw new InvalidArgumentError(`DevicePlanner.margin must be a number in [${RESIDUAL_MARGIN}, ${MAX_PLANNER_MARGIN}); got ${describeValue(m)}`);
  }
  return m;
}

export function deviceRouteTerms(rule: DeviceRouterRule): DeviceRouteTerms | undefined {
  let tauProxy = Number.NEGATIVE_INFINITY;
  let residual: DeviceRouteTerms['residual'];
  let jsd: DeviceRouteTerms['jsd'];
  let ok = true;
  const visit = (r: DeviceRouterRule): void => {
    if (r.kind === 'cStruct') tauProxy = Math.max(tauProxy, r.tauProxy);
    else if (r.kind === 'residualJsd' || r.kind === 'jsd') {
      if (residual || jsd) ok = false;
      if (r.kind === 'jsd') jsd = { tau: r.tau };
      else residual = { tau: r.tau, minResidual: r.minResidual };
    } else for (const x of r.rules) visit(x);
  };
  visit(rule);
  if (!ok) return undefined;
  return residual ? { tauProxy, residual } : jsd ? { tauProxy, jsd } : { tauProxy };
}

/** Every rule kind in `rule` (anyPe and its parts). */
export function deviceRuleKinds(rule: DeviceRouterRule): Set<DeviceRouterRule['kind']> {
  const out = new Set<DeviceRouterRule['kind']>([rule.kind]);
  if (rule.kind === 'anyPe') for (const r of rule.rules) for (const k of deviceRuleKinds(r)) out.add(k);
  return out;
}

/**
 * Whether head h's route may differ between the device and the host: its cStruct test says
 * VS (so the distance test decides) and the distance test is within `margin` (the planner's,
 * plannerMargin) of either threshold (the residual test's) or of τ (the jsd test's).
 */
export function routeMarginal(terms: DeviceRouteTerms, stats: ProxyStats, h: number, margin = RESIDUAL_MARGIN): boolean {
  if (!(stats.cStruct[h] >= terms.tauProxy)) return false;
  const Nb = stats.numBlocks;
  if (terms.jsd) {
    const d = jsDistance(headSlice(stats.pooledEstimate, h, Nb), headSlice(stats.verticalBlocks, h, Nb));
    return Math.abs(d - terms.jsd.tau) <= margin;
  }
  if (!terms.residual) return false;
  const { residual, distance } = residualDistance(headSlice(stats.verticalBlocks, h, Nb), headSlice(stats.pooledEstimate, h, Nb));
  return Math.abs(distance - terms.residual.tau) <= margin || Math.abs(residual - terms.residual.minResidual) <= margin;
}

const finite = (x: unknown): x is number => typeof x === 'number' && Number.isFinite(x);

/**
 * A router's device form: a DeviceRouterRule whose parameters are in range (a backend runs it
 * as given); INVALID_ARGUMENT naming `what` otherwise. Policies are checked with it, and device
 * planners check the rules they are handed.
 */
export function checkDeviceRouterRule(rule: unknown, what: string): void {
  checkRouterRuleAt(rule, what, 0);
}

/** checkDeviceRouterRule of a part `depth` anyPe levels down (at most 4). */
function checkRouterRuleAt(rule: unknown, what: string, depth: number): void {
  const r = rule as Partial<Record<string, unknown>> | null;
  if (r && typeof r === 'object' && r.kind === 'cStruct' && finite(r.tauProxy)) return;
  if (r && typeof r === 'object' && r.kind === 'residualJsd' && finite(r.tau) && r.tau > 0 && finite(r.minResidual) && r.minResidual >= 0 && r.minResidual < 1) return;
  if (r && typeof r === 'object' && r.kind === 'jsd' && finite(r.tau) && r.tau > 0) return;
  if (r && typeof r === 'object' && r.kind === 'anyPe' && Array.isArray(r.rules) && r.rules.length >= 1 && depth < 4) {
    r.rules.forEach((x: unknown, i: number) => {
      checkRouterRuleAt(x, `${what}.rules[${i}]`, depth + 1);
    });
    return;
  }
  throw new InvalidArgumentError(
    `${what} must be { kind: 'cStruct', tauProxy: a finite number }, { kind: 'residualJsd', tau > 0, minResidual in [0, 1) }, { kind: 'jsd', tau > 0 }, { kind: 'anyPe', rules: [such rules] } or left out (a router with its own route() has no device form); got ${describeValue(rule)}`,
  );
}

/** A VS selector's device form: a DeviceSelectorRule whose parameters are in range; INVALID_ARGUMENT naming `what` otherwise. */
export function checkDeviceSelectorRule(rule: unknown, what: string): void {
  const r = rule as Partial<Record<string, unknown>> | null;
  const kMin = r && typeof r === 'object' && typeof r.kMin === 'number' && Number.isInteger(r.kMin) && r.kMin >= 1;
  const ok =
    kMin &&
    ((r.kind === 'noiseFloor' && finite(r.alpha) && r.alpha > 0) || (r.kind === 'cumulativeCoverage' && finite(r.gamma) && r.gamma > 0 && r.gamma <= 0.99));
  if (!ok) {
    throw new InvalidArgumentError(
      `${what} must be { kind: 'noiseFloor', alpha > 0, kMin }, { kind: 'cumulativeCoverage', gamma in (0, 0.99], kMin } (kMin a positive integer) or left out (a selector with its own select() has no device form); got ${describeValue(rule)}`,
    );
  }
}

/**
 * The PE lists' narrowing (Policy.peVsExcess and Policy.peVsFullAnchor, and the same fields of
 * a DevicePlanRequest): κ a finite number above 0, the band `{ from, below }` with
 * 0 <= from < below <= 1; each may be left out. INVALID_ARGUMENT prefixed with `what` otherwise.
 */
export function checkPeVsNarrowing(excess: unknown, fullAnchor: unknown, what: string): void {
  if (excess !== undefined && !(finite(excess) && excess > 0)) {
    throw new InvalidArgumentError(`${what}peVsExcess must be a finite number above 0 (κ in p_v > κ · ā) or left out; got ${describeValue(excess)}`);
  }
  if (fullAnchor === undefined) return;
  const a = fullAnchor as { from?: unknown; below?: unknown } | null;
  const inUnit = (x: unknown): x is number => finite(x) && x >= 0 && x <= 1;
  if (!a || typeof a !== 'object' || !inUnit(a.from) || !inUnit(a.below) || !(a.from < a.below)) {
    throw new InvalidArgumentError(
      `${what}peVsFullAnchor must be { from, below } with 0 <= from < below <= 1 (a band of C_struct) or left out; got ${describeValue(fullAnchor)}`,
    );
  }
}
