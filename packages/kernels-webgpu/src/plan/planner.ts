/**
 * The WebGPU backend's DevicePlanner (core): the plan after the statistics as device work,
 * nothing read back before the attention is queued (where the PE cut fits the device).
 *
 * - Routing and VS selection: the cStruct router and the noise floor on the GPU
 *   (kernels/select.ts), exactly the host rules' routes and lists; they read the block sums
 *   where proxyStats (deferRead) left them, so the statistics are not read back first.
 * - crispGuarded's rules too: the residual test of residualJsd beside cStruct (anyPe;
 *   kernels/route-residual.ts), PE heads keeping the noise floor's lists (peWithVs, at their
 *   own α with peVs) and those lists narrowed to p_v > κ ā outside a band of C_struct
 *   (peVsExcess, peVsFullAnchor). The residual mass test is exact; the distance and the
 *   narrowing's ratio are f32, so a head whose distance lies within `margin` of τ, or a block
 *   whose p_v lies within that relative margin of κ ā, may fall the other way from the host
 *   rule's f64 decision (the plan keeps the device's: its mask was built from it).
 * - flexPrefill's rules too: the jsd router (the same distance over every block) and
 *   cumulative coverage of the token scores (kernels/coverage.ts: exact integer sums, so the
 *   host rule's lists), reading the token scores where proxyStats left them.
 * - The VS lists (of every head: a PE head's are its peK best blocks each way) are expanded
 *   into rows on the device: the mask `sparseAttention` runs as it is when every head is VS.
 * - The PE heads' rows: their γ cut runs on the device too (ops/pe-cut.ts: every head's
 *   pooled map, the cut of the heads routed PE, their rows), queued between the selection and
 *   the expansion, which then holds them too: the attention can be queued right behind the
 *   plan with nothing read back. The cut counts the map's mass in fixed point (coverage.ts),
 *   so its sums do not depend on the order the GPU adds in, and it keeps exactly what the
 *   host cut (peBlockRows) keeps: the plan equals the host plan. Where every head's map does
 *   not fit one binding (devicePeCutFits), the cut stays on the host and the prepared mask
 *   makes the PE part when first needed (the routes read back first).
 */
import {
  checkDeviceRouterRule,
  type DeviceNoiseFloorRule,
  type DevicePlanOutcome,
  type DevicePlanRequest,
  type DevicePlanResult,
  type DevicePlanner,
  type DeviceRouterRule,
  type DeviceSelectorRule,
  deviceRouteTerms,
  InvalidArgumentError,
  UnsupportedError,
  numBlocks,
} from '@crisp/core';
import { WEBGPU_PLAN_MARGIN } from '../kernels/route-residual.js';
import { queueSelection } from '../ops/device-select.js';
import { devicePeCutFits, queueDevicePeRows } from '../ops/pe-cut.js';
import type { OpHost } from '../ops/host.js';
import { checkScale, prepare } from '../ops/validate.js';
import { WebGpuPreparedMask } from './prepared-mask.js';

export class WebGpuDevicePlanner implements DevicePlanner {
  /** Router rules the plan runs on the device (kernels/select.ts, kernels/route-residual.ts). */
  readonly routers: readonly DeviceRouterRule['kind'][] = Object.freeze(['cStruct', 'residualJsd', 'jsd', 'anyPe'] as const);
  /** Selector rules the plan runs on the device (kernels/select.ts, kernels/coverage.ts). */
  readonly selectors: readonly DeviceSelectorRule['kind'][] = Object.freeze(['noiseFloor', 'cumulativeCoverage'] as const);
  /** PE heads keep the noise floor's lists (Policy.peWithVs), at their own α (peVs), narrowed (peVsExcess). */
  readonly peWithVs = true;
  readonly peVs = true;
  readonly peVsExcess = true;
  /** The residual distance and the narrowing's ratio are f32 here (kernels/route-residual.ts). */
  readonly margin = WEBGPU_PLAN_MARGIN;
  readonly #host: OpHost;

  constructor(host: OpHost) {
    this.#host = host;
  }

  /**
   * Routes, VS lists and their rows queued on the device from the statistics' block sums;
   * the PE heads' rows when first needed (see the file's header). Typed errors before any
   * work for a request it cannot run.
   */
  async plan(req: DevicePlanRequest): Promise<DevicePlanResult> {
    const host = this.#host;
    host.alive();
    const { stats, route, vs, peK, pe } = req ?? ({} as DevicePlanRequest);
    checkDeviceRouterRule(route, 'the device routing rule');
    const terms = deviceRouteTerms(route);
    if (!terms) {
      throw new UnsupportedError(`the WebGPU device plan routes by cStruct and at most one distance test (residualJsd or jsd); got ${JSON.stringify(route)}`, {
        limit: 'deviceRouter',
      });
    }
    if (!stats || typeof stats !== 'object' || !Number.isInteger(stats.heads) || !Number.isInteger(stats.numBlocks)) {
      throw new InvalidArgumentError('the device plan needs the statistics from proxyStats');
    }
    if (!pe || typeof pe !== 'object') throw new InvalidArgumentError('the device plan needs the PE inputs { q, k, gamma }');
    if (typeof pe.gamma !== 'number' || !(pe.gamma > 0 && pe.gamma <= 1)) {
      throw new InvalidArgumentError(`gamma must be a number in (0, 1]; got ${String(pe.gamma)}`);
    }
    const { shape, qt, kt } = prepare(host, pe.q, pe.k, undefined);
    const { heads: H, numBlocks: Nb, blockSize: B } = stats;
    if (shape.heads !== H || shape.keys !== stats.n || numBlocks(shape.keys, B) !== Nb) {
      throw new InvalidArgumentError(
        `the statistics are for n=${stats.n}, H=${H}, Nb=${Nb}; q and k for n=${shape.keys}, H=${shape.heads}, Nb=${numBlocks(shape.keys, B)}`,
      );
    }
    const scale = pe.scale === undefined ? undefined : checkScale(pe.scale, shape.headDim);
    const onDevice = host.peCut === 'device' && devicePeCutFits(host, H, Nb);
    const cut = (routes: GPUBuffer) => queueDevicePeRows(host, routes, { qt, kt }, shape, B, pe.gamma, checkScale(scale, shape.headDim));
    const sel = await queueSelection(
      host,
      stats,
      {
        tauProxy: terms.tauProxy,
        vs,
        peK,
        ...(terms.residual ? { residual: terms.residual } : {}),
        ...(terms.jsd ? { jsd: terms.jsd } : {}),
        ...(req.peWithVs !== undefined ? { peWithVs: req.peWithVs } : {}),
        ...(req.peVs !== undefined ? { peVs: req.peVs as DeviceNoiseFloorRule } : {}),
        ...(req.peVsExcess !== undefined ? { excess: req.peVsExcess } : {}),
        ...(req.peVsFullAnchor !== undefined ? { fullAnchor: req.peVsFullAnchor } : {}),
      },
      onDevice ? cut : undefined,
    );
    const prepared = new WebGpuPreparedMask(host, { heads: H, numBlocks: Nb, blockSize: B }, sel, { q: qt, k: kt, gamma: pe.gamma, scale });
    let outcome: Promise<DevicePlanOutcome> | undefined;
    const read = (): Promise<DevicePlanOutcome> => {
      outcome ??= (async () => {
        // The statistics, the plan and the block counts core reads next are read together,
        // in one trip where the cut ran on the device (GpuContext.read batches reads started
        // in one turn); non-finite statistics are reported first (NON_FINITE), as the host
        // plan reports them.
        // (every read is waited for, failed or not, so none is still in flight after an error)
        const [settled, reading] = await Promise.allSettled([stats.settle?.(), prepared.read(), prepared.readBlockCounts()]);
        if (settled.status === 'rejected') throw settled.reason;
        if (reading.status === 'rejected') throw reading.reason;
        const got = reading.value;
        const peRows = got.peRows;
        return { routes: got.routes, vs: got.vs, ...(peRows ? { peRows: async () => peRows } : {}) };
      })();
      return outcome;
    };
    return { prepared, read };
  }
}
