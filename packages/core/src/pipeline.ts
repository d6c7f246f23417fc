/**
 * sparsePrefill: one layer's attention through a backend and a policy.
 *
 *   proxyStats (backend, fused) -> router (host) -> VS selector per head (host)
 *                                             \-> PE rows (backend primitive)
 *   -> BlockMask (a plan: data, inspectable, reusable) -> sparseAttention (backend)
 *
 * On a backend that runs the router's and the selector's rules on the device
 * (`planOnDevice`), the statistics, routing, selection and mask building are one queue of
 * device work that reads nothing back; sparsePrefill queues the attention behind it, then
 * reads the plan while the attention runs: the host router re-routes on the same statistics
 * and must agree.
 *
 * Shape legend: q [n, H, d], k and v [n, Hkv, d], B block size, Nb = ceil(n / B).
 */
import { assertBlockSize, assertSupported, attentionShape, type AttentionShape, numBlocks } from './attention.js';
import type { AttentionOptions, AttentionResult, Backend, DeviceMark, DevicePlanOutcome, PreparedMask } from './backend.js';
import { CrispError, InvalidArgumentError } from './errors.js';
import {
  type BlockMask,
  type BlockRows,
  densityFromCounts,
  maskDensity,
  spreadRowPtr,
  validateMask,
  vsListsFromArrays,
  type VsLists,
} from './mask.js';
import type { DeviceRouterRule, DeviceSelectorRule, Policy, Route, RoutingDecision, VsSelector } from './policy.js';
import { topKIndices, unionSorted } from './ranking.js';
import { assertFiniteStats, headSlice, type OptionalStat, type ProxyStats, type ProxyStatsOptions, wantedOptionalStats } from './stats.js';
import type { DeviceTensor } from './tensor.js';

export interface PrefillInputs {
  readonly q: DeviceTensor;
  readonly k: DeviceTensor;
  readonly v: DeviceTensor;
}

export interface PlanOptions {
  /** softmax scale, default 1/sqrt(d) */
  readonly scale?: number;
  /**
   * Length gate: below this many keys run dense. Default: the backend's measured
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
  /** why the plan is dense, when it is */
  readonly denseReason?: 'policy' | 'min-length' | 'length-gate';
  readonly stats?: ProxyStats;
  readonly routing?: RoutingDecision;
  /**
   * undefined for dense plans. Host data: the VS lists and the PE heads' rows (inside
   * sparsePrefill the rows arrive after the attention is launched; the returned plan has them).
   */
  readonly mask?: BlockMask;
  /**
   * The mask as the backend prepared it (backends with `prepareMask`): runPlan runs this;
   * absent once released (sparsePrefill releases it after its run; see releasePlan).
   */
  readonly prepared?: PreparedMask;
  /** [H] selected causal blocks / (Nb (Nb + 1) / 2); all ones for dense plans */
  readonly density: Float64Array;
  readonly overallDensity: number;
  /**
   * milliseconds spent on proxy statistics, routing and selection (host wall clock; in
   * sparsePrefill's result on a backend with `mark`, the device timeline: see
   * PrefillResult.timings)
   */
  readonly planMs: number;
  /**
   * Where planMs went (host wall clock, each backend call awaited): proxy statistics;
   * routing plus VS selection and validation on the host (routing alone when the backend
   * selects on the device: that selection is in peRowsMs); the backend's PE rows (on a
   * backend with prepareMask: PE rows built, merged with the VS lists, expanded and counted
   * on the device); the rest of the mask assembly (placing PE rows and counting density on
   * the host, or reading the device's counts). On a backend that plans on the device
   * (`planOnDevice`): statsMs is the time to queue the statistics, peRowsMs the device plan
   * to its read (the statistics' device time included), selectMs the host re-routing that
   * checks the device's routes. In sparsePrefill's result there, the attention was queued
   * behind the plan: statsMs and peRowsMs are device timeline (with `Backend.mark`; else the
   * host's queueing times), selectMs and maskMs 0, and overlappedMs the host work done while
   * the attention ran. Absent for dense plans.
   */
  readonly phases?: PlanPhases;
}

export interface PlanPhases {
  readonly statsMs: number;
  readonly selectMs: number;
  readonly peRowsMs: number;
  readonly maskMs: number;
  /**
   * sparsePrefill on a backend that plans on the device: host milliseconds spent after the
   * attention was queued, while it ran (reading the plan back, the host router's check, the
   * density); not part of planMs
   */
  readonly overlappedMs?: number;
}

export const DEFAULTS = Object.freeze({ blockSize: 128, wSink: 128, wLocal: 128, kMin: 1024 });

function validatePolicy(policy: Policy): void {
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

/** The policy and the parts buildPlan reads frozen (the presets, the factories' objects). */
function frozenPolicy(policy: Policy): boolean {
  const { router, vs, pe } = policy;
  return (
    Object.isFrozen(policy) &&
    (router === undefined || (Object.isFrozen(router) && Object.isFrozen(router.needs ?? router) && Object.isFrozen(router.device ?? router))) &&
    (vs === undefined || (Object.isFrozen(vs) && Object.isFrozen(vs.needs ?? vs) && Object.isFrozen(vs.device ?? vs))) &&
    (pe === undefined || Object.isFrozen(pe))
  );
}

interface SparseDerived {
  readonly blockSize: number;
  readonly needsTokens: boolean;
  readonly peK: number;
  readonly routeRule: DeviceRouterRule | undefined;
  readonly vsRule: DeviceSelectorRule | undefined;
  /** the whole plan on the device (statistics, routing, selection, mask, read back after) */
  readonly devicePlan: boolean;
  /** proxyStats' options with the default scale (one object literal, no spreads) */
  readonly statsOpts: ProxyStatsOptions;
}

/**
 * sparseDerived's last result for each backend and frozen policy (weak both ways: a disposed
 * backend is not kept alive by a preset that outlives it)
 */
const derivedCache = new WeakMap<Backend, WeakMap<Policy, SparseDerived>>();

function sparseDerived(backend: Backend, policy: Policy, B: number): SparseDerived {
  let byPolicy = derivedCache.get(backend);
  const hit = byPolicy?.get(policy);
  if (hit !== undefined && hit.blockSize === B) return hit;
  const needsTokens = Boolean(policy.router!.needs?.tokenScores || policy.vs!.needs?.tokenScores);
  // The whole plan on the device when the backend runs both the router's and the selector's
  // rule there: statistics, routing, selection and mask building queued back to back, read
  // back only afterwards (no host round trip between the statistics and the attention).
  const routeRule = policy.router!.device;
  const vsRule = policy.vs!.device;
  const devicePlan =
    backend.planOnDevice !== undefined &&
    routeRule !== undefined &&
    backend.deviceRouters?.includes(routeRule.kind) === true &&
    vsRule !== undefined &&
    !needsTokens &&
    vsRule.kMin % B === 0 &&
    backend.deviceSelectors?.includes(vsRule.kind) === true;
  const d: SparseDerived = {
    blockSize: B,
    needsTokens,
    peK: Math.ceil(policy.pe!.kMin / B),
    routeRule,
    vsRule,
    devicePlan,
    statsOpts: Object.freeze({
      blockSize: B,
      wSink: statsWindow(policy, 'wSink'),
      wLocal: statsWindow(policy, 'wLocal'),
      scale: undefined,
      tokenScores: needsTokens,
      deferRead: devicePlan,
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
 * Build a plan: statistics, routing, selection. Does not run attention. On a backend with
 * `prepareMask` the plan also holds the mask prepared on the device (`plan.prepared`):
 * runPlan uses it; `releasePlan` frees it (sparsePrefill does both).
 */
export async function planPrefill(
  backend: Backend,
  inputs: Pick<PrefillInputs, 'q' | 'k'> & { v?: DeviceTensor },
  policy: Policy,
  opts: PlanOptions = {},
): Promise<PrefillPlan> {
  return (await buildPlan(backend, inputs, policy, opts, false)).plan;
}

interface BuiltPlan {
  /**
   * with deferred PE rows, the plan's mask lacks them until complete() (and, planned on the
   * device, its VS lists: the plan is run through its prepared mask)
   */
  readonly plan: PrefillPlan;
  readonly complete: () => Promise<PrefillPlan>;
  /** deferred device plans: the device timeline where the statistics end (Backend.mark) */
  readonly statsMark?: DeviceMark;
}

async function buildPlan(
  backend: Backend,
  inputs: Pick<PrefillInputs, 'q' | 'k'> & { v?: DeviceTensor },
  policy: Policy,
  opts: PlanOptions,
  deferRows: boolean,
): Promise<BuiltPlan> {
  const t0 = performance.now();
  if (!validated.has(policy)) {
    validatePolicy(policy);
    if (frozenPolicy(policy)) validated.add(policy);
  }
  const shape = attentionShape(inputs.q, inputs.k, inputs.v ?? inputs.k);
  assertSupported(backend.capabilities, shape, backend.name);
  const B = policy.blockSize ?? DEFAULTS.blockSize;
  assertBlockSize(B, backend.capabilities.blockSizes);
  const n = shape.keys;
  const H = shape.heads;
  const Nb = numBlocks(n, B);
  const kMin = policy.kMin ?? DEFAULTS.kMin;
  const dense = (reason: PrefillPlan['denseReason']): BuiltPlan => {
    const plan: PrefillPlan = {
      policy: policy.name,
      shape,
      blockSize: B,
      numBlocks: Nb,
      denseReason: reason,
      density: new Float64Array(H).fill(1),
      overallDensity: 1,
      planMs: performance.now() - t0,
    };
    return { plan, complete: async () => plan };
  };
  if (policy.dense) return dense('policy');
  if (shape.queries !== shape.keys) {
    throw new InvalidArgumentError('sparse plans need q and k of equal length for now; use the dense policy for chunks');
  }
  // FlexPrefill's rule: too short to have anything to skip.
  if (n <= Math.max(2 * B, Math.ceil(kMin / B) * B)) return dense('min-length');
  const gate = opts.minSparseLength ?? backend.sparseCrossover;
  if (!(Number.isFinite(gate) && gate >= 0)) {
    throw new InvalidArgumentError(`minSparseLength must be a finite number >= 0 (keys); got ${gate}`);
  }
  if (n < gate) return dense('length-gate');

  // What the sparse path reads off the policy and the backend: derived once for a frozen
  // policy (every preset) on a given backend and block size, each call otherwise. From an idle
  // device the host's time to the pass's launch counts in the plan, and after a wait the
  // host's code and data are cold: the less it touches there, the better (NOTES, session 23).
  const derived = sparseDerived(backend, policy, B);
  const { needsTokens, peK, routeRule, vsRule, devicePlan } = derived;
  const statsOpts: ProxyStatsOptions = opts.scale === undefined ? derived.statsOpts : { ...derived.statsOpts, scale: opts.scale };
  const stats = await backend.proxyStats(inputs.q, inputs.k, statsOpts);
  if (devicePlan && routeRule !== undefined && vsRule !== undefined) {
    return devicePlanned(backend, inputs, policy, opts, deferRows, { t0, shape, B, Nb, stats, peK, routeRule, vsRule });
  }
  assertFiniteStats(stats);
  const tStats = performance.now();
  const { routing, peHeads } = routeOnHost(policy, stats, H);
  // routing counts as selection; selectVs adds its own time
  let selectMs = performance.now() - tStats;
  const selectVs = () => {
    const ts = performance.now();
    const lists = selectVsLists(stats, routing.routes, policy.vs!, peK);
    // Selectors may be user code: check what they returned. The PE rows come from the
    // backend, which validates masks itself when it runs them, so they are not scanned here
    // (at 512k they can hold tens of millions of entries).
    validateMask({ heads: H, numBlocks: Nb, blockSize: B, vs: lists }, { heads: H, numBlocks: Nb, blockSize: B });
    selectMs += performance.now() - ts;
    return lists;
  };
  const peOpts = { blockSize: B, gamma: policy.pe!.gamma, heads: peHeads, scale: opts.scale };
  const base = { policy: policy.name, shape, blockSize: B, numBlocks: Nb, stats, routing };
  if (backend.prepareMask) {
    // The backend queues the PE rows' kernels, then runs selectVs (host work overlapping
    // them), merges and expands the mask and counts it on the device; the PE rows come to
    // the host afterwards (overlapping attention in sparsePrefill). selectMs is the time
    // spent in selectVs; peRowsMs the rest of prepareMask. When the backend can run the
    // policy's selector rule on the device, it selects there too (the block scores are
    // already there) and returns the lists: selectMs is then the routing alone.
    const rule = policy.vs!.device;
    const onDevice =
      rule !== undefined && !needsTokens && rule.kMin % B === 0 && backend.deviceSelectors?.includes(rule.kind) === true;
    let vs: VsLists | undefined;
    const r = await backend.prepareMask({
      heads: H,
      numBlocks: Nb,
      blockSize: B,
      vs: onDevice
        ? { device: { rule, stats, routes: routing.routes, peK } }
        : () => {
            vs = selectVs();
            return vs;
          },
      pe: peHeads.length > 0 ? { q: inputs.q, k: inputs.k, opts: peOpts } : undefined,
    });
    if (onDevice) vs = r.vs;
    if (!vs) {
      r.prepared.release();
      throw new InvalidArgumentError(
        `backend ${backend.name}: prepareMask returned without ${onDevice ? 'the VS lists it selected' : "calling the request's vs()"}`,
      );
    }
    const tPe = performance.now();
    const { perHead: density, overall: overallDensity } = densityFromCounts(r.prepared.blockCounts, Nb);
    const tEnd = performance.now();
    const phases = { statsMs: tStats - t0, selectMs, peRowsMs: tPe - tStats - selectMs, maskMs: tEnd - tPe };
    const fields = { ...base, density, overallDensity, planMs: tEnd - t0, phases };
    return preparedPlan(fields, r.prepared, vs, r.peRows, peHeads, deferRows);
  }
  const vs = selectVs();
  const tSelect = performance.now();
  let rows: BlockRows | undefined;
  let tPe = tSelect;
  if (peHeads.length > 0) {
    const pe = await backend.peBlockRows(inputs.q, inputs.k, peOpts);
    tPe = performance.now();
    rows = spreadRows(pe, peHeads, H, Nb);
  }
  const mask: BlockMask = { heads: H, numBlocks: Nb, blockSize: B, vs, rows };
  const { perHead, overall } = maskDensity(mask);
  const tEnd = performance.now();
  const p: PrefillPlan = {
    ...base,
    mask,
    density: perHead,
    overallDensity: overall,
    planMs: tEnd - t0,
    phases: { statsMs: tStats - t0, selectMs: tSelect - tStats, peRowsMs: tPe - tSelect, maskMs: tEnd - tPe },
  };
  return { plan: p, complete: async () => p };
}

/** The optional statistics the policy's router declares it reads (undefined: it does not say, so all). */
function optionalStatsOf(policy: Policy): readonly OptionalStat[] | undefined {
  const declared = policy.router!.needs?.optionalStats;
  return declared === undefined ? undefined : wantedOptionalStats(declared, `router ${policy.router!.name}: needs.optionalStats`);
}

/** The policy's router on the host, its H routes checked, and the PE heads ascending. */
function routeOnHost(policy: Policy, stats: ProxyStats, H: number): { routing: RoutingDecision; peHeads: number[] } {
  const routing = policy.router!.route(stats);
  if (routing.routes.length !== H) {
    throw new InvalidArgumentError(`router ${policy.router!.name} returned ${routing.routes.length} routes for ${H} heads`);
  }
  const peHeads: number[] = [];
  for (let h = 0; h < H; h++) if (routing.routes[h] === 'pe') peHeads.push(h);
  return { routing, peHeads };
}

/**
 * The plan on a backend that routes, selects and builds the mask on the device
 * (`planOnDevice`): the statistics were queued without a read (`deferRead`) and the device
 * plan reads nothing back either. Then the host router runs on the same statistics: its
 * routes must equal the device's (the rule is the same comparison), and the plan reports the
 * host's RoutingDecision. planPrefill does that at once (statsMs is the time to queue the
 * statistics, peRowsMs the device plan up to its read, selectMs the host re-routing);
 * sparsePrefill (deferRows) first queues the attention behind the plan and does it in
 * complete(), while the attention runs (its phases come from the device timeline there).
 */
async function devicePlanned(
  backend: Backend,
  inputs: Pick<PrefillInputs, 'q' | 'k'>,
  policy: Policy,
  opts: PlanOptions,
  deferRows: boolean,
  c: {
    t0: number;
    shape: AttentionShape;
    B: number;
    Nb: number;
    stats: ProxyStats;
    peK: number;
    routeRule: DeviceRouterRule;
    vsRule: DeviceSelectorRule;
  },
): Promise<BuiltPlan> {
  const { t0, shape, B, Nb, stats } = c;
  const H = shape.heads;
  const statsMark = deferRows ? backend.mark?.() : undefined;
  const tStats = performance.now();
  const r = await backend.planOnDevice!({
    stats,
    route: c.routeRule,
    vs: c.vsRule,
    peK: c.peK,
    pe: { q: inputs.q, k: inputs.k, gamma: policy.pe!.gamma, scale: opts.scale },
  });
  const tDevice = performance.now();
  const finish = async (): Promise<PrefillPlan> => {
    const tRead = performance.now();
    let routing: RoutingDecision;
    let peHeads: number[];
    let outcome: DevicePlanOutcome;
    try {
      // the device's routes and lists (waiting for the plan), then the statistics (non-finite
      // ones throw here)
      outcome = r.read();
      assertFiniteStats(stats);
      ({ routing, peHeads } = routeOnHost(policy, stats, H));
      if (!routing.routes.every((x, h) => x === outcome.routes[h])) {
        throw new CrispError(
          'BACKEND_ERROR',
          `backend ${backend.name}: the device routed [${outcome.routes.join(',')}], router ${policy.router!.name} routes [${routing.routes.join(',')}] on the same statistics`,
        );
      }
    } catch (e) {
      r.prepared.release();
      throw e;
    }
    const tRoute = performance.now();
    const { perHead: density, overall: overallDensity } = densityFromCounts(r.prepared.blockCounts, Nb);
    const tEnd = performance.now();
    // deferred: the host's queueing times (sparsePrefill puts the device timeline's in)
    const phases = deferRows
      ? { statsMs: tStats - t0, selectMs: 0, peRowsMs: tDevice - tStats, maskMs: 0, overlappedMs: tEnd - tRead }
      : { statsMs: tStats - t0, selectMs: tRoute - tDevice, peRowsMs: tDevice - tStats, maskMs: tEnd - tRoute };
    const planMs = deferRows ? tDevice - t0 : tEnd - t0;
    const fields = { policy: policy.name, shape, blockSize: B, numBlocks: Nb, stats, routing, density, overallDensity, planMs, phases };
    return (await preparedPlan(fields, r.prepared, outcome.vs, outcome.peRows, peHeads, false)).plan;
  };
  if (!deferRows) {
    const plan = await finish();
    return { plan, complete: async () => plan };
  }
  // sparsePrefill: the attention runs this plan's prepared mask as soon as it is queued; the
  // plan it reports is complete()'s
  const none: number[][] = Array.from({ length: H }, () => []);
  const empty = vsListsFromArrays(none, none);
  const queued: PrefillPlan = {
    policy: policy.name,
    shape,
    blockSize: B,
    numBlocks: Nb,
    stats,
    mask: { heads: H, numBlocks: Nb, blockSize: B, vs: empty },
    prepared: r.prepared,
    density: new Float64Array(H).fill(Number.NaN),
    overallDensity: Number.NaN,
    planMs: tDevice - t0,
  };
  return { plan: queued, complete: finish, ...(statsMark ? { statsMark } : {}) };
}

/**
 * A plan over a backend's prepared mask. Its mask gets the PE heads' rows now, or
 * (deferRows: sparsePrefill) in complete(), once the attention is launched; until then that
 * mask lacks them: it is not returned, and a prepared mask is run as prepared.
 */
async function preparedPlan(
  fields: Omit<PrefillPlan, 'mask' | 'prepared'>,
  prepared: PreparedMask,
  vs: VsLists,
  peRows: (() => Promise<BlockRows>) | undefined,
  peHeads: readonly number[],
  deferRows: boolean,
): Promise<BuiltPlan> {
  const { heads: H } = fields.shape;
  const { numBlocks: Nb, blockSize: B } = fields;
  const plan = (rows?: BlockRows): PrefillPlan => ({
    ...fields,
    mask: { heads: H, numBlocks: Nb, blockSize: B, vs, rows },
    prepared,
  });
  const withRows = async () => plan(peRows ? spreadRows(await peRows(), peHeads, H, Nb) : undefined);
  if (deferRows) return { plan: plan(), complete: withRows };
  const p = await withRows();
  return { plan: p, complete: async () => p };
}

/**
 * A plan's VS lists selected on the host: VS heads by `selector` over their block scores (and
 * token scores, when the statistics hold them), PE heads the `peK` best blocks of each
 * direction, ∪ {0} in the slash one (FlexPrefill gives PE heads the kMin best vertical and
 * slash blocks too, so every query block keeps at least its diagonal block). What the
 * pipeline runs when the backend does not select on the device, and what a device selection
 * (`DeviceVsRequest`) must equal.
 */
export function selectVsLists(stats: ProxyStats, routes: readonly Route[], selector: VsSelector, peK: number): VsLists {
  const { heads: H, numBlocks: Nb, blockSize: B, n } = stats;
  const vertical: Int32Array[] = [];
  const slash: Int32Array[] = [];
  for (let h = 0; h < H; h++) {
    const pv = headSlice(stats.verticalBlocks, h, Nb);
    const ps = headSlice(stats.slashBlocks, h, Nb);
    if (routes[h] === 'pe') {
      vertical.push(topKIndices(pv, peK));
      slash.push(unionSorted(topKIndices(ps, peK), [0]));
      continue;
    }
    const select = (direction: 'vertical' | 'slash', blockScores: Float64Array, tokens?: Float32Array) =>
      selector.select({ head: h, blockSize: B, n, direction, blockScores, tokenScores: tokens ? headSlice(tokens, h, n) : undefined });
    vertical.push(select('vertical', pv, stats.verticalTokens));
    slash.push(select('slash', ps, stats.slashTokens));
  }
  return vsListsFromArrays(vertical, slash);
}

/**
 * Release the device memory a plan's prepared mask holds (plans from planPrefill on a
 * backend with prepareMask). The plan stays usable: runPlan then expands plan.mask again.
 */
export function releasePlan(plan: PrefillPlan): void {
  plan.prepared?.release();
}

/** Place rows built for a subset of heads into an all-heads row set (other heads empty). */
function spreadRows(sub: BlockRows, heads: readonly number[], H: number, Nb: number): BlockRows {
  return { rowPtr: spreadRowPtr(sub.rowPtr, heads, H, Nb), cols: sub.cols };
}

/** Run a plan: dense or block-sparse attention. Allocates only the output. */
export function runPlan(
  backend: Backend,
  plan: PrefillPlan,
  inputs: PrefillInputs,
  opts: AttentionOptions = {},
): Promise<AttentionResult> {
  const shape = attentionShape(inputs.q, inputs.k, inputs.v);
  if (shape.keys !== plan.shape.keys || shape.heads !== plan.shape.heads) {
    throw new InvalidArgumentError(
      `plan was made for n=${plan.shape.keys}, H=${plan.shape.heads}; inputs have n=${shape.keys}, H=${shape.heads}`,
    );
  }
  if (!plan.mask) return backend.denseAttention(inputs.q, inputs.k, inputs.v, opts);
  const prepared = plan.prepared && !plan.prepared.released ? plan.prepared : undefined;
  return backend.sparseAttention(inputs.q, inputs.k, inputs.v, plan.mask, prepared ? { ...opts, prepared } : opts);
}

export interface PrefillResult extends AttentionResult {
  readonly plan: PrefillPlan;
  /**
   * Milliseconds. totalMs: host wall clock from the call until the output is ready
   * (synchronised). On a backend with `mark` (CUDA), planMs and attentionMs are on the device
   * timeline: planMs from the call until the attention could start (host time before and
   * between the plan's kernels counts, since the device waits for it), attentionMs from there
   * to the attention's end. Otherwise both are host wall clock, each step awaited.
   */
  readonly timings: { readonly planMs: number; readonly attentionMs: number; readonly totalMs: number };
}

/**
 * Plan and run one layer. The output stays on the backend. The PE rows reach the host
 * (result.plan.mask) while the attention runs, and the prepared device mask is released
 * after the run. On a backend that plans on the device, the attention is queued right behind
 * the plan, and the plan is read back and checked (the host router's routes must equal the
 * device's) while it runs: a disagreement rejects with BACKEND_ERROR after the attention
 * ran, and its output is disposed (unless it was `opts.out`).
 */
export async function sparsePrefill(
  backend: Backend,
  inputs: PrefillInputs,
  policy: Policy,
  opts: PlanOptions & AttentionOptions = {},
): Promise<PrefillResult> {
  const m0 = backend.mark?.();
  const t0 = performance.now();
  const built = await buildPlan(backend, inputs, policy, opts, true);
  const m1 = m0 ? backend.mark?.() : undefined;
  const t1 = performance.now();
  try {
    const result = await runPlan(backend, built.plan, inputs, opts);
    const m2 = m1 ? backend.mark?.() : undefined;
    let full: PrefillPlan;
    try {
      full = await built.complete();
    } catch (e) {
      await backend.synchronize();
      if (!opts.out) result.output.dispose();
      result.lse?.dispose();
      throw e;
    }
    await backend.synchronize();
    const t2 = performance.now();
    const { prepared: _released, ...plan } = full;
    if (!(m0 && m1 && m2)) {
      return { ...result, plan, timings: { planMs: t1 - t0, attentionMs: t2 - t1, totalMs: t2 - t0 } };
    }
    const planMs = m1.msSince(m0);
    const sm = built.statsMark;
    const phases = sm && plan.phases ? { ...plan.phases, statsMs: sm.msSince(m0), peRowsMs: m1.msSince(sm) } : plan.phases;
    return {
      ...result,
      plan: { ...plan, planMs, ...(phases ? { phases } : {}) },
      timings: { planMs, attentionMs: m2.msSince(m1), totalMs: t2 - t0 },
    };
  } finally {
    built.plan.prepared?.release();
  }
}
