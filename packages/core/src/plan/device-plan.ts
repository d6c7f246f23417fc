/**
 * The plan made by the backend's device planner (`Backend.planner`): the statistics were
 * queued without a read (`deferRead`), and the planner queues routing, VS selection, the PE
 * rows and the mask behind them, reading nothing back. The attention can then be queued right
 * behind the plan (sparsePrefill does). Reading the plan back (`finish`) waits for the plan's
 * kernels only; the host router then runs on the same statistics, and its routes must equal
 * the device's (the device rule is the same comparison; device-route.ts has the one margin):
 * the plan reports the host's RoutingDecision.
 */
import type { AttentionShape } from '../attention.js';
import type { Backend, DeviceMark, DevicePlanOutcome, DevicePlanResult, PreparedMask } from '../backend.js';
import { CrispError } from '../errors.js';
import { densityFromCounts } from '../mask.js';
import type { DeviceRouterRule, Policy, Route, RoutingDecision } from '../policy.js';
import { assertFiniteStats, type ProxyStats } from '../stats.js';
import type { DeviceTensor } from '../tensor.js';
import type { DeviceRules } from './derive.js';
import { deviceRouteTerms, routeMarginal } from './device-route.js';
import { checkRecall, routeOnHost, spreadRows } from './host-plan.js';
import type { PrefillPlan } from './types.js';

export interface DevicePlanContext {
  readonly t0: number;
  readonly shape: AttentionShape;
  readonly B: number;
  readonly Nb: number;
  readonly peK: number;
  readonly stats: ProxyStats;
  readonly rules: DeviceRules;
  readonly scale: number | undefined;
}

/** A device plan queued and not read back yet. */
export interface QueuedDevicePlan {
  /** the plan's mask on the device, ready for sparseAttention */
  readonly prepared: PreparedMask;
  /** a mark (Backend.mark) where the statistics end, when asked for */
  readonly statsMark?: DeviceMark;
  /**
   * Read the plan back and check it: the complete plan (with `prepared`). `overlapped`: the
   * attention was queued behind the plan first (sparsePrefill), so the phases report queueing
   * times and the host work after the queueing as overlappedMs. Releases `prepared` when it
   * throws.
   */
  finish(overlapped: boolean): Promise<PrefillPlan>;
}

/**
 * The host router's decision checked against the device's routes: equal, except on heads
 * whose residual test is within the planner's margin of a threshold (device-route.ts), where
 * the device's route stands (the mask was built from it). Any other difference is the
 * backend's fault (BACKEND_ERROR).
 */
function agreedRoutes(
  routing: RoutingDecision,
  device: readonly Route[],
  rule: DeviceRouterRule,
  stats: ProxyStats,
  margin: number,
  who: string,
  router: string,
): RoutingDecision {
  let terms: ReturnType<typeof deviceRouteTerms> | null = null;
  let differ = false;
  for (let h = 0; h < routing.routes.length; h++) {
    if (routing.routes[h] === device[h]) continue;
    terms ??= deviceRouteTerms(rule);
    if (!(terms && routeMarginal(terms, stats, h, margin))) {
      throw new CrispError('BACKEND_ERROR', `${who}: the device routed [${device.join(',')}], router ${router} routes [${routing.routes.join(',')}] on the same statistics (a router's \`device\` rule must be the rule its route() computes: with one of your own, check that first; with the library's routers this is the backend's fault)`);
    }
    differ = true;
  }
  return differ ? { ...routing, routes: [...device] } : routing;
}

export async function queueDevicePlan(
  backend: Backend,
  inputs: { readonly q: DeviceTensor; readonly k: DeviceTensor },
  policy: Policy,
  c: DevicePlanContext,
  markStats: boolean,
): Promise<QueuedDevicePlan> {
  const { t0, shape, B, Nb, stats } = c;
  const H = shape.heads;
  const statsMark = markStats ? backend.mark?.() : undefined;
  const tStats = performance.now();
  let r: DevicePlanResult;
  try {
    r = await backend.planner!.plan({
      stats,
      route: c.rules.route,
      vs: c.rules.vs,
      peK: c.peK,
      pe: { q: inputs.q, k: inputs.k, gamma: policy.pe!.gamma, scale: c.scale },
      ...(policy.peWithVs === true ? { peWithVs: true } : {}),
      ...(c.rules.peVs !== undefined ? { peVs: c.rules.peVs } : {}),
      ...(policy.peVsExcess !== undefined ? { peVsExcess: policy.peVsExcess } : {}),
      ...(policy.peVsFullAnchor !== undefined ? { peVsFullAnchor: policy.peVsFullAnchor } : {}),
    });
  } catch (e) {
    // statistics kept on the device (deferRead) go back now, not when they are collected
    await stats.settle?.().catch(() => undefined);
    throw e;
  }
  const tDevice = performance.now();
  const finish = async (overlapped: boolean): Promise<PrefillPlan> => {
    const tRead = performance.now();
    let routing: RoutingDecision;
    let peHeads: number[];
    let outcome: DevicePlanOutcome;
    let tRoute: number;
    let density: Float64Array;
    let overallDensity: number;
    try {
      // the device's routes and lists (waiting for the plan), then the statistics (settled
      // when the backend's reads are asynchronous; non-finite ones throw here)
      outcome = await r.read();
      await stats.settle?.();
      const tReadDone = performance.now();
      assertFiniteStats(stats);
      routing = agreedRoutes(routeOnHost(policy, stats, H).routing, outcome.routes, c.rules.route, stats, c.rules.margin, `backend ${backend.name}`, policy.router!.name);
      peHeads = routing.routes.flatMap((x, h) => (x === 'pe' ? [h] : []));
      tRoute = performance.now();
      ({ perHead: density, overall: overallDensity } = densityFromCounts(await r.prepared.readBlockCounts(), Nb));
      const rows = outcome.peRows ? spreadRows(await outcome.peRows(), peHeads, H, Nb) : undefined;
      const mask = { heads: H, numBlocks: Nb, blockSize: B, vs: outcome.vs, rows };
      const { proxyRecall } = checkRecall(mask, policy, c.stats);
      const tEnd = performance.now();
      const phases = overlapped
        ? { statsMs: tStats - t0, selectMs: 0, peRowsMs: tDevice - tStats, maskMs: 0, overlappedMs: tEnd - tRead }
        : { statsMs: tStats - t0, selectMs: tRoute - tReadDone, peRowsMs: tReadDone - tStats, maskMs: tEnd - tRoute };
      return {
        policy: policy.name,
        shape,
        blockSize: B,
        numBlocks: Nb,
        stats,
        routing,
        mask,
        prepared: r.prepared,
        density,
        overallDensity,
        proxyRecall,
        planMs: overlapped ? tDevice - t0 : tEnd - t0,
        phases,
      };
    } catch (e) {
      r.prepared.release();
      throw e;
    }
  };
  return { prepared: r.prepared, ...(statsMark ? { statsMark } : {}), finish };
}
