/** A variant as run (its backend on its own Dawn device and its state through the phases), and the choice of the best one. */
import { type SubgroupMatrixForm, type WebGpuBackend, subgroupMatrixAttentionProgram } from '@crisp/kernels-webgpu';
import { createNodeWebGpuBackend } from '@crisp/kernels-webgpu/node';
import { type VariantSpec, flagsFor } from './args.js';

export interface Variant extends VariantSpec {
  b: WebGpuBackend;
  /** the kernel the backend actually runs (a failed or ineligible tensor-core kernel runs fma) */
  active: string;
  buildOk: boolean;
  correct?: boolean;
  /** ms of one dense call at the last measured n, for projecting the next size */
  lastN?: number;
  lastMs?: number;
  stopped?: string;
}

/** A backend on its own Dawn device running this variant (toggles, rolled loops). */
export async function backendFor(spec: VariantSpec): Promise<WebGpuBackend> {
  const b = await createNodeWebGpuBackend({
    attentionKernel: spec.kernel,
    subgroupMatrixForm: spec.kernel === 'subgroup-matrix' && spec.form ? (spec.form as SubgroupMatrixForm) : undefined,
    flags: flagsFor(spec.toggles),
    compactKernels: spec.form === 'rolled' ? true : undefined,
  });
  const without = spec.without;
  if (without) {
    // a timing-only build: the tensor-core program with parts left out replaces the real one
    const gpu = b.gpu;
    const build = gpu.pipeline.bind(gpu);
    gpu.pipeline = (p) => {
      const m = /^attentionSubgroupMatrix:([a-z-]+):f16:d(\d+)$/.exec(p.cacheKey);
      return build(m ? subgroupMatrixAttentionProgram(Number(m[2]), m[1] as SubgroupMatrixForm, without) : p);
    };
  }
  return b;
}

/** The correct variant with the highest dense TFLOP/s at the largest n every timed variant reached. */
export function bestVariant(variants: Variant[], dense: Record<string, unknown>[]): Variant | undefined {
  const ok = variants.filter((v) => v.correct);
  if (!ok.length) return undefined;
  const timed = dense.filter((r) => typeof r.tflops === 'number');
  let best: Variant | undefined;
  let bestScore = -1;
  for (const v of ok) {
    const rows = timed.filter((r) => r.variant === v.label);
    if (!rows.length) continue;
    const nmax = Math.max(...rows.map((r) => r.n as number));
    // score at the largest n this variant reached, penalised when others reached larger n
    const atMax = rows.find((r) => r.n === nmax)!.tflops as number;
    const score = atMax * (nmax / Math.max(...timed.map((r) => r.n as number)));
    if (score > bestScore) {
      bestScore = score;
      best = v;
    }
  }
  return best ?? ok[0];
}
