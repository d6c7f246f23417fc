/**
 * The requests and results of the package's own mask preparation (prepareMask), kept here so
 * that core's Backend interface carries only the device planner (DevicePlanner).
 */
import type { BlockRows, DeviceSelectorRule, DeviceTensor, PeRowsOptions, PreparedMask, ProxyStats, Route, VsLists } from '@crisp/core';

/**
 * VS selection to run on the device: VS heads by `rule` over the block scores of `stats`, PE
 * heads the `peK` best blocks of each direction (∪ {0}), as the pipeline
 * does on the host.
 */
export interface DeviceVsRequest {
  readonly rule: DeviceSelectorRule;
  /** the statistics the plan routed on (the backend reuses its own copy on the device when it has one) */
  readonly stats: ProxyStats;
  /** [H] */
  readonly routes: readonly Route[];
  /** blocks per direction for PE heads (kMin / B) */
  readonly peK: number;
  /** PE heads keep the rule's lists too (Policy.peWithVs) */
  readonly peWithVs?: boolean;
  /** with peWithVs, the rule of those lists when it is not `rule` (Policy.peVs): a noise floor beside a noise-floor `rule` with the same kMin */
  readonly peVs?: DeviceSelectorRule;
  /** with peWithVs, narrow them (Policy.peVsExcess; the noiseFloor rule only) */
  readonly peVsExcess?: number;
  /** heads whose C_struct lies in [from, below) keep the full lists (Policy.peVsFullAnchor) */
  readonly peVsFullAnchor?: { readonly from: number; readonly below: number };
}

export interface PrepareMaskRequest {
  readonly heads: number;
  readonly numBlocks: number;
  readonly blockSize: number;
  /** the VS selection to run on the device; its lists come back in the result's `vs` */
  readonly vs: DeviceVsRequest;
  /** PE rows to build (as peBlockRows would) and merge with the VS part */
  readonly pe?: { readonly q: DeviceTensor; readonly k: DeviceTensor; readonly opts: PeRowsOptions };
}

export interface PreparedMaskResult {
  readonly prepared: PreparedMask;
  /** the VS lists selected on the device */
  readonly vs: VsLists;
  /**
   * The PE rows for the requested heads, as peBlockRows returns them, copied to the host
   * when called (the copy can overlap attention). Present when the request had `pe`; call
   * it at most once and before `prepared.release()`.
   */
  readonly peRows?: () => Promise<BlockRows>;
}
