/**
 * @crisp/tfjs: CRISP sparse prefill for TensorFlow.js users. `crispAttention(q, k, v)` takes
 * and returns tf.Tensors; on tfjs-backend-webgpu it runs on TF.js's own GPUDevice with no
 * host round trip, elsewhere through the host on CUDA (Node) or the float64 reference.
 * `crispAttentionVarlen(q, k, v, { cuSeqlensQ })` does the same for a ragged batch packed
 * along the rows.
 *
 * @module @crisp/tfjs
 */
export { crispAttention, type CrispAttentionOptions, type CrispAttentionResult } from './attention.js';
export { crispAttentionVarlen, type CrispAttentionVarlenResult } from './varlen.js';
export { BACKEND_CHOICES, type BackendChoice, disposeCrispBackends } from './backends.js';
export { tfDenseAttention } from './dense.js';
export { isTfTensor, tfBackendOf } from './tensors.js';
