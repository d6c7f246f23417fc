export { main, resolveConfig } from './main.js';
export { defaultConfig, parseSizes, type BenchConfig } from './config.js';
export type { BenchResult } from './result.js';
export { crossoverSuite } from './suites/crossover.js';
export { syntheticCurve, constructedHead } from './suites/on-curve.js';
export { spread, timeIt, causalAttentionFlops } from './stats.js';
