/**
 * What the path a head did not take would have kept of its proxy rows' mass, asked for after
 * the plan (proxy-recall.ts says how it is estimated). Not part of every plan: for a PE head it
 * runs the policy's VS selector, which for FlexPrefill's token-level coverage is O(n) a head.
 */
import { InvalidArgumentError } from '../errors.js';
import type { Policy } from '../policy.js';
import { readsPooledEstimate } from './derive.js';
import { headSelector } from './host-plan.js';
import { alternativeRecallOf } from './proxy-recall.js';
import type { PrefillPlan } from './types.js';

/**
 * [H] for each head of a sparse plan, the share of its proxy rows' mass the other path would
 * keep in the last query block's row: for PE heads the policy's VS selector's lists, for VS
 * heads the pooled estimate's γ cut with the kMin best VS blocks (NaN when the plan's
 * statistics lack the pooled estimate: routers that do not read it, such as cStruct, leave it
 * uncomputed; NaN too where the selector throws on a PE head, as FlexPrefill's token-level
 * coverage does on statistics whose token scores stayed on the device, `tokenScores:
 * 'device'`, as a WebGPU device plan's do). Compare with
 * `plan.proxyRecall`. `policy` must be the one the plan was made with (INVALID_ARGUMENT
 * otherwise, and for dense plans).
 */
export function alternativeRecall(plan: PrefillPlan, policy: Policy): Float64Array {
  if (!plan?.stats || !plan.routing) {
    throw new InvalidArgumentError(`alternativeRecall: the plan is dense (${plan?.denseReason ?? 'no statistics'}); only sparse plans have the proxy statistics it reads`);
  }
  if (!policy || policy.name !== plan.policy || !policy.vs || !policy.pe) {
    throw new InvalidArgumentError(`alternativeRecall: pass the sparse policy the plan was made with ('${plan.policy}'); got ${policy?.name === undefined ? String(policy) : `'${policy.name}'`}`);
  }
  return alternativeRecallOf(plan.stats, plan.routing.routes, headSelector(plan.stats, policy.vs), {
    gamma: policy.pe.gamma,
    peK: Math.ceil(policy.pe.kMin / plan.blockSize),
    pooled: readsPooledEstimate(policy),
  });
}
