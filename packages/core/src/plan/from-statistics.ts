/**
 * A plan from statistics computed elsewhere: a sharded (context-parallel) prefill gathers the
 * proxy statistics and the pooled block means from its ranks, and every rank then makes the
 * plan itself. The gates, the router, the VS selection, the guards, the PE rows' placement,
 * the per-head check and the density are the host plan's, so the plan equals the one a single
 * backend would make from the same statistics.
 */
import { type AttentionShape, numBlocks } from '../attention.js';
import type { PeRowsOptions } from '../backend.js';
import { InvalidArgumentError, describeValue } from '../errors.js';
import type { BlockRows } from '../mask.js';
import type { Policy } from '../policy.js';
import type { ProxyStats, ProxyStatsOptions } from '../stats.js';
import { denseGate, densePlan } from './build.js';
import { deriveSparse, validatePolicyOnce } from './derive.js';
import { hostPlan } from './host-plan.js';
import { DEFAULTS, type PlanOptions, type PrefillPlan } from './types.js';

/** Where the statistics and the PE rows of a plan made by `planFromStatistics` come from. */
export interface StatisticsSource {
  /** names the source in errors */
  readonly name: string;
  /** The proxy statistics of the whole sequence, computed with these options. */
  proxyStats(opts: ProxyStatsOptions): Promise<ProxyStats>;
  /** The listed PE heads' rows over the whole sequence (peBlockRows' form, heads ascending). */
  peBlockRows(opts: PeRowsOptions): Promise<BlockRows>;
}

/**
 * Make the plan of one layer whose statistics come from `source` (`shape` is the whole
 * layer's). The length gate is `opts.minSparseLength` (default 0: sparse whenever
 * FlexPrefill's minimum-length rule allows it). Validates the policy and the options first.
 */
export async function planFromStatistics(source: StatisticsSource, shape: AttentionShape, policy: Policy, opts: PlanOptions = {}): Promise<PrefillPlan> {
  const t0 = performance.now();
  if (!source || typeof source.proxyStats !== 'function' || typeof source.peBlockRows !== 'function') {
    throw new InvalidArgumentError(`planFromStatistics needs a source with proxyStats(opts) and peBlockRows(opts); got ${describeValue(source)}`);
  }
  validatePolicyOnce(policy);
  const B = policy.blockSize ?? DEFAULTS.blockSize;
  const reason = denseGate(policy, shape.keys, B, opts.minSparseLength ?? 0, `${source.name}: minSparseLength`);
  if (reason !== undefined) return densePlan(policy, shape, B, reason, t0);
  const derived = deriveSparse(undefined, policy, B);
  const statsOpts: ProxyStatsOptions = opts.scale === undefined ? derived.statsOpts : { ...derived.statsOpts, scale: opts.scale };
  const stats = await source.proxyStats(statsOpts);
  const Nb = numBlocks(shape.keys, B);
  if (stats.numBlocks !== Nb || stats.heads !== shape.heads || stats.n !== shape.keys) {
    throw new InvalidArgumentError(
      `${source.name}: statistics for n ${stats.n}, ${stats.heads} heads, ${stats.numBlocks} blocks; the layer has n ${shape.keys}, ${shape.heads} heads, ${Nb} blocks`,
    );
  }
  return hostPlan((o) => source.peBlockRows(o), policy, { t0, shape, B, Nb, peK: derived.peK, stats, scale: opts.scale });
}
