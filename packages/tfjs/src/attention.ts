/**
 * crispAttention: CRISP sparse prefill over tf.Tensors. Two paths, chosen by where the
 * tensors live:
 *
 * - **webgpu** (tensors on tfjs-backend-webgpu): CRISP's WebGPU backend on TF.js's own
 *   GPUDevice reads the inputs from TF.js's GPU buffers (`dataToGPU()`) and the output goes
 *   back as a tensor made from CRISP's GPU buffer. Nothing crosses to the host but the plan's
 *   few statistics; TF.js's public GPU-data API makes one device-side copy of each input and
 *   of the output (see the README for what that costs).
 * - **host** (any other TF.js backend, or a CRISP backend passed in that is not on TF.js's
 *   device): the values are read to the host (`data()`), run on CUDA in Node when there is a
 *   driver (inputs cast to bf16 or f16: CUDA has no f32 kernels), else on the float64
 *   reference, and the output comes back as a new float32 tensor.
 */
import { assertSupported, type Backend, type DType, type PrefillPlan, type Route, checkOptions, InvalidArgumentError, describeValue } from '@crisp/core';
import type { Policy } from '@crisp/core';
import type { WebGpuBackend } from '@crisp/kernels-webgpu';
import { crisp } from '@crisp/presets';
import * as tf from '@tensorflow/tfjs-core';
import { BACKEND_CHOICES, type BackendChoice, hostPathBackend, webgpuBackendOn } from './backends.js';
import { runOnHost } from './host-path.js';
import { type Tf, type TfInputs, type TfTensor, checkInputs } from './tensors.js';
import { runOnTfDevice, tfWebGpuDevice } from './webgpu-path.js';

export interface CrispAttentionOptions {
  /** the policy (a preset from @crisp/presets, or your own routers and selectors); default `crisp` */
  readonly policy?: Policy;
  /**
   * Which CRISP backend runs it: 'auto' (default: TF.js's WebGPU device when the tensors are
   * there, else CUDA in Node, else the reference), 'webgpu' (TF.js's WebGPU device, or
   * BACKEND_UNAVAILABLE), 'cuda', 'reference', or a CRISP Backend you made (a WebGPU
   * backend on TF.js's device runs without copies; any other goes through the host).
   */
  readonly backend?: BackendChoice | Backend;
  /** softmax scale, default 1/sqrt(d) */
  readonly scale?: number;
  /** length gate: below this many keys run dense (default: the backend's measured crossover; 0: always sparse) */
  readonly minSparseLength?: number;
  /** storage of the host path's inputs on a backend without f32 (CUDA): 'bf16' (default) or 'f16' */
  readonly deviceDtype?: 'bf16' | 'f16';
}

export interface CrispAttentionResult {
  /** float32, q's shape ([n, H, d] or [batch, n, H, d]), on TF.js's current backend */
  readonly output: TfTensor;
  /** one plan per sequence (batch entries in order) */
  readonly plans: readonly PrefillPlan[];
  /** routes[b][h]: 'vs' or 'pe' for each sequence and head; empty for dense plans */
  readonly routes: readonly (readonly Route[])[];
  /** the mean over sequences of each plan's overall density (selected / causal blocks) */
  readonly density: number;
  /** 'webgpu': on TF.js's GPU device, no host round trip; 'host': through host memory */
  readonly path: 'webgpu' | 'host';
  /** the CRISP backend that ran it ('webgpu', 'cuda', 'reference', or yours) */
  readonly backend: string;
  /** milliseconds: the prefills' own total (plan and attention) and the whole call */
  readonly timings: { readonly prefillMs: number; readonly totalMs: number };
}

const OPTION_KEYS = ['policy', 'backend', 'scale', 'minSparseLength', 'deviceDtype'] as const;

function isBackend(x: unknown): x is Backend {
  const b = x as Partial<Backend> | null;
  return b !== null && typeof b === 'object' && typeof b.sparseAttention === 'function' && typeof b.upload === 'function';
}

/** The options of crispAttention (and crispAttentionVarlen, whose name `what` gives errors). */
export function checkCallOptions(opts: unknown, what = 'crispAttention'): CrispAttentionOptions {
  const o = checkOptions(opts as CrispAttentionOptions | undefined, what, OPTION_KEYS) as CrispAttentionOptions;
  if (o.backend !== undefined && !isBackend(o.backend) && !BACKEND_CHOICES.includes(o.backend as BackendChoice)) {
    throw new InvalidArgumentError(`${what}: backend must be one of ${BACKEND_CHOICES.join(', ')} or a CRISP Backend; got ${describeValue(o.backend)}`);
  }
  if (o.deviceDtype !== undefined && o.deviceDtype !== 'bf16' && o.deviceDtype !== 'f16') {
    throw new InvalidArgumentError(`${what}: deviceDtype must be 'bf16' or 'f16'; got ${describeValue(o.deviceDtype)}`);
  }
  if (o.policy !== undefined && (o.policy === null || typeof o.policy !== 'object' || typeof o.policy.name !== 'string')) {
    throw new InvalidArgumentError(`${what}: policy must be a Policy (a preset from @crisp/presets); got ${describeValue(o.policy)}`);
  }
  return o;
}

/** Where a call runs: TF.js's device through CRISP's WebGPU backend, or a backend through the host. */
export type PathChoice = { readonly kind: 'webgpu'; readonly backend: WebGpuBackend } | { readonly kind: 'host'; readonly backend: Backend };

export async function choose(tf: Tf, layout: TfInputs, choice: BackendChoice | Backend, what = 'crispAttention'): Promise<PathChoice> {
  const device = layout.tfBackend === 'webgpu' ? tfWebGpuDevice(tf) : undefined;
  if (isBackend(choice)) {
    const gpu = (choice as Partial<WebGpuBackend>).gpu;
    if (device && gpu?.device === device) return { kind: 'webgpu', backend: choice as WebGpuBackend };
    return { kind: 'host', backend: choice };
  }
  if (choice === 'webgpu' || (choice === 'auto' && device)) {
    if (!device) {
      throw new InvalidArgumentError(
        `${what}: backend 'webgpu' runs on TF.js's WebGPU device, but the tensors live on TF.js backend '${layout.tfBackend}'; use tf.setBackend('webgpu') (from @tensorflow/tfjs-backend-webgpu) before making them`,
      );
    }
    return { kind: 'webgpu', backend: await webgpuBackendOn(device) };
  }
  return { kind: 'host', backend: await hostPathBackend(choice === 'auto' ? 'auto' : choice) };
}

/**
 * CRISP sparse prefill of one layer over tf.Tensors: q [n, H, d], k and v [n, Hkv, d]
 * (or with a leading batch axis of equal-length sequences, each planned on its own), all
 * float32, causal. Resolves with the output as a new tf.Tensor (dispose it as any other) and
 * the plans. Bad input: the core's typed errors (CrispError) before any work.
 */
export async function crispAttention(q: TfTensor, k: TfTensor, v: TfTensor, options?: CrispAttentionOptions): Promise<CrispAttentionResult> {
  const t0 = performance.now();
  const opts = checkCallOptions(options);
  const layout = checkInputs(tf, q, k, v);
  const route = await choose(tf, layout, opts.backend ?? 'auto');
  const dtype = route.kind === 'webgpu' ? 'f32' : hostDtype(route.backend, opts.deviceDtype);
  // the backend's limits (head dim, length) before anything is read back or copied
  const { n, heads, kvHeads, headDim } = layout;
  assertSupported(route.backend.capabilities, { queries: n, keys: n, heads, kvHeads, headDim, dtype }, route.backend.name);
  const policy = opts.policy ?? crisp;
  const prefillOpts = { ...(opts.scale === undefined ? {} : { scale: opts.scale }), ...(opts.minSparseLength === undefined ? {} : { minSparseLength: opts.minSparseLength }) };
  const run =
    route.kind === 'webgpu'
      ? await runOnTfDevice(tf, route.backend, layout, q, k, v, policy, prefillOpts)
      : await runOnHost(tf, route.backend, layout, q, k, v, policy, prefillOpts, dtype);
  const plans = run.plans;
  return {
    output: run.output,
    plans,
    routes: plans.map((p) => p.routing?.routes ?? []),
    density: plans.reduce((s, p) => s + p.overallDensity, 0) / plans.length,
    path: route.kind,
    backend: route.backend.name,
    timings: { prefillMs: run.prefillMs, totalMs: performance.now() - t0 },
  };
}

/** f32 where the backend has it, else the asked-for (default bf16) 16-bit storage. */
export function hostDtype(b: Backend, asked: 'bf16' | 'f16' | undefined): DType {
  const has = b.capabilities.dtypes;
  if (has.includes('f32')) return 'f32';
  const want = asked ?? 'bf16';
  return has.includes(want) ? want : (has[0] as DType);
}
