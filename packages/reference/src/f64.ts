/**
 * The float64 building blocks behind the reference backend, for packages that compose them
 * over data they hold themselves (a context-parallel prefill computes the proxy statistics
 * and the pooled map of a sharded sequence with these, so its plan matches the reference's).
 *
 * @module @crisp/reference/f64
 */
export { type BlockMeans, blockMeans, type HeadMajorRows } from './block-means.js';
export { type HeadMajor, kvHeadOf, pooledEstimateOf, proxyQueryMean, toHeadMajor } from './math.js';
export { PooledMap, type PooledDims, peRowsOfMap } from './pooled.js';
