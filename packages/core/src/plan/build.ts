/**
 * One plan path: validate, apply the dense gates, compute the proxy statistics, then either
 * the backend's device planner (when it runs the policy's router and selector rules) or the
 * host plan.
 */
import { type AttentionShape, assertBlockSize, assertSupported, attentionShape, numBlocks } from '../attention.js';
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
  const gate = opts.minSparseLength ?? (backend.sparseCrossoverFor ? backend.sparseCrossoverFor(shape.dtype, shape.headDim) : backend.sparseCrossover);
  const reason = denseGate(policy, shape.keys, B, gate, `backend ${backend.name}: ${backend.sparseCrossoverFor ? 'sparseCrossoverFor' : 'sparseCrossover'}`);
  if (reason !== undefined) return { ready: densePlan(policy, shape, B, reason, t0) };

  const derived = sparseDerived(backend, policy, B);
  const statsOpts: ProxyStatsOptions = opts.scale === undefined ? derived.statsOpts : { ...derived.statsOpts, scale: opts.scale };
  const stats = await backend.proxyStats(inputs.q, inputs.k, statsOpts);
  const c = { t0, shape, B, Nb: numBlocks(shape.keys, B), peK: derived.peK, stats, scale: opts.scale };
  if (derived.device !== undefined) {
    return { queued: await queueDevicePlan(backend, inputs, policy, { ...c, rules: derived.device }, markStats) };
  }
  const plan = await hostPlan((o) => backend.peBlockRows(inputs.q, inputs.k, o), policy, c);
  return { ready: derived.hostReason === undefined ? plan : { ...plan, hostReason: derived.hostReason } };
}

/**
 * Why the plan is dense, or undefined when it takes the sparse path: the policy is dense;
 * FlexPrefill's rule (n <= max(2B, kMin rounded up to B): too short to have anything to
 * skip); or n below the length gate `gate` (named `gateName` in its error when it is not a
 * finite number >= 0). Checks the policy's block-size rules on the sparse path.
 */
export function denseGate(policy: Policy, n: number, B: number, gate: unknown, gateName: string): PrefillPlan['denseReason'] | undefined {
  if (policy.dense) return 'policy';
  validatePolicyBlocks(policy, B);
  // (chunked prefill, q the last m of n positions: the gates and the key blocks count keys;
  // the proxy rows are the chunk's last min(B, m) rows)
  // FlexPrefill's rule: too short to have anything to skip.
  const kMin = policy.kMin ?? DEFAULTS.kMin;
  if (n <= Math.max(2 * B, Math.ceil(kMin / B) * B)) return 'min-length';
  // (a caller's minSparseLength was checked by the entry; a backend's own crossover is checked here)
  if (!(typeof gate === 'number' && Number.isFinite(gate) && gate >= 0)) {
    throw new InvalidArgumentError(`${gateName} must be a finite number >= 0 (keys); got ${gate}`);
  }
  return n < gate ? 'length-gate' : undefined;
}

/** A dense plan: every causal block of every head. */
export function densePlan(policy: Policy, shape: AttentionShape, B: number, reason: PrefillPlan['denseReason'], t0: number): PrefillPlan {
  const H = shape.heads;
  return {
    policy: policy.name,
    shape,
    blockSize: B,
    numBlocks: numBlocks(shape.keys, B),
    denseReason: reason,
    density: new Float64Array(H).fill(1),
    overallDensity: 1,
    planMs: performance.now() - t0,
  };
}
