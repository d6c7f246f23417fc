/**
 * What a plan reads off a policy and a backend: the policy validated, the statistics' options,
 * and whether the backend's device planner runs the policy's rules. Derived once per backend,
 * frozen policy and block size, since from an idle device the host's time to the first
 * launch counts in the plan: the less the host touches there, the better.
 */
import type { Backend } from '../backend.js';
import { InvalidArgumentError } from '../errors.js';
import type { DeviceRouterRule, DeviceSelectorRule, Policy } from '../policy.js';
import { type OptionalStat, type ProxyStatsOptions, wantedOptionalStats } from '../stats.js';
import { DEFAULTS } from './types.js';

export function validatePolicy(policy: Policy): void {
  if (!policy || typeof policy !== 'object' || typeof policy.name !== 'string') {
    throw new InvalidArgumentError('policy must be an object with a name (see the presets in @crisp/presets)');
  }
  if (policy.dense) return;
  if (!policy.router || typeof policy.router.route !== 'function') {
    throw new InvalidArgumentError(`policy ${policy.name} needs a router with route(stats)`);
  }
  if (!policy.vs || typeof policy.vs.select !== 'function') {
    throw new InvalidArgumentError(`policy ${policy.name} needs a VS selector with select(input)`);
  }
  if (!policy.pe || !(policy.pe.gamma > 0 && policy.pe.gamma < 1)) {
    throw new InvalidArgumentError(`policy ${policy.name} needs a PE selector with 0 < gamma < 1`);
  }
  if (!Number.isInteger(policy.pe.kMin) || policy.pe.kMin < 1) {
    throw new InvalidArgumentError(`policy ${policy.name}: pe.kMin must be a positive integer (tokens); got ${policy.pe.kMin}`);
  }
  if (policy.kMin !== undefined && !(Number.isInteger(policy.kMin) && policy.kMin >= 1)) {
    throw new InvalidArgumentError(`policy ${policy.name}: kMin must be a positive integer (tokens); got ${policy.kMin}`);
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
  const { router, vs, pe } = policy;
  return (
    Object.isFrozen(policy) &&
    (router === undefined || (Object.isFrozen(router) && Object.isFrozen(router.needs ?? router) && Object.isFrozen(router.device ?? router))) &&
    (vs === undefined || (Object.isFrozen(vs) && Object.isFrozen(vs.needs ?? vs) && Object.isFrozen(vs.device ?? vs))) &&
    (pe === undefined || Object.isFrozen(pe))
  );
}

/** The device forms of the policy's rules, when the backend's planner runs both. */
export interface DeviceRules {
  readonly route: DeviceRouterRule;
  readonly vs: DeviceSelectorRule;
}

export interface SparseDerived {
  readonly blockSize: number;
  readonly needsTokens: boolean;
  /** blocks per direction for PE heads (pe.kMin / B, rounded up) */
  readonly peK: number;
  /** set when the plan is made by the backend's device planner */
  readonly device: DeviceRules | undefined;
  /** proxyStats' options with the default scale (one object literal, no spreads) */
  readonly statsOpts: ProxyStatsOptions;
}

/**
 * sparseDerived's last result for each backend and frozen policy (weak both ways: a disposed
 * backend is not kept alive by a preset that outlives it)
 */
const derivedCache = new WeakMap<Backend, WeakMap<Policy, SparseDerived>>();

/** The sparse path's derived settings for a validated, non-dense policy. */
export function sparseDerived(backend: Backend, policy: Policy, B: number): SparseDerived {
  let byPolicy = derivedCache.get(backend);
  const hit = byPolicy?.get(policy);
  if (hit !== undefined && hit.blockSize === B) return hit;
  const needsTokens = Boolean(policy.router!.needs?.tokenScores || policy.vs!.needs?.tokenScores);
  const device = deviceRules(backend, policy, B, needsTokens);
  const d: SparseDerived = {
    blockSize: B,
    needsTokens,
    peK: Math.ceil(policy.pe!.kMin / B),
    device,
    statsOpts: Object.freeze({
      blockSize: B,
      wSink: statsWindow(policy, 'wSink'),
      wLocal: statsWindow(policy, 'wLocal'),
      scale: undefined,
      tokenScores: needsTokens,
      // a device plan reads the statistics back only after the attention is queued
      deferRead: device !== undefined,
      optionalStats: optionalStatsOf(policy),
    }),
  };
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
 * The plan goes to the backend's device planner when the planner runs both the router's and
 * the selector's device form (and the selector needs no token scores, which the device plan
 * does not compute); otherwise it is made on the host.
 */
function deviceRules(backend: Backend, policy: Policy, B: number, needsTokens: boolean): DeviceRules | undefined {
  const planner = backend.planner;
  const route = policy.router!.device;
  const vs = policy.vs!.device;
  if (planner === undefined || route === undefined || vs === undefined || needsTokens) return undefined;
  if (vs.kMin % B !== 0) return undefined;
  if (!planner.routers.includes(route.kind) || !planner.selectors.includes(vs.kind)) return undefined;
  return { route, vs };
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

/** The optional statistics the policy's router declares it reads (undefined: it does not say, so all). */
function optionalStatsOf(policy: Policy): readonly OptionalStat[] | undefined {
  const declared = policy.router!.needs?.optionalStats;
  return declared === undefined ? undefined : wantedOptionalStats(declared, `router ${policy.router!.name}: needs.optionalStats`);
}
