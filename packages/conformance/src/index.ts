/**
 * One conformance suite any backend runs against the float64 reference (plain Node runner).
 *
 * @module @crisp/conformance
 */
export {
  type BackendFactory,
  type CaseResult,
  type ConformanceOptions,
  type ConformanceReport,
  ConformanceSession,
  capabilityGap,
  formatReport,
  listConformanceCases,
  runConformance,
  skipReason,
} from './runner.js';
export {
  type CaseContext,
  type CaseOutcome,
  type ConformanceCase,
  COLLECTION_SENTINEL,
  collectionReported,
  garbageCollector,
  LARGE_SIZES,
  randomMask,
  type ShapeCase,
  SMALL_SIZES,
  shapeName,
} from './cases.js';
export { LARGE_VARLEN, SMALL_VARLEN, type VarlenShapeCase } from './varlen-cases.js';
export { DEFAULT_TOLERANCES, type Tolerance } from './compare.js';
export { attentionInputs, caseSeed, rng } from './random.js';
export { crispGuardedSmall, crispSmall, defaultPolicies, flexPrefillSmall } from './policies.js';
