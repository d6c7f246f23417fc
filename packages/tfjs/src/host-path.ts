/**
 * The host path: values read to the host (`data()`), uploaded to a CRISP backend (CUDA, the
 * reference, or one passed in), the output downloaded and made a float32 tensor on TF.js's
 * current backend. Costs two host crossings of every input and output element; the README
 * states what that is per size.
 */
import {
  type Backend,
  type DType,
  type DeviceTensor,
  type HostTensor,
  type PlanOptions,
  type Policy,
  type PrefillPlan,
  castHost,
  toFloat32,
  wrapHost,
} from '@crisp/core';
import { type PathResult, prefillOne } from './webgpu-path.js';
import type { Tf, TfInputs, TfTensor } from './tensors.js';

/** Sequence `b` of a (possibly batched) tensor's host values, as a host tensor in `dtype`. */
export function hostEntry(values: Float32Array, shape: readonly number[], b: number, layout: TfInputs, dtype: DType): HostTensor {
  const s = layout.batched ? shape.slice(1) : [...shape];
  const len = s[0] * s[1] * s[2];
  const f32 = wrapHost('f32', s, values.subarray(b * len, (b + 1) * len));
  return dtype === 'f32' ? f32 : castHost(f32, dtype);
}

export async function runOnHost(
  tf: Tf,
  backend: Backend,
  layout: TfInputs,
  q: TfTensor,
  k: TfTensor,
  v: TfTensor,
  policy: Policy,
  opts: PlanOptions,
  dtype: DType,
): Promise<PathResult> {
  const [qv, kv, vv] = (await Promise.all([q.data(), k.data(), v.data()])) as Float32Array[];
  const plans: PrefillPlan[] = [];
  const outShape = layout.batched ? [layout.batch, layout.n, layout.heads, layout.headDim] : [layout.n, layout.heads, layout.headDim];
  const out = new Float32Array(layout.batch * layout.n * layout.heads * layout.headDim);
  let prefillMs = 0;
  for (let b = 0; b < layout.batch; b++) {
    const dev: DeviceTensor[] = [];
    try {
      for (const [vals, t] of [[qv, q], [kv, k], [vv, v]] as const) dev.push(backend.upload(hostEntry(vals, t.shape, b, layout, dtype)));
      const r = await prefillOne(
        backend,
        { q: dev[0], k: dev[1], v: dev[2] },
        policy,
        opts,
        async (o) => toFloat32(await backend.download(o)),
        layout.batched ? b : undefined,
      );
      out.set(r.kept, b * layout.n * layout.heads * layout.headDim);
      plans.push(r.plan);
      prefillMs += r.ms;
    } finally {
      for (const t of dev) t.dispose();
    }
  }
  return { output: tf.tensor(out, outShape, 'float32'), plans, prefillMs };
}
