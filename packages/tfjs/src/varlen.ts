/**
 * crispAttentionVarlen: CRISP over a ragged batch of tf.Tensors, packed along the rows as
 * FlashAttention's `cu_seqlens` lay them out (core's varlenPrefill): q [total query rows, H,
 * d], k and v [total key rows, Hkv, d], sequence s at rows cuSeqlensQ[s] .. cuSeqlensQ[s+1]
 * of q and cuSeqlensK[s] .. cuSeqlensK[s+1] of k and v. Each sequence is planned on its own;
 * the whole batch's attention is one call. The paths are crispAttention's: on
 * tfjs-backend-webgpu, CRISP's WebGPU backend on TF.js's device with no host round trip;
 * elsewhere through the host on CUDA (Node) or the float64 reference.
 */
import {
  type Backend,
  type DType,
  type DeviceTensor,
  type PrefillPlan,
  type VarlenLayout,
  UnsupportedError,
  assertSupported,
  toFloat32,
  varlenPrefill,
  varlenSegments,
} from '@crisp/core';
import type { Policy } from '@crisp/core';
import type { WebGpuBackend } from '@crisp/kernels-webgpu';
import { crisp } from '@crisp/presets';
import * as tf from '@tensorflow/tfjs-core';
import { type CrispAttentionOptions, type CrispAttentionResult, checkCallOptions, choose, hostDtype } from './attention.js';
import { hostEntry } from './host-path.js';
import { type Tf, type TfInputs, type TfTensor, checkInputs } from './tensors.js';
import { tfTensorOf, tfWebGpu, wrapOnTfDevice } from './webgpu-path.js';

const WHAT = 'crispAttentionVarlen';

/** As crispAttention's result (routes[s] and plans[s] per sequence), with the packed output and varlenPrefill's timings. */
export interface CrispAttentionVarlenResult extends Omit<CrispAttentionResult, 'output' | 'plans' | 'density' | 'timings'> {
  /** float32 [total query rows, H, d], the sequences packed as q is, on TF.js's current backend */
  readonly output: TfTensor;
  /** one plan per sequence, in order (a sequence with no query rows has a dense, empty one) */
  readonly plans: readonly PrefillPlan[];
  /** selected causal blocks over every sequence's causal blocks (dense sequences count fully) */
  readonly density: number;
  /** milliseconds: varlenPrefill's plans (all sequences), its attention, and the whole call */
  readonly timings: { readonly planMs: number; readonly attentionMs: number; readonly totalMs: number };
}

/**
 * CRISP sparse prefill of one layer over a ragged batch of tf.Tensors (see the file's
 * header): every sequence causal, the last m_s of its n_s positions its queries (m_s < n_s:
 * chunked prefill over its cached keys; cuSeqlensK defaults to cuSeqlensQ). Options as
 * crispAttention's. Resolves with the packed output as a new tf.Tensor and a plan per
 * sequence. Bad input or a bad layout: the core's typed errors before anything is read or
 * copied.
 */
export async function crispAttentionVarlen(
  q: TfTensor,
  k: TfTensor,
  v: TfTensor,
  layout: VarlenLayout,
  options?: CrispAttentionOptions,
): Promise<CrispAttentionVarlenResult> {
  const t0 = performance.now();
  const opts = checkCallOptions(options, WHAT);
  const inputs = checkInputs(tf, q, k, v, { what: WHAT, packed: true });
  const segments = varlenSegments(layout, inputs.n, inputs.keys);
  const route = await choose(tf, inputs, opts.backend ?? 'auto', WHAT);
  const backend = route.backend;
  if (typeof backend.varlenAttention !== 'function' || typeof backend.sliceRows !== 'function') {
    throw new UnsupportedError(`${WHAT}: backend ${backend.name} runs no ragged batches (varlenAttention, sliceRows); call crispAttention per sequence`, {
      limit: 'varlen',
    });
  }
  const dtype = route.kind === 'webgpu' ? 'f32' : hostDtype(backend, opts.deviceDtype);
  // the backend's limits, for the longest sequence, before anything is read back or copied
  const longest = segments.reduce((a, g) => (g.keys > a.keys ? g : a), segments[0]);
  const { heads, kvHeads, headDim } = inputs;
  assertSupported(backend.capabilities, { queries: Math.max(1, longest.queries), keys: longest.keys, heads, kvHeads, headDim, dtype }, backend.name);
  const policy = opts.policy ?? crisp;
  const prefillOpts = { ...(opts.scale === undefined ? {} : { scale: opts.scale }), ...(opts.minSparseLength === undefined ? {} : { minSparseLength: opts.minSparseLength }) };
  const call: Call = { tf, q, k, v, layout, policy, opts: prefillOpts };
  const run = route.kind === 'webgpu' ? await onTfDevice(call, route.backend) : await onHost(call, backend, inputs, dtype);
  return {
    output: run.output,
    plans: run.plans,
    routes: run.plans.map((p) => p.routing?.routes ?? []),
    density: run.density,
    path: route.kind,
    backend: backend.name,
    timings: { planMs: run.planMs, attentionMs: run.attentionMs, totalMs: performance.now() - t0 },
  };
}

interface Run {
  readonly output: TfTensor;
  readonly plans: readonly PrefillPlan[];
  readonly density: number;
  readonly planMs: number;
  readonly attentionMs: number;
}

/** One call's tensors, layout, policy and prefill options, as both paths take them. */
interface Call {
  readonly tf: Tf;
  readonly q: TfTensor;
  readonly k: TfTensor;
  readonly v: TfTensor;
  readonly layout: VarlenLayout;
  readonly policy: Policy;
  readonly opts: { readonly scale?: number; readonly minSparseLength?: number };
}

/** On TF.js's device: the packed inputs wrapped where TF.js keeps them, the output handed back on the device. */
async function onTfDevice({ tf, q, k, v, layout, policy, opts }: Call, crisp: WebGpuBackend): Promise<Run> {
  const tfb = tfWebGpu(tf)!;
  const held: { dispose(): void }[] = [];
  const wrapped: DeviceTensor[] = [];
  try {
    for (const t of [q, k, v]) wrapped.push(wrapOnTfDevice(tfb, crisp, t, held));
    const r = await varlenPrefill(crisp, { q: wrapped[0], k: wrapped[1], v: wrapped[2] }, layout, policy, opts);
    try {
      const output = tfTensorOf(tf, crisp, r.output);
      return { output, plans: r.plans, density: r.overallDensity, planMs: r.timings.planMs, attentionMs: r.timings.attentionMs };
    } finally {
      r.output.dispose();
    }
  } finally {
    for (const w of wrapped) w.dispose();
    for (const h of held) h.dispose();
  }
}

/** Through the host: the values read back, run on `backend` in `dtype`, the output made a tensor on TF.js's current backend. */
async function onHost({ tf, q, k, v, layout, policy, opts }: Call, backend: Backend, inputs: TfInputs, dtype: DType): Promise<Run> {
  const values = (await Promise.all([q.data(), k.data(), v.data()])) as Float32Array[];
  const dev: DeviceTensor[] = [];
  try {
    for (const [i, t] of [q, k, v].entries()) dev.push(backend.upload(hostEntry(values[i], t.shape, 0, inputs, dtype)));
    const r = await varlenPrefill(backend, { q: dev[0], k: dev[1], v: dev[2] }, layout, policy, opts);
    try {
      const out = toFloat32(await backend.download(r.output));
      const output = tf.tensor(out, [inputs.n, inputs.heads, inputs.headDim], 'float32');
      return { output, plans: r.plans, density: r.overallDensity, planMs: r.timings.planMs, attentionMs: r.timings.attentionMs };
    } finally {
      r.output.dispose();
    }
  } finally {
    for (const t of dev) t.dispose();
  }
}
