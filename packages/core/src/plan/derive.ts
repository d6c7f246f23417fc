/**
 * What a plan reads off a policy and a backend: the policy validated, the statistics' options,
 * and whether the backend's device planner runs the policy's rules. Derived once per backend,
 * frozen policy and block size, since from an idle device the host's time to the first
 * launch counts in the plan: the less the host touches there, the better.
 */
import type { Backend, DevicePlanner } from '../backend.js';
import { InvalidArgumentError, assertKnownKeys, describeValue } from '../errors.js';
import type { DeviceRouterRule, DeviceSelectorRule, Policy, VsSelector } from '../policy.js';
import { type OptionalStat, type ProxyStatsOptions, wantedOptionalStats } from '../stats.js';
import { checkDeviceRouterRule, checkDeviceSelectorRule, checkPeVsNarrowing, deviceRouteTerms, deviceRuleKinds, plannerMargin } from './device-route.js';
import { DEFAULTS } from './types.js';

/** The fields of a Policy (policy.ts); any other is refused, so a misspelt one is not ignored. */
const POLICY_KEYS: readonly string[] = [
  'name',
  'dense',
  'router',
  'vs',
  'pe',
  'blockSize',
  'wSink',
  'wLocal',
  'kMin',
  'peWithVs',
  'peVs',
  'peVsExcess',
  'peVsFullAnchor',
  'recallTarget',
];

/**
 * Check a policy before any work: its shape, every parameter's type and range, and its parts'
 * declared needs and device rules (see the contracts in policy.ts). INVALID_ARGUMENT naming
 * the policy and the field. What the router and selector return is checked when they run.
 */
export function validatePolicy(policy: Policy): void {
  if (!policy || typeof policy !== 'object' || typeof policy.name !== 'string' || policy.name === '') {
    throw new InvalidArgumentError(
      `policy must be an object with a non-empty name (a preset from @crisp/presets, or { name, router, vs, pe }); got ${describeValue(policy)}`,
    );
  }
  const name = policy.name;
  assertKnownKeys(policy, POLICY_KEYS, `policy ${name}`, 'key');
  if (policy.dense !== undefined && typeof policy.dense !== 'boolean') {
    throw new InvalidArgumentError(`policy ${name}: dense must be true or false; got ${describeValue(policy.dense)}`);
  }
  if (policy.blockSize !== undefined && !(typeof policy.blockSize === 'number' && Number.isInteger(policy.blockSize) && policy.blockSize > 0)) {
    throw new InvalidArgumentError(`policy ${name}: blockSize must be a positive integer (64 or 128 on the GPU backends); got ${describeValue(policy.blockSize)}`);
  }
  optionalTokens(policy.kMin, `policy ${name}: kMin`);
  optionalTokens(policy.wSink, `policy ${name}: wSink`);
  optionalTokens(policy.wLocal, `policy ${name}: wLocal`);
  if (policy.recallTarget !== undefined && !(typeof policy.recallTarget === 'number' && policy.recallTarget > 0 && policy.recallTarget <= 1)) {
    throw new InvalidArgumentError(`policy ${name}: recallTarget must be a number in (0, 1] (a share of the proxy rows' mass) or left out; got ${describeValue(policy.recallTarget)}`);
  }
  if (policy.peWithVs !== undefined && typeof policy.peWithVs !== 'boolean') {
    throw new InvalidArgumentError(`policy ${name}: peWithVs must be true or false; got ${describeValue(policy.peWithVs)}`);
  }
  checkPeVsNarrowing(policy.peVsExcess, policy.peVsFullAnchor, `policy ${name}: `);
  if (policy.peVsExcess !== undefined && policy.peWithVs !== true) {
    throw new InvalidArgumentError(`policy ${name}: peVsExcess narrows the VS lists PE heads keep, so it needs peWithVs: true`);
  }
  if (policy.peVs !== undefined && policy.peWithVs !== true) {
    throw new InvalidArgumentError(`policy ${name}: peVs selects the VS lists PE heads keep, so it needs peWithVs: true`);
  }
  if (policy.peVsFullAnchor !== undefined && policy.peVsExcess === undefined) {
    throw new InvalidArgumentError(`policy ${name}: peVsFullAnchor exempts heads from peVsExcess's narrowing, so it needs peVsExcess`);
  }
  if (policy.dense) return;
  const { router, vs, pe } = policy;
  if (!router || typeof router !== 'object' || typeof router.route !== 'function') {
    throw new InvalidArgumentError(`policy ${name} needs a router: an object with a name and a synchronous route(stats) (see @crisp/router)`);
  }
  if (typeof router.name !== 'string' || router.name === '') {
    throw new InvalidArgumentError(`policy ${name}: its router needs a non-empty name (errors and reports name it)`);
  }
  checkNeeds(router.needs, `policy ${name}: router ${router.name}: needs`);
  if (router.device !== undefined) checkDeviceRouterRule(router.device, `policy ${name}: router ${router.name}: device`);
  if (!vs || typeof vs !== 'object' || typeof vs.select !== 'function') {
    throw new InvalidArgumentError(`policy ${name} needs a VS selector: an object with a name and a synchronous select(input) (see @crisp/select)`);
  }
  checkSelector(vs, `policy ${name}`, 'its VS selector');
  if (policy.peVs !== undefined) {
    if (!policy.peVs || typeof policy.peVs !== 'object' || typeof policy.peVs.select !== 'function') {
      throw new InvalidArgumentError(`policy ${name}: peVs must be a VS selector (an object with a name and a synchronous select(input)) or left out; got ${describeValue(policy.peVs)}`);
    }
    checkSelector(policy.peVs, `policy ${name}`, 'its peVs selector');
  }
  if (!pe || typeof pe !== 'object' || typeof pe.gamma !== 'number' || !(pe.gamma > 0 && pe.gamma < 1)) {
    throw new InvalidArgumentError(
      `policy ${name} needs a PE selector with 0 < gamma < 1 (globalCoverage from @crisp/select); got gamma ${describeValue(pe?.gamma)}`,
    );
  }
  if (typeof pe.kMin !== 'number' || !Number.isInteger(pe.kMin) || pe.kMin < 1) {
    throw new InvalidArgumentError(`policy ${name}: pe.kMin must be a positive integer (tokens); got ${describeValue(pe.kMin)}`);
  }
}

/** A VS selector's name, needs and device rule (its select() is checked by the caller). */
function checkSelector(vs: VsSelector, where: string, which: string): void {
  if (typeof vs.name !== 'string' || vs.name === '') {
    throw new InvalidArgumentError(`${where}: ${which} needs a non-empty name (errors and reports name it)`);
  }
  checkNeeds(vs.needs, `${where}: selector ${vs.name}: needs`);
  if (vs.device !== undefined) checkDeviceSelectorRule(vs.device, `${where}: selector ${vs.name}: device`);
}

/** A token count: undefined, or a positive integer. */
function optionalTokens(x: unknown, what: string): void {
  if (x !== undefined && !(typeof x === 'number' && Number.isInteger(x) && x >= 1)) {
    throw new InvalidArgumentError(`${what} must be a positive integer number of tokens; got ${describeValue(x)}`);
  }
}

/** A router's or selector's `needs`: undefined, or an object of the StatsNeeds fields with their types. */
function checkNeeds(needs: unknown, what: string): void {
  if (needs === undefined) return;
  if (!needs || typeof needs !== 'object') throw new InvalidArgumentError(`${what} must be an object (StatsNeeds); got ${describeValue(needs)}`);
  const n = needs as Record<string, unknown>;
  if (n.tokenScores !== undefined && typeof n.tokenScores !== 'boolean') {
    throw new InvalidArgumentError(`${what}.tokenScores must be true or false; got ${describeValue(n.tokenScores)}`);
  }
  optionalTokens(n.wSink, `${what}.wSink`);
  optionalTokens(n.wLocal, `${what}.wLocal`);
  if (n.optionalStats !== undefined) wantedOptionalStats(n.optionalStats, `${what}.optionalStats`);
}

/**
 * The checks that need the block size, run before the statistics: a VS selector that states
 * its kMin (every built-in one does) must have a whole number of blocks of it.
 */
export function validatePolicyBlocks(policy: Policy, B: number): void {
  for (const sel of [policy.vs, policy.peVs]) {
    const kMin = (sel as { readonly kMin?: unknown } | undefined)?.kMin;
    if (typeof kMin === 'number' && Number.isInteger(kMin) && kMin % B !== 0) {
      throw new InvalidArgumentError(
        `policy ${policy.name}: selector ${sel!.name} has kMin = ${kMin} tokens, not a multiple of the block size ${B}; use ${Math.max(1, Math.round(kMin / B)) * B}`,
        { kMin, blockSize: B },
      );
    }
  }
}

/** Policies validated once: frozen ones only (a mutable policy may change between calls). */
const validated = new WeakSet<Policy>();

/** Validate `policy` unless this frozen policy was validated before. */
export function validatePolicyOnce(policy: Policy): void {
  if (validated.has(policy)) return;
  validatePolicy(policy);
  if (frozenPolicy(policy)) validated.add(policy);
}

/** The policy and the parts a plan reads frozen (the presets, the factories' objects). */
function frozenPolicy(policy: Policy): boolean {
  const { router, vs, peVs, pe } = policy;
  const frozenSelector = (s: VsSelector | undefined) => s === undefined || (Object.isFrozen(s) && Object.isFrozen(s.needs ?? s) && Object.isFrozen(s.device ?? s));
  return (
    Object.isFrozen(policy) &&
    (router === undefined || (Object.isFrozen(router) && Object.isFrozen(router.needs ?? router) && Object.isFrozen(router.device ?? router))) &&
    frozenSelector(vs) &&
    frozenSelector(peVs) &&
    (pe === undefined || Object.isFrozen(pe))
  );
}

/** The device forms of the policy's rules, when the backend's planner runs both. */
export interface DeviceRules {
  readonly route: DeviceRouterRule;
  readonly vs: DeviceSelectorRule;
  /** the PE heads' lists' rule (Policy.peVs) when it is not `vs` */
  readonly peVs?: DeviceSelectorRule;
  /** the planner's margin (plannerMargin), for checking its routes against the host router's */
  readonly margin: number;
}

export interface SparseDerived {
  readonly blockSize: number;
  readonly needsTokens: boolean;
  /** blocks per direction for PE heads (pe.kMin / B, rounded up) */
  readonly peK: number;
  /** set when the plan is made by the backend's device planner */
  readonly device: DeviceRules | undefined;
  /**
   * Why the plan is made on the host although the backend has a device planner (what of the
   * policy the planner does not run); undefined on the device path or with no planner.
   */
  readonly hostReason: string | undefined;
  /** proxyStats' options with the default scale (one object literal, no spreads) */
  readonly statsOpts: ProxyStatsOptions;
}

/**
 * sparseDerived's last result for each backend and frozen policy (weak both ways: a disposed
 * backend is not kept alive by a preset that outlives it)
 */
const derivedCache = new WeakMap<Backend, WeakMap<Policy, SparseDerived>>();

/** The sparse path's derived settings for a validated, non-dense policy (cached per backend and frozen policy). */
export function sparseDerived(backend: Backend, policy: Policy, B: number): SparseDerived {
  let byPolicy = derivedCache.get(backend);
  const hit = byPolicy?.get(policy);
  if (hit !== undefined && hit.blockSize === B) return hit;
  const d = deriveSparse(backend.planner, policy, B);
  if (frozenPolicy(policy)) {
    if (!byPolicy) {
      byPolicy = new WeakMap();
      derivedCache.set(backend, byPolicy);
    }
    byPolicy.set(policy, d);
  }
  return d;
}

/**
 * The derived settings themselves: `planner` is the device planner that may take the plan
 * (undefined: the plan is made on the host, as for statistics gathered from a sharded prefill).
 */
export function deriveSparse(planner: DevicePlanner | undefined, policy: Policy, B: number): SparseDerived {
  const needsTokens = Boolean(policy.router!.needs?.tokenScores || policy.vs!.needs?.tokenScores || (policy.peWithVs === true && policy.peVs?.needs?.tokenScores));
  const onDevice = planner === undefined ? undefined : deviceRules(planner, policy, B, needsTokens);
  const device = onDevice !== undefined && 'route' in onDevice ? onDevice : undefined;
  const optionalStats = optionalStatsOf(policy);
  return {
    blockSize: B,
    needsTokens,
    peK: Math.ceil(policy.pe!.kMin / B),
    device,
    hostReason: onDevice !== undefined && 'hostReason' in onDevice ? onDevice.hostReason : undefined,
    statsOpts: Object.freeze({
      blockSize: B,
      wSink: statsWindow(policy, 'wSink'),
      wLocal: statsWindow(policy, 'wLocal'),
      scale: undefined,
      // on the device path only the device's selection reads the token scores (deviceRules)
      tokenScores: needsTokens && device !== undefined ? 'device' : needsTokens,
      // a device plan reads the statistics back only after the attention is queued
      deferRead: device !== undefined,
      optionalStats,
    }),
  };
}

/**
 * The plan goes to the backend's device planner when the planner runs both the router's and
 * the selector's device form (every kind of an anyPe rule, reducible to the planner's two
 * tests: deviceRouteTerms), the router needs no token scores and the selector only through
 * its device form (cumulativeCoverage: the planner reads them where proxyStats left them),
 * the policy has no recall guard, and the planner runs peWithVs and peVsExcess (the latter
 * beside the noise floor) when the policy asks for them; otherwise the plan is made on the
 * host, and `hostReason` says which of these failed (PrefillPlan.hostReason).
 */
function deviceRules(planner: DevicePlanner, policy: Policy, B: number, needsTokens: boolean): DeviceRules | { readonly hostReason: string } {
  const router = policy.router!;
  const selector = policy.vs!;
  const route = router.device;
  const vs = selector.device;
  const host = (why: string) => ({ hostReason: why });
  // a planner that declares an unusable margin is refused here, before any work (throws)
  const margin = plannerMargin(planner);
  if (route === undefined) return host(`router ${router.name} has no device form (Router.device; one with its own route() has none)`);
  if (vs === undefined) return host(`selector ${selector.name} has no device form (VsSelector.device; one with its own select() has none)`);
  if (policy.recallTarget !== undefined) return host('the policy has a recall guard (recallTarget), which runs on the host');
  if (needsTokens && router.needs?.tokenScores) return host(`router ${router.name} reads token scores`);
  if (needsTokens && selector.needs?.tokenScores && vs.kind !== 'cumulativeCoverage') return host(`selector ${selector.name} reads token scores beside its device form ${vs.kind}`);
  if (policy.peWithVs === true && planner.peWithVs !== true) return host("the backend's planner does not run peWithVs");
  if (policy.peVsExcess !== undefined && planner.peVsExcess !== true) return host("the backend's planner does not run peVsExcess");
  if (policy.peVsExcess !== undefined && vs.kind !== 'noiseFloor') return host(`peVsExcess runs on the device only beside noiseFloor, not ${vs.kind}`);
  if (vs.kMin % B !== 0) return host(`selector ${selector.name}'s device form has kMin ${vs.kMin}, not a multiple of the block size ${B}`);
  const missing = [...deviceRuleKinds(route)].filter((k) => !planner.routers.includes(k));
  if (missing.length > 0) return host(`the backend's planner runs the routers ${planner.routers.join(', ') || 'none'}, not ${missing.join(', ')} (router ${router.name})`);
  if (!planner.selectors.includes(vs.kind)) return host(`the backend's planner runs the selectors ${planner.selectors.join(', ') || 'none'}, not ${vs.kind} (selector ${selector.name})`);
  if (deviceRouteTerms(route) === undefined) return host(`router ${router.name} combines two distance tests, which the planner's two tests cannot hold`);
  const peVs = policy.peWithVs === true && policy.peVs !== undefined && policy.peVs !== selector ? policy.peVs : undefined;
  if (peVs === undefined) return { route, vs, margin };
  const peRule = peVs.device;
  if (peRule === undefined) return host(`peVs selector ${peVs.name} has no device form (VsSelector.device; one with its own select() has none)`);
  if (planner.peVs !== true) return host("the backend's planner does not run a peVs selector beside the VS one");
  if (peRule.kind !== 'noiseFloor' || vs.kind !== 'noiseFloor' || peRule.kMin !== vs.kMin) {
    return host(`peVs runs on the device only as a noise floor beside a noise floor with the same kMin, not ${peRule.kind} (kMin ${peRule.kMin}) beside ${vs.kind} (kMin ${vs.kMin})`);
  }
  if (needsTokens && peVs.needs?.tokenScores) return host(`peVs selector ${peVs.name} reads token scores beside its device form`);
  return { route, vs, peVs: peRule, margin };
}

/**
 * The sink / local window for proxy statistics: the router's declared `needs` first (it is
 * the one that reads C_struct), then the policy's, then the default. A policy that sets a
 * window its router contradicts is rejected rather than silently overridden.
 */
function statsWindow(policy: Policy, key: 'wSink' | 'wLocal'): number {
  const fromRouter = policy.router?.needs?.[key];
  const fromPolicy = policy[key];
  if (fromRouter !== undefined && fromPolicy !== undefined && fromRouter !== fromPolicy) {
    throw new InvalidArgumentError(
      `policy ${policy.name} sets ${key}=${fromPolicy} but its router ${policy.router?.name} needs ${key}=${fromRouter}; set the window in one place (the router's options)`,
    );
  }
  const w = fromRouter ?? fromPolicy ?? DEFAULTS[key];
  if (!Number.isInteger(w) || w < 1) {
    throw new InvalidArgumentError(`policy ${policy.name}: ${key} must be a positive integer number of tokens; got ${w}`);
  }
  return w;
}

/**
 * Whether the proxy statistics of a plan made with this policy hold the pooled estimate
 * (its router reads it, or declares nothing, so every optional statistic is computed).
 */
export function readsPooledEstimate(policy: Policy): boolean {
  const declared = optionalStatsOf(policy);
  return declared === undefined || declared.includes('pooledEstimate');
}

/**
 * The optional statistics the plan reads: the ones the policy's router declares, plus the
 * pooled estimate for peVsExcess (undefined: the router does not say, so all).
 */
function optionalStatsOf(policy: Policy): readonly OptionalStat[] | undefined {
  const declared = policy.router!.needs?.optionalStats;
  if (declared === undefined) return undefined;
  const wanted = wantedOptionalStats(declared, `router ${policy.router!.name}: needs.optionalStats`);
  return policy.peVsExcess !== undefined && !wanted.includes('pooledEstimate') ? Object.freeze([...wanted, 'pooledEstimate' as const]) : wanted;
}
