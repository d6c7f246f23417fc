/**
 * The CUDA backend's DevicePlanner (core): the rules the device runs as the host forms do
 * (route.cu's cStruct, residualJsd and jsd tests and anyPe of them, select.cu's noise floor
 * and FlexPrefill's cumulative coverage, for PE heads too with peWithVs), and the plan as one
 * queue.
 */
import type { DevicePlanRequest, DevicePlanResult, DevicePlanner, DeviceRouterRule, DeviceSelectorRule } from '@crisp/core';
import type { CudaContext } from '../runtime/context.js';
import type { KeptStats } from '../runtime/kept-stats.js';
import { planOnDevice } from './device-plan.js';

export class CudaDevicePlanner implements DevicePlanner {
  /** Router rules the plan runs on the device (kernels/route/route.cu); jsd with flexPrefillOnDevice. */
  readonly routers: readonly DeviceRouterRule['kind'][];
  /** Selector rules the plan runs on the device (kernels/select/select.cu); cumulativeCoverage with flexPrefillOnDevice. */
  readonly selectors: readonly DeviceSelectorRule['kind'][];
  /** PE heads keep the selector's lists too (Policy.peWithVs; select.cu) */
  readonly peWithVs = true;
  /** and narrowed (Policy.peVsExcess beside the noise floor; select.cu) with peVsExcessOnDevice */
  readonly peVsExcess: boolean;
  /** and taken by a noise floor at their own α (Policy.peVs; select.cu) */
  readonly peVs = true;
  readonly #cx: CudaContext;
  readonly #kept: KeptStats;

  /**
   * flexPrefill: FlexPrefill's rules too (CudaBackendOptions.flexPrefillOnDevice); peVsExcess:
   * the narrowed PE lists too (CudaBackendOptions.peVsExcessOnDevice)
   */
  constructor(cx: CudaContext, kept: KeptStats, flexPrefill = false, peVsExcess = false) {
    this.#cx = cx;
    this.#kept = kept;
    this.peVsExcess = peVsExcess;
    this.routers = Object.freeze(flexPrefill ? ['cStruct', 'residualJsd', 'jsd', 'anyPe'] : ['cStruct', 'residualJsd', 'anyPe']);
    this.selectors = Object.freeze(flexPrefill ? ['noiseFloor', 'cumulativeCoverage'] : ['noiseFloor']);
  }

  /**
   * The plan after the statistics as device work: routes from the statistics' C_struct,
   * VS selection on those routes, the PE heads' rows, the union expanded and counted, an
   * event behind the last kernel; nothing read back until `read()` or `prepared.readBlockCounts()`.
   */
  plan(req: DevicePlanRequest): Promise<DevicePlanResult> {
    return planOnDevice(this.#cx, this.#kept, req);
  }
}
