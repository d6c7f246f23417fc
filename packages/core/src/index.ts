/**
 * Tensors (f32/f16/bf16), typed errors, block masks, the `Backend`, `DevicePlanner`, `Router` and
 * `VsSelector` interfaces, the plan and `planPrefill` / `runPlan` / `sparsePrefill`.
 *
 * @module @crisp/core
 */
export * from './errors.js';
export * from './dtype.js';
export * from './tensor.js';
export * from './attention.js';
export {
  assertIndexList,
  type BlockMask,
  type BlockRows,
  blocksPerHead,
  causalBlockCount,
  denseRows,
  densityFromCounts,
  expandToRows,
  maskDensity,
  selectedBlockCounts,
  spreadRowPtr,
  validateMask,
  type ValidateMaskOptions,
  type VsLists,
  vsHead,
  vsListsFromArrays,
} from './mask.js';
export * from './stats.js';
export * from './backend.js';
export * from './policy.js';
export * from './ranking.js';
export { jsDistance, residualDistance } from './divergence.js';
export { checkDeviceRouterRule, checkDeviceSelectorRule, checkPeVsNarrowing, type DeviceRouteTerms, deviceRouteTerms, MAX_PLANNER_MARGIN, plannerMargin, RESIDUAL_MARGIN, routeMarginal } from './plan/device-route.js';
export * from './plan/types.js';
export { checkedRouting, type PeListOptions, peListOptions, selectVsLists } from './plan/host-plan.js';
export { alternativeRecall } from './plan/alternative-recall.js';
export { planFromStatistics, type StatisticsSource } from './plan/from-statistics.js';
export { validatePolicy, validatePolicyBlocks } from './plan/derive.js';
export * from './prefill.js';
export { type AttentionPart, type MergedAttention, mergeAttentionByLse } from './merge.js';
export * from './varlen.js';
export { assertBackend, assertCallOptions, assertDeviceTensor, assertOutApart, type OutApartNames } from './validate.js';
export * from './random.js';
