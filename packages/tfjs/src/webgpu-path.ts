/**
 * The webgpu path: CRISP's WebGPU backend on TF.js's own GPUDevice. Inputs are read from
 * TF.js's GPU buffers (`dataToGPU()`, a device-side copy TF.js owns) and wrapped as CRISP
 * tensors without a copy; the output is handed back with `tf.tensor({ buffer })`, which TF.js
 * copies into its own pool on the device. Both libraries submit to the device's one queue, so
 * TF.js work queued after the call sees CRISP's output, and CRISP's work sees TF.js's inputs.
 */
import { type Backend, type DeviceTensor, type PlanOptions, type Policy, type PrefillInputs, type PrefillPlan, errorWithin, sparsePrefill } from '@crisp/core';
import type { WebGpuBackend } from '@crisp/kernels-webgpu';
import type { Tf, TfInputs, TfTensor } from './tensors.js';

/** What either path hands back to crispAttention. */
export interface PathResult {
  readonly output: TfTensor;
  readonly plans: PrefillPlan[];
  /** the sum of the prefills' own totals (sparsePrefill's timings.totalMs) */
  readonly prefillMs: number;
}

/**
 * One sequence's sparsePrefill on either path: `take` turns the output into what the caller
 * keeps (a TF.js tensor, host values) before the CRISP output is disposed; `entry`, the
 * sequence's index in a batched call.
 */
export async function prefillOne<T>(
  backend: Backend,
  inputs: PrefillInputs,
  policy: Policy,
  opts: PlanOptions,
  take: (output: DeviceTensor) => T | Promise<T>,
  entry?: number,
): Promise<{ kept: T; plan: PrefillPlan; ms: number }> {
  const r = await sparsePrefill(backend, inputs, policy, opts).catch((e: unknown) => {
    // a batch's error names its entry (indices in the message are the entry's own)
    throw entry === undefined ? e : errorWithin(e, `crispAttention: batch entry ${entry}`, { batch: entry });
  });
  try {
    return { kept: await take(r.output), plan: r.plan, ms: r.timings.totalMs };
  } finally {
    r.output.dispose();
  }
}

/** The part of tfjs-backend-webgpu's WebGPUBackend used here (its public members). */
export interface TfWebGpuBackend {
  readonly device: GPUDevice;
  uploadToGPU(dataId: object): void;
}

export function tfWebGpu(tf: Tf): TfWebGpuBackend | undefined {
  const b = tf.findBackend('webgpu') as unknown as Partial<TfWebGpuBackend> | undefined;
  return b && typeof b.uploadToGPU === 'function' && b.device ? (b as TfWebGpuBackend) : undefined;
}

/**
 * TF.js's WebGPU device, when TF.js runs on tfjs-backend-webgpu now (tf.tensor from a GPU
 * buffer needs the current backend to be 'webgpu').
 */
export function tfWebGpuDevice(tf: Tf): GPUDevice | undefined {
  return tf.getBackend() === 'webgpu' ? tfWebGpu(tf)?.device : undefined;
}

/** One batch entry as its own [n, heads, d] tensor (a view for unbatched input, a device-side slice otherwise). */
export function entry(tf: Tf, t: TfTensor, b: number, layout: TfInputs): TfTensor {
  if (!layout.batched) return t;
  const [, n, h, d] = t.shape;
  return tf.tidy(() => tf.reshape(tf.slice(t, [b, 0, 0, 0], [1, n, h, d]), [n, h, d]));
}

/**
 * `t` as a CRISP tensor over TF.js's GPU buffer (no copy): the handle TF.js returns with it
 * goes into `held`, to be disposed once CRISP is done with the buffer.
 */
export function wrapOnTfDevice(tfb: TfWebGpuBackend, crisp: WebGpuBackend, t: TfTensor, held: { dispose(): void }[]): DeviceTensor {
  // a tensor made from host values keeps them on the CPU until first use
  tfb.uploadToGPU(t.dataId);
  const g = t.dataToGPU();
  held.push(g.tensorRef);
  return crisp.wrapBuffer(g.buffer as GPUBuffer, 'f32', t.shape);
}

/** CRISP's output as a new TF.js tensor on the device (TF.js copies the buffer into its own pool, queued now). */
export function tfTensorOf(tf: Tf, crisp: WebGpuBackend, o: DeviceTensor): TfTensor {
  return tf.tensor({ buffer: crisp.bufferOf(o) }, [...o.shape], 'float32');
}

export async function runOnTfDevice(
  tf: Tf,
  crisp: WebGpuBackend,
  layout: TfInputs,
  q: TfTensor,
  k: TfTensor,
  v: TfTensor,
  policy: Policy,
  opts: PlanOptions,
): Promise<PathResult> {
  const tfb = tfWebGpu(tf)!;
  const plans: PrefillPlan[] = [];
  const outs: TfTensor[] = [];
  let prefillMs = 0;
  try {
    for (let b = 0; b < layout.batch; b++) {
      const seq = [q, k, v].map((t) => entry(tf, t, b, layout));
      const held: { dispose(): void }[] = layout.batched ? [...seq] : [];
      const wrapped: DeviceTensor[] = [];
      try {
        for (const t of seq) wrapped.push(wrapOnTfDevice(tfb, crisp, t, held));
        const r = await prefillOne(
          crisp,
          { q: wrapped[0], k: wrapped[1], v: wrapped[2] },
          policy,
          opts,
          (o) => tfTensorOf(tf, crisp, o),
          layout.batched ? b : undefined,
        );
        outs.push(r.kept);
        plans.push(r.plan);
        prefillMs += r.ms;
      } finally {
        for (const w of wrapped) w.dispose();
        for (const h of held) h.dispose();
      }
    }
  } catch (e) {
    for (const o of outs) o.dispose();
    throw e;
  }
  if (!layout.batched) return { output: outs[0], plans, prefillMs };
  const output = tf.stack(outs);
  for (const o of outs) o.dispose();
  return { output, plans, prefillMs };
}
