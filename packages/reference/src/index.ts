/**
 * The pure-TypeScript float64 backend every other backend is checked against, and its metrics.
 *
 * @module @crisp/reference
 */
export { createReferenceBackend, ReferenceTensor, REFERENCE_BACKEND_NAME, type ReferenceBackendOptions, type ReferenceProgress } from './backend.js';
export {
  attentionRows,
  type AttentionRowsResult,
  kvHeadOf,
  massRecall,
  type PooledBlockMap,
  pooledBlockMap,
  type MassRecallOptions,
  type PerHead,
  relativeError,
  sampleRows,
} from './metrics.js';
