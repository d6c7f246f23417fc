/**
 * Block selectors: `noiseFloor` (CRISP), `cumulativeCoverage` (FlexPrefill), `globalCoverage`
 * (pooled estimation), `topK` and the robust floors.
 *
 * @module @crisp/select
 */
export { type NoiseFloorOptions, type NoiseFloorSelector, meanBackground, noiseFloor } from './noise-floor.js';
export {
  type CumulativeCoverageOptions,
  type CumulativeCoverageSelector,
  coverageTokenCount,
  cumulativeCoverage,
} from './cumulative-coverage.js';
export { type GlobalCoverageOptions, globalCoverage } from './global-coverage.js';
export { type TopKOptions, type TopKSelector, topK } from './top-k.js';
export { type QuantileFloorOptions, type QuantileFloorSelector, medianFloor, quantileFloor } from './quantile-floor.js';
export { type RobustFloorOptions, type RobustFloorSelector, robustFloor, robustThreshold } from './robust-floor.js';
