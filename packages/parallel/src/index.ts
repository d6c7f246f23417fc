/**
 * Context-parallel CRISP prefill: one sequence sharded over ranks (zig-zag), the proxy
 * statistics gathered so every rank makes the same plan, and only the key/value blocks a
 * rank's queries selected sent to it. Ranks talk through a `Communicator`
 * (`createLocalGroup` for ranks in one thread; `runRanks` from `@crisp/parallel/node` for
 * worker threads).
 *
 * @module @crisp/parallel
 */
export { allReduceSum, assertCommunicator, bytesOf, type Communicator, f64Of, i32Of, type Traffic } from './communicator.js';
export { denseRingBytes, neededBlocks, ownedBlocks } from './exchange.js';
export { communicatorOver, type FixedCollectives, type FixedCommunicator } from './fixed-collectives.js';
export { type RowRange, type ShardLayout, shardFromRows, shardPositions, shardRows, shardTensor, unshardTensor, zigzagLayout } from './layout.js';
export { createLocalGroup } from './local-group.js';
export {
  type ParallelPrefillOptions,
  type ParallelPrefillResult,
  type ParallelTraffic,
  parallelPrefill,
  prefixMask,
  type ShardInputs,
  shardHeaderBytes,
} from './prefill.js';
