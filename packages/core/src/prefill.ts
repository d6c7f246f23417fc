/**
 * The calls a runtime makes: plan a layer's attention, run a plan, release it, or do both in
 * one call.
 *
 *   proxyStats -> router -> VS selector per head   (host, or the backend's device planner)
 *              \-> PE rows                          (backend)
 *   -> BlockMask (a plan: data, inspectable, reusable) -> sparseAttention (backend)
 *
 * Shape legend: q [m, H, d], k and v [n, Hkv, d], m <= n, B block size, Nb = ceil(n / B).
 * m = n is a whole prompt; m < n is chunked prefill: q holds positions [n - m, n) of a
 * sequence whose keys and values [0, n) include the cached prefix.
 */
import { attentionShape } from './attention.js';
import type { AttentionOptions, AttentionResult, Backend, DeviceMark } from './backend.js';
import { InvalidArgumentError, describeValue } from './errors.js';
import { packVsLists } from './mask.js';
import { buildPlan } from './plan/build.js';
import type { PlanOptions, PrefillInputs, PrefillPlan } from './plan/types.js';
import type { Policy } from './policy.js';
import type { DeviceTensor } from './tensor.js';
import { assertBackend, assertCallOptions, assertInputs, assertOut } from './validate.js';

/**
 * Build a complete plan: statistics, routing, selection, PE rows, mask and density. Does not
 * run attention. A plan made by the backend's device planner also holds its mask on the
 * device (`plan.prepared`): runPlan uses it; `releasePlan` frees it.
 *
 * Chunked prefill: `q [m, H, d]` may be the last `m` of the `n` positions of `k [n, Hkv, d]`
 * (the chunk after a cached prefix, on a backend with `capabilities.chunkedPrefill`). The
 * plan is the policy's rules applied to that chunk: the gates count keys (n), the proxy rows
 * are the chunk's last min(B, m) rows, routing and VS selection cover all ceil(n / B) key
 * blocks, and the PE rows cover the chunk's query blocks only (from floor((n - m) / B)).
 * `plan.shape.queries` is m; the plan runs on that chunk only.
 */
export async function planPrefill(
  backend: Backend,
  inputs: Pick<PrefillInputs, 'q' | 'k'> & { v?: DeviceTensor },
  policy: Policy,
  opts: PlanOptions = {},
): Promise<PrefillPlan> {
  assertBackend(backend, 'planPrefill');
  assertInputs(inputs, backend, 'planPrefill', false);
  assertCallOptions(opts, 'planPrefill');
  const built = await buildPlan(backend, inputs, policy, opts ?? {}, false);
  return 'ready' in built ? built.ready : built.queued.finish(false);
}

/**
 * Release the device memory a plan's prepared mask holds (plans made by a device planner).
 * The plan stays usable: runPlan then expands plan.mask again.
 */
export function releasePlan(plan: PrefillPlan): void {
  if (!plan || typeof plan !== 'object') {
    throw new InvalidArgumentError(`releasePlan needs a plan (what planPrefill returned); got ${describeValue(plan)}`);
  }
  plan.prepared?.release();
}

/** Throws INVALID_ARGUMENT unless `plan` looks like what planPrefill returned. */
function assertPlan(plan: unknown): asserts plan is PrefillPlan {
  const p = plan as Partial<PrefillPlan> | null;
  if (
    !p ||
    typeof p !== 'object' ||
    !p.shape ||
    typeof p.shape !== 'object' ||
    !Number.isInteger(p.shape.keys) ||
    !Number.isInteger(p.shape.heads) ||
    (p.mask !== undefined && (typeof p.mask !== 'object' || p.mask === null))
  ) {
    throw new InvalidArgumentError(`runPlan needs a plan (what planPrefill returned); got ${describeValue(plan)}`);
  }
}

/**
 * Run a plan: dense or block-sparse attention. Allocates only the output. Every check
 * (backend, plan, inputs, options, `out`) rejects the returned promise with a CrispError.
 */
export async function runPlan(
  backend: Backend,
  plan: PrefillPlan,
  inputs: PrefillInputs,
  opts: AttentionOptions = {},
): Promise<AttentionResult> {
  assertBackend(backend, 'runPlan');
  assertPlan(plan);
  assertInputs(inputs, backend, 'runPlan', true);
  assertCallOptions(opts, 'runPlan');
  opts ??= {};
  const shape = attentionShape(inputs.q, inputs.k, inputs.v);
  assertOut(opts.out, inputs, shape, backend, 'runPlan');
  // (a chunk's plan holds PE rows for its own query blocks only: q must have its rows too)
  const planQueries = plan.shape.queries ?? plan.shape.keys;
  if (shape.keys !== plan.shape.keys || shape.heads !== plan.shape.heads || shape.queries !== planQueries) {
    throw new InvalidArgumentError(
      `plan was made for n=${plan.shape.keys}, m=${planQueries}, H=${plan.shape.heads}; inputs have n=${shape.keys}, m=${shape.queries}, H=${shape.heads}`,
    );
  }
  if (!plan.mask) return backend.denseAttention(inputs.q, inputs.k, inputs.v, opts);
  const prepared = plan.prepared && !plan.prepared.released ? plan.prepared : undefined;
  return backend.sparseAttention(inputs.q, inputs.k, inputs.v, plan.mask, prepared ? { ...opts, prepared } : opts);
}

export interface PrefillResult extends AttentionResult {
  /** the complete plan (its prepared mask released) */
  readonly plan: PrefillPlan;
  /**
   * Milliseconds. totalMs: host wall clock from the call until the output is ready
   * (synchronised). On a backend with `mark` (CUDA), planMs and attentionMs are on the device
   * timeline: planMs from the call until the attention could start (host time before and
   * between the plan's kernels counts, since the device waits for it), attentionMs from there
   * to the attention's end. Otherwise both are host wall clock (a device mask's host part,
   * `PreparedMask.complete`, in planMs); a plan the backend's device planner made is queued,
   * not waited for, so on such a backend without marks (WebGPU) planMs is the host's part of
   * the plan and attentionMs also holds the plan's device work. To time the two apart there,
   * await planPrefill and `backend.synchronize()`, then runPlan and `synchronize()`.
   */
  readonly timings: { readonly planMs: number; readonly attentionMs: number; readonly totalMs: number };
}

/**
 * Plan and run one layer (a whole prompt, or a chunk after a cached prefix: q the last m of
 * n positions, as planPrefill describes; the output is [m, H, d], and with `returnLse` the
 * LSE [H, m] that mergeAttentionByLse takes). The output stays on the backend. With a device planner the
 * attention is queued right behind the plan, and the plan is read back and checked (the host
 * router's routes must equal the device's) while it runs: a disagreement rejects with
 * BACKEND_ERROR after the attention ran, and its output is disposed (unless it was
 * `opts.out`). The prepared device mask is released after the run.
 */
export async function sparsePrefill(
  backend: Backend,
  inputs: PrefillInputs,
  policy: Policy,
  opts: PlanOptions & AttentionOptions = {},
): Promise<PrefillResult> {
  assertBackend(backend, 'sparsePrefill');
  assertInputs(inputs, backend, 'sparsePrefill', true);
  assertCallOptions(opts, 'sparsePrefill');
  opts ??= {};
  assertOut(opts.out, inputs, attentionShape(inputs.q, inputs.k, inputs.v), backend, 'sparsePrefill');
  const m0 = backend.mark?.();
  const t0 = performance.now();
  const built = await buildPlan(backend, inputs, policy, opts, m0 !== undefined);
  // A device mask the backend finishes on the host is finished here, inside the plan's time
  // (the attention could not start before it anyway).
  let completeMs = 0;
  if ('queued' in built && built.queued.prepared.complete) {
    const tc = performance.now();
    try {
      await built.queued.prepared.complete();
    } catch (e) {
      built.queued.prepared.release();
      throw e;
    }
    completeMs = performance.now() - tc;
  }
  const m1 = m0 ? backend.mark?.() : undefined;
  const t1 = performance.now();
  let result: AttentionResult;
  let plan: PrefillPlan;
  let m2: DeviceMark | undefined;
  if ('ready' in built) {
    plan = built.ready;
    result = await runPlan(backend, plan, inputs, opts);
    m2 = m1 ? backend.mark?.() : undefined;
    await backend.synchronize();
  } else {
    const queued = built.queued;
    try {
      // the attention on the device plan's mask, queued before anything is read back (the
      // host-side mask argument only carries the shape; the prepared mask is what runs)
      const { heads: H, numBlocks: Nb, blockSize: B } = queued.prepared;
      const none: number[][] = Array.from({ length: H }, () => []);
      const shell = { heads: H, numBlocks: Nb, blockSize: B, vs: packVsLists(none, none) };
      result = await backend.sparseAttention(inputs.q, inputs.k, inputs.v, shell, { ...opts, prepared: queued.prepared });
      m2 = m1 ? backend.mark?.() : undefined;
      let full: PrefillPlan;
      try {
        full = await queued.finish(true);
      } catch (e) {
        await backend.synchronize();
        if (!opts.out) result.output.dispose();
        result.lse?.dispose();
        throw e;
      }
      const { prepared: _released, ...rest } = full;
      const sm = queued.statsMark;
      // synchronised before the prepared mask goes back (the attention reads it)
      await backend.synchronize();
      // the marks' split of the plan: the statistics, then the rest up to the attention
      plan = sm && m0 && m1 && rest.phases ? { ...rest, phases: { ...rest.phases, statsMs: sm.msSince(m0), peRowsMs: m1.msSince(sm) } } : rest;
    } finally {
      queued.prepared.release();
    }
  }
  const t2 = performance.now();
  if (!(m0 && m1 && m2)) {
    // host clock: the plan is everything before the attention was queued (the host's part of
    // a device mask in its PE phase)
    const phases = plan.phases && completeMs > 0 ? { ...plan.phases, peRowsMs: plan.phases.peRowsMs + completeMs } : plan.phases;
    const hostPlan = { ...plan, planMs: t1 - t0, ...(phases ? { phases } : {}) };
    return { ...result, plan: hostPlan, timings: { planMs: t1 - t0, attentionMs: t2 - t1, totalMs: t2 - t0 } };
  }
  const planMs = m1.msSince(m0);
  return { ...result, plan: { ...plan, planMs }, timings: { planMs, attentionMs: m2.msSince(m1), totalMs: t2 - t0 } };
}
