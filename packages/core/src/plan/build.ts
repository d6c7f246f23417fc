/**
 * One plan path: validate, apply the dense gates, compute the proxy statistics, then either
 * the backend's device planner (when it runs the policy's router and selector rules) or the
 * host plan.
 */
import { assertBlockSize, assertSupported, attentionShape, numBlocks } from '../attention.js';
import type { Backend } from '../backend.js';
import { InvalidArgumentError } from '../errors.js';
import type { Policy } from '../policy.js';
import type { ProxyStatsOptions } from '../stats.js';
import type { DeviceTensor } from '../tensor.js';
import { sparseDerived, validatePolicyBlocks, validatePolicyOnce } from './derive.js';
import { type QueuedDevicePlan, queueDevicePlan } from './device-plan.js';
import { hostPlan } from './host-plan.js';
import { DEFAULTS, type PlanOptions, type PrefillPlan } from './types.js';

/**
 * A plan ready to run, or a device plan queued and not read back yet. The entries
 * (planPrefill, sparsePrefill) have checked the backend, the input tensors and the options.
 */
export type BuiltPlan = { readonly ready: PrefillPlan } | { readonly queued: QueuedDevicePlan };

export async function buildPlan(
  backend: Backend,
  inputs: { readonly q: DeviceTensor; readonly k: DeviceTensor; readonly v?: DeviceTensor },
  policy: Policy,
  opts: PlanOptions,
  markStats: boolean,
): Promise<BuiltPlan> {
  const t0 = performance.now();
  validatePolicyOnce(policy);
  const shape = attentionShape(inputs.q, inputs.k, inputs.v ?? inputs.k);
  assertSupported(backend.capabilities, shape, backend.name);
  const B = policy.blockSize ?? DEFAULTS.blockSize;
  assertBlockSize(B, backend.capabilities.blockSizes);
  const n = shape.keys;
  const H = shape.heads;
  const Nb = numBlocks(n, B);
  const kMin = policy.kMin ?? DEFAULTS.kMin;
  const dense = (reason: PrefillPlan['denseReason']): BuiltPlan => ({
    ready: {
      policy: policy.name,
      shape,
      blockSize: B,
      numBlocks: Nb,
      denseReason: reason,
      density: new Float64Array(H).fill(1),
      overallDensity: 1,
      planMs: performance.now() - t0,
    },
  });
  if (policy.dense) return dense('policy');
  validatePolicyBlocks(policy, B);
  // (chunked prefill, q the last m of n positions: the gates and the key blocks count keys;
  // the proxy rows are the chunk's last min(B, m) rows)
  // FlexPrefill's rule: too short to have anything to skip.
  if (n <= Math.max(2 * B, Math.ceil(kMin / B) * B)) return dense('min-length');
  // (opts.minSparseLength was checked by the entry; the backend's own crossover is checked here)
  const gate = opts.minSparseLength ?? backend.sparseCrossover;
  if (!(typeof gate === 'number' && Number.isFinite(gate) && gate >= 0)) {
    throw new InvalidArgumentError(`backend ${backend.name}: sparseCrossover must be a finite number >= 0 (keys); got ${gate}`);
  }
  if (n < gate) return dense('length-gate');

  const derived = sparseDerived(backend, policy, B);
  const statsOpts: ProxyStatsOptions = opts.scale === undefined ? derived.statsOpts : { ...derived.statsOpts, scale: opts.scale };
  const stats = await backend.proxyStats(inputs.q, inputs.k, statsOpts);
  const c = { t0, shape, B, Nb, peK: derived.peK, stats, scale: opts.scale };
  if (derived.device !== undefined) {
    return { queued: await queueDevicePlan(backend, inputs, policy, { ...c, rules: derived.device }, markStats) };
  }
  return { ready: await hostPlan(backend, inputs, policy, c) };
}
