/**
 * What a plan is: the inputs it is made for, its options, and the plan itself (routing, the
 * block mask, density, timings).
 *
 * Shape legend: q [m, H, d] (m <= n: m < n in chunked prefill), k and v [n, Hkv, d], B block size,
 * Nb = ceil(n / B).
 */
import type { AttentionShape } from '../attention.js';
import type { PreparedMask } from '../backend.js';
import type { BlockMask } from '../mask.js';
import type { RoutingDecision } from '../policy.js';
import type { ProxyStats } from '../stats.js';
import type { DeviceTensor } from '../tensor.js';

/**
 * One layer's inputs: q [m, H, d] (m = n for a whole prompt; m < n for a chunk: the queries
 * at positions n - m .. n - 1), k and v [n, Hkv, d] (for a chunk, the cached prefix's rows and
 * its own).
 */
export interface PrefillInputs {
  readonly q: DeviceTensor;
  readonly k: DeviceTensor;
  readonly v: DeviceTensor;
}

export interface PlanOptions {
  /** softmax scale, default 1/sqrt(d) */
  readonly scale?: number;
  /**
   * Length gate: below this many keys (n, the prefix and the chunk in chunked prefill) run dense. Default: the backend's measured
   * crossover (`backend.sparseCrossover`). Pass 0 to always take the sparse path when the
   * FlexPrefill minimum-length rule allows it.
   */
  readonly minSparseLength?: number;
}

export interface PrefillPlan {
  readonly policy: string;
  readonly shape: AttentionShape;
  readonly blockSize: number;
  readonly numBlocks: number;
  /** why the plan is dense, when it is ('empty': a sequence of a ragged batch with no queries) */
  readonly denseReason?: 'policy' | 'min-length' | 'length-gate' | 'empty';
  readonly stats?: ProxyStats;
  readonly routing?: RoutingDecision;
  /** undefined for dense plans. Host data: the VS lists and the PE heads' rows. */
  readonly mask?: BlockMask;
  /**
   * The mask as the backend's device planner built it (`Backend.planner`): runPlan runs this
   * instead of expanding `mask` again; absent for host plans and once released (sparsePrefill
   * releases it after its run; see releasePlan).
   */
  readonly prepared?: PreparedMask;
  /**
   * Set when the backend has a device planner (`Backend.planner`) and this plan was made on the
   * host all the same: what of the policy the planner does not run (a router or selector of
   * your own, with no device form; a recall guard; a rule the planner lacks). Absent on
   * device plans, dense plans and backends without a planner.
   */
  readonly hostReason?: string;
  /** [H] selected causal blocks / (Nb (Nb + 1) / 2); all ones for dense plans */
  readonly density: Float64Array;
  readonly overallDensity: number;
  /**
   * [H] the per-head check: the share of the proxy rows' attention mass (the last B queries)
   * inside the blocks the plan keeps for the last query block, from the statistics the plan
   * already has (docs/ALGORITHM.md, "The per-head check"). A head well below the others lost
   * mass its proxy rows could see. Absent for dense plans. What the other path would have kept
   * is `alternativeRecall(plan, policy)`, computed when asked for.
   */
  readonly proxyRecall?: Float64Array;
  /**
   * [H] vertical blocks the recall guard (`Policy.recallTarget`) added to each head; present
   * when the policy has a guard. `proxyRecall` is measured after them.
   */
  readonly guardAdded?: Int32Array;
  /**
   * milliseconds spent on proxy statistics, routing and selection (host wall clock; in
   * sparsePrefill's result on a backend with `mark`, measured between marks: see
   * PrefillResult.timings)
   */
  readonly planMs: number;
  /**
   * Where planMs went. Host plans (host wall clock, each backend call awaited): the proxy
   * statistics; routing plus VS selection and its validation; the backend's PE rows; placing
   * the rows and counting density. Device plans (`Backend.planner`): statsMs is the time to
   * queue the statistics, peRowsMs the device plan's queueing and read (routing, selection,
   * PE rows and mask on the device), selectMs the host router's check of the device's
   * routes, maskMs reading the block counts. In sparsePrefill's result on a device plan the
   * attention was queued behind the plan: statsMs and peRowsMs are measured between
   * marks (with `Backend.mark`; else host times, peRowsMs with the host's part of the mask,
   * `PreparedMask.complete`), selectMs and maskMs 0, and overlappedMs
   * the host work done while the attention ran. Absent for dense plans.
   */
  readonly phases?: PlanPhases;
}

export interface PlanPhases {
  readonly statsMs: number;
  readonly selectMs: number;
  readonly peRowsMs: number;
  readonly maskMs: number;
  /**
   * sparsePrefill on a device plan: host milliseconds spent after the attention was queued,
   * while it ran (reading the plan back, the host router's check, the density); not part of
   * planMs
   */
  readonly overlappedMs?: number;
}

export const DEFAULTS = Object.freeze({ blockSize: 128, wSink: 128, wLocal: 128, kMin: 1024 });
