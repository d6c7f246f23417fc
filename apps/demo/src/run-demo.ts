/**
 * The demo's work, free of the DOM: generate a @crisp/synth scenario, put it on a backend,
 * run sparsePrefill with a preset and dense attention on the same backend, and check both
 * against float64 (@crisp/reference) on a few sampled query rows. The page hands in the
 * WebGPU backend; the Node test hands in the reference backend, so one code path serves both.
 *
 * Shape legend: q [n, H, d], k and v [n, Hkv, d], B block size, Nb = ceil(n / B).
 */
import {
  type Backend,
  type BlockMask,
  type DType,
  type DeviceTensor,
  expandToRows,
  type HostData,
  type HostTensor,
  InvalidArgumentError,
  planPrefill,
  releasePlan,
  runPlan,
  sparsePrefill,
  toFloat32,
  wrapHost,
} from '@crisp/core';
import { type PresetName, presets } from '@crisp/presets';
import { attentionRows, massRecall, relativeError, sampleRows } from '@crisp/reference';
import { needleRecall, PROFILE_NAMES, type ProfileName, type Scenario, scenario, uploadScenario } from '@crisp/synth';

export const PRESET_NAMES: readonly PresetName[] = ['crisp', 'crispFast', 'flexPrefill', 'dense'];

export interface DemoConfig {
  readonly profile: ProfileName;
  readonly preset: PresetName;
  /** tokens */
  readonly n: number;
  /** query heads H */
  readonly heads: number;
  /** kv heads Hkv (H % Hkv == 0) */
  readonly kvHeads: number;
  /** head dim d (the WebGPU backend takes 64 and 128) */
  readonly headDim: number;
  /** 'auto': f16 when the adapter offers shader-f16, else f32 */
  readonly dtype: 'auto' | DType;
  readonly seed: number;
  /** query rows compared with float64 */
  readonly sampleRows: number;
  /** timed runs of each (sparse, dense); the median is shown */
  readonly repeats: number;
  /** one untimed run of each first (shader compiles land there) */
  readonly warmup: boolean;
  /**
   * Apply the backend's measured length gate (below `sparseCrossover` keys the plan is dense).
   * Off by default so small demos still show a sparse plan.
   */
  readonly lengthGate: boolean;
}

export const DEFAULT_CONFIG: DemoConfig = Object.freeze({
  profile: 'llama-like',
  preset: 'crisp',
  n: 4096,
  heads: 8,
  kvHeads: 2,
  headDim: 64,
  dtype: 'auto',
  seed: 1,
  sampleRows: 16,
  repeats: 3,
  warmup: true,
  lengthGate: false,
});

function intParam(p: URLSearchParams, name: string, fallback: number, lo: number, hi: number): number {
  const raw = p.get(name);
  if (raw === null || raw === '') return fallback;
  const v = Number(raw);
  if (!Number.isInteger(v) || v < lo || v > hi) {
    throw new InvalidArgumentError(`${name} must be an integer in [${lo}, ${hi}]; got '${raw}'`);
  }
  return v;
}

function boolParam(p: URLSearchParams, name: string, fallback: boolean): boolean {
  const raw = p.get(name);
  if (raw === null || raw === '') return fallback;
  if (raw === '1' || raw === 'true' || raw === 'on') return true;
  if (raw === '0' || raw === 'false' || raw === 'off') return false;
  throw new InvalidArgumentError(`${name} must be 1 or 0; got '${raw}'`);
}

function choiceParam<T extends string>(p: URLSearchParams, name: string, fallback: T, choices: readonly T[]): T {
  const raw = p.get(name);
  if (raw === null || raw === '') return fallback;
  if (!(choices as readonly string[]).includes(raw)) {
    throw new InvalidArgumentError(`${name} must be one of ${choices.join(', ')}; got '${raw}'`);
  }
  return raw as T;
}

/** Read a config from URL parameters (the form writes the same names); bad values throw INVALID_ARGUMENT. */
export function parseConfig(p: URLSearchParams): DemoConfig {
  const d = DEFAULT_CONFIG;
  const heads = intParam(p, 'heads', d.heads, 1, 64);
  const kvHeads = intParam(p, 'kvHeads', Math.min(d.kvHeads, heads), 1, heads);
  if (heads % kvHeads !== 0) {
    throw new InvalidArgumentError(`heads (${heads}) must be a multiple of kvHeads (${kvHeads})`);
  }
  return {
    profile: choiceParam(p, 'profile', d.profile, PROFILE_NAMES),
    preset: choiceParam(p, 'preset', d.preset, PRESET_NAMES),
    n: intParam(p, 'n', d.n, 256, 1 << 20),
    heads,
    kvHeads,
    headDim: Number(choiceParam(p, 'headDim', String(d.headDim), ['64', '128'])),
    dtype: choiceParam(p, 'dtype', d.dtype, ['auto', 'f32', 'f16'] as const),
    seed: intParam(p, 'seed', d.seed, -(2 ** 31), 2 ** 31 - 1),
    sampleRows: intParam(p, 'sampleRows', d.sampleRows, 1, 256),
    repeats: intParam(p, 'repeats', d.repeats, 1, 20),
    warmup: boolParam(p, 'warmup', d.warmup),
    lengthGate: boolParam(p, 'lengthGate', d.lengthGate),
  };
}

/** The dtype a config runs in on an adapter with these features. */
export function resolveDType(cfg: Pick<DemoConfig, 'dtype'>, features: readonly string[]): DType {
  if (cfg.dtype !== 'auto') return cfg.dtype;
  return features.includes('shader-f16') ? 'f16' : 'f32';
}

export interface HeadResult {
  readonly head: number;
  /** the synth head kind (sink-local, slash, vertical, retrieval, diffuse) */
  readonly kind: string;
  /** 'vs' or 'pe'; 'dense' when the whole plan is dense */
  readonly route: 'vs' | 'pe' | 'dense';
  /** the route the scenario's ground truth expects */
  readonly expectedRoute: 'vs' | 'pe';
  /** C_struct: the proxy rows' anchor mass (sink + local window); null for dense plans */
  readonly cStruct: number | null;
  /** the router's own score (C_struct for crisp, JSD distance for flexPrefill) */
  readonly routeScore: number | null;
  readonly density: number;
  /** relative error of this head's sampled rows against float64 with the same mask */
  readonly kernelError: number;
  /** relative error against float64 dense (docs/ALGORITHM.md's output error) */
  readonly outputError: number;
  readonly massRecall: number;
  /**
   * The proxy's block masses (each sums to 1; null for dense plans): p_v by key block J and
   * p_s by offset block O (0 = the diagonal). Sorted, they show the mass cliff of the paper's
   * Figure 1: a few anchor blocks, then decades of noise.
   */
  readonly verticalMass: number[] | null;
  readonly slashMass: number[] | null;
  /**
   * The head's key blocks J and offset blocks O: the VS selector's on VS heads; on PE heads the
   * kMin / B best of each direction with block 0 forced in (FlexPrefill's rule)
   */
  readonly verticalSelected: number[];
  readonly slashSelected: number[];
}

export interface DemoResult {
  readonly ok: true;
  readonly backend: string;
  readonly config: DemoConfig & { readonly dtype: DType };
  readonly scenario: { readonly profile: ProfileName; readonly description: string; readonly needles: number };
  readonly policy: string;
  /** why the plan is dense, when it is (policy, min-length, length-gate) */
  readonly denseReason: string | null;
  /**
   * The backend's measured length gate for this run's dtype and head dim (keys; dense below
   * it): applied only with `config.lengthGate`
   */
  readonly sparseCrossover: number;
  readonly scoreName: string | null;
  readonly routeThreshold: number | null;
  readonly heads: readonly HeadResult[];
  readonly overallDensity: number;
  /**
   * Medians over repeats, host wall clock, device work included. planMs: planPrefill until the
   * device is idle; attentionMs: runPlan on that plan until the device is idle (timed apart
   * from the plan); sparseMs: a whole sparsePrefill call (plan and attention overlapped)
   */
  readonly planMs: number;
  readonly attentionMs: number;
  readonly sparseMs: number;
  readonly denseMs: number;
  /** denseMs / sparseMs */
  readonly speedup: number;
  /** the backend's attention kernel (WebGPU: 'fma' or 'subgroup-matrix'; the backend's name elsewhere) */
  readonly attentionKernel: string;
  /** the score tiles of the proxy statistics' passes over every key (WebGPU: 'fma' or 'subgroup-matrix'; the backend's name elsewhere) */
  readonly statisticsKernel: string;
  /** causal attention FLOPs (4·d·H·n(n+1)/2) per second of the dense attention, in TFLOP/s */
  readonly denseTflops: number;
  /**
   * the sparse attention's achieved rate: the FLOPs of the blocks it computed (each head's
   * density times its causal FLOPs) per second of the sparse attention (plan excluded), in TFLOP/s
   */
  readonly sparseTflops: number;
  readonly rows: readonly number[];
  /** ‖O_gpu − O_f64(same mask)‖ / ‖O_f64(same mask)‖ over the sampled rows: the kernel's exactness */
  readonly kernelError: number;
  /** the same for the backend's dense attention against float64 dense */
  readonly denseKernelError: number;
  /** ‖O_sparse − O_dense,f64‖ / ‖O_dense,f64‖ over the sampled rows (docs/ALGORITHM.md's output error) */
  readonly outputError: number;
  readonly massRecall: number;
  readonly needleRecall: { readonly recall: number; readonly recalled: number; readonly total: number; readonly visibleRecall: number };
  readonly generateMs: number;
  readonly referenceMs: number;
}

/**
 * The raw numbers behind the errors, for an outside check (the browser test recomputes the
 * float64 rows in Node from the same seed and compares them with these).
 */
export interface DemoSamples {
  /** the sampled query rows */
  readonly rows: number[];
  /** backend's sparse output at those rows, [rows, H, d] row-major */
  readonly sparse: number[];
  /** backend's dense output at those rows */
  readonly dense: number[];
  /** the plan's mask as block rows (row h * Nb + I lists the key blocks of query block I); null when dense */
  readonly mask: { readonly blockSize: number; readonly numBlocks: number; readonly rowPtr: number[]; readonly cols: number[] } | null;
}

export interface DemoRun {
  readonly result: DemoResult;
  readonly samples: DemoSamples;
}

export type Progress = (message: string) => void;

const now = (): number => performance.now();

/** FLOPs of causal attention over n positions: two products of 2·d FLOPs per (query, key ≤ query) pair and head. */
export function causalFlops(n: number, heads: number, headDim: number): number {
  return 4 * headDim * heads * ((n * (n + 1)) / 2);
}
/** Let the page draw between steps (setTimeout exists in browsers and Node alike). */
const yieldToUi = (): Promise<void> => new Promise((resolve) => setTimeout(resolve, 0));

function median(xs: readonly number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
}

interface Uploaded {
  readonly q: DeviceTensor;
  readonly k: DeviceTensor;
  readonly v: DeviceTensor;
  readonly hq: HostTensor;
  readonly hk: HostTensor;
  readonly hv: HostTensor;
}

/**
 * Generate and upload in row chunks, keeping a host copy for the float64 checks.
 * (uploadScenario with a host copy of every chunk.)
 */
async function upload(backend: Backend, sc: Scenario, progress: Progress): Promise<Uploaded> {
  const { n, heads: H, kvHeads: Hkv, headDim: d, dtype } = sc;
  const make = (len: number): HostData => (dtype === 'f32' ? new Float32Array(len) : new Uint16Array(len));
  const hq = make(n * H * d);
  const hk = make(n * Hkv * d);
  const hv = make(n * Hkv * d);
  const { q, k, v } = await uploadScenario(backend, sc, {
    chunkRows: Math.max(64, Math.floor((1 << 19) / (H * d))),
    onChunk: (start, c) => {
      hq.set(c.q.data, start * H * d);
      hk.set(c.k.data, start * Hkv * d);
      hv.set(c.v.data, start * Hkv * d);
    },
    onProgress: (done) => progress(`generating and uploading rows: ${done} / ${n}`),
  });
  return {
    q,
    k,
    v,
    hq: wrapHost(dtype, [n, H, d], hq),
    hk: wrapHost(dtype, [n, Hkv, d], hk),
    hv: wrapHost(dtype, [n, Hkv, d], hv),
  };
}

/** The sampled rows of a [n, H, d] output as an f32 host tensor [rows, H, d]. */
function pickRows(out: HostTensor, rows: readonly number[]): HostTensor {
  const [, H, d] = out.shape;
  const all = toFloat32(out);
  const w = H * d;
  const picked = new Float32Array(rows.length * w);
  for (let i = 0; i < rows.length; i++) picked.set(all.subarray(rows[i] * w, (rows[i] + 1) * w), i * w);
  return wrapHost('f32', [rows.length, H, d], picked);
}

function f64Rows(output: Float64Array, shape: readonly number[]): HostTensor {
  return wrapHost('f32', shape, Float32Array.from(output));
}

/**
 * One demo run on `backend` (already created; not disposed here). `dtype` is the resolved
 * element type. Every tensor this run makes is freed before it returns or throws.
 */
export async function runDemo(backend: Backend, cfg: DemoConfig, dtype: DType, progress: Progress = () => {}): Promise<DemoRun> {
  const policy = presets[cfg.preset];
  const opts = cfg.lengthGate ? {} : { minSparseLength: 0 };
  const t0 = now();
  progress('generating the scenario');
  await yieldToUi();
  const sc = scenario(cfg.profile, {
    n: cfg.n,
    heads: cfg.heads,
    kvHeads: cfg.kvHeads,
    headDim: cfg.headDim,
    dtype,
    seed: cfg.seed,
  });
  const up = await upload(backend, sc, progress);
  const generateMs = now() - t0;
  const inputs = { q: up.q, k: up.k, v: up.v };
  const owned: DeviceTensor[] = [up.q, up.k, up.v];
  try {
    if (cfg.warmup) {
      progress(`warm-up: ${policy.name} sparse prefill (shaders compile here)`);
      await yieldToUi();
      const w = await sparsePrefill(backend, inputs, policy, opts);
      owned.push(w.output);
      w.output.dispose();
      progress('warm-up: dense attention');
      await yieldToUi();
      const wd = await backend.denseAttention(up.q, up.k, up.v);
      owned.push(wd.output);
      await backend.synchronize();
      wd.output.dispose();
    }
    const sparseTimes: number[] = [];
    let res: Awaited<ReturnType<typeof sparsePrefill>> | undefined;
    for (let r = 0; r < cfg.repeats; r++) {
      progress(`${policy.name} sparse prefill: run ${r + 1} / ${cfg.repeats}`);
      await yieldToUi();
      res?.output.dispose();
      res = await sparsePrefill(backend, inputs, policy, opts);
      owned.push(res.output);
      sparseTimes.push(res.timings.totalMs);
    }
    // The plan and the attention timed apart, each waited for on the device. sparsePrefill's
    // own split cannot serve: without device marks (WebGPU) its planMs is the host's part of
    // a device plan and its attentionMs holds the plan's device work as well.
    const planTimes: number[] = [];
    const attnTimes: number[] = [];
    for (let r = 0; r < cfg.repeats; r++) {
      progress(`${policy.name} plan, then attention, timed apart: run ${r + 1} / ${cfg.repeats}`);
      await yieldToUi();
      const t = now();
      const plan = await planPrefill(backend, inputs, policy, opts);
      try {
        await backend.synchronize();
        const tp = now();
        const run = await runPlan(backend, plan, inputs);
        owned.push(run.output);
        await backend.synchronize();
        planTimes.push(tp - t);
        attnTimes.push(now() - tp);
        run.output.dispose();
      } finally {
        releasePlan(plan);
      }
    }
    const denseTimes: number[] = [];
    let denseOut: DeviceTensor | undefined;
    for (let r = 0; r < cfg.repeats; r++) {
      progress(`dense attention: run ${r + 1} / ${cfg.repeats}`);
      await yieldToUi();
      denseOut?.dispose();
      const t = now();
      denseOut = (await backend.denseAttention(up.q, up.k, up.v)).output;
      owned.push(denseOut);
      await backend.synchronize();
      denseTimes.push(now() - t);
    }
    const plan = res!.plan;

    progress('downloading outputs');
    await yieldToUi();
    const rows = sampleRows(cfg.n, cfg.sampleRows);
    const sparseRows = pickRows(await backend.download(res!.output), rows);
    const denseRows = pickRows(await backend.download(denseOut!), rows);

    progress(`float64 reference on ${rows.length} query rows`);
    await yieldToUi();
    const tRef = now();
    const mask: BlockMask | undefined = plan.mask;
    const refDense = attentionRows(up.hq, up.hk, up.hv, rows);
    const refDenseT = f64Rows(refDense.output, refDense.shape);
    const refMaskedT = mask ? f64Rows(attentionRows(up.hq, up.hk, up.hv, rows, mask).output, refDense.shape) : refDenseT;
    const kernel = relativeError(sparseRows, refMaskedT);
    const denseKernel = relativeError(denseRows, refDenseT);
    const output = relativeError(sparseRows, refDenseT);
    const recall = mask ? massRecall(up.hq, up.hk, mask, { rows }) : undefined;
    const referenceMs = now() - tRef;
    const needles = needleRecall(plan, sc.truth);

    const Nb = plan.numBlocks;
    const slice = (a: Float64Array | undefined, h: number) => (a ? Array.from(a.subarray(h * Nb, (h + 1) * Nb)) : null);
    const vsList = (ptr: Int32Array | undefined, flat: Int32Array | undefined, h: number) =>
      ptr && flat ? Array.from(flat.subarray(ptr[h], ptr[h + 1])) : [];
    const heads: HeadResult[] = sc.truth.heads.map((t, h) => ({
      head: h,
      kind: t.kind,
      route: plan.routing ? plan.routing.routes[h] : 'dense',
      expectedRoute: t.expectedRoute,
      cStruct: plan.stats ? plan.stats.cStruct[h] : null,
      routeScore: plan.routing ? plan.routing.scores[h] : null,
      density: plan.density[h],
      kernelError: kernel.perHead[h],
      outputError: output.perHead[h],
      massRecall: recall ? recall.perHead[h] : 1,
      verticalMass: slice(plan.stats?.verticalBlocks, h),
      slashMass: slice(plan.stats?.slashBlocks, h),
      verticalSelected: vsList(mask?.vs?.verticalPtr, mask?.vs?.vertical, h),
      slashSelected: vsList(mask?.vs?.slashPtr, mask?.vs?.slash, h),
    }));
    const sparseMs = median(sparseTimes);
    const denseMs = median(denseTimes);
    const attentionMs = median(attnTimes);
    const headFlops = causalFlops(cfg.n, 1, cfg.headDim);
    const sparseFlops = heads.reduce((t, h) => t + h.density * headFlops, 0);
    const expanded = mask ? expandToRows(mask) : undefined;
    const samples: DemoSamples = {
      rows,
      sparse: Array.from(sparseRows.data),
      dense: Array.from(denseRows.data),
      mask: expanded
        ? { blockSize: mask!.blockSize, numBlocks: mask!.numBlocks, rowPtr: Array.from(expanded.rowPtr), cols: Array.from(expanded.cols) }
        : null,
    };
    progress('done');
    const result: DemoResult = {
      ok: true,
      backend: backend.name,
      config: { ...cfg, dtype },
      scenario: { profile: sc.profile, description: sc.description, needles: sc.truth.needles.length },
      policy: policy.name,
      denseReason: plan.denseReason ?? null,
      sparseCrossover: backend.sparseCrossoverFor?.(dtype, cfg.headDim) ?? backend.sparseCrossover,
      scoreName: plan.routing?.scoreName ?? null,
      routeThreshold: plan.routing?.threshold ?? null,
      heads,
      overallDensity: plan.overallDensity,
      planMs: median(planTimes),
      attentionMs,
      sparseMs,
      denseMs,
      speedup: denseMs / sparseMs,
      // the kernel this run's dtype and head dim use (f32 runs the FMA kernel everywhere)
      attentionKernel:
        (backend as { attentionKernelFor?: (dtype: 'f16' | 'f32', d: number) => string }).attentionKernelFor?.(dtype === 'f16' ? 'f16' : 'f32', cfg.headDim) ??
        backend.name,
      statisticsKernel:
        (backend as { statisticsKernelFor?: (dtype: 'f16' | 'f32', d: number) => string }).statisticsKernelFor?.(dtype === 'f16' ? 'f16' : 'f32', cfg.headDim) ??
        backend.name,
      denseTflops: causalFlops(cfg.n, cfg.heads, cfg.headDim) / denseMs / 1e9,
      sparseTflops: sparseFlops / attentionMs / 1e9,
      rows,
      kernelError: kernel.overall,
      denseKernelError: denseKernel.overall,
      outputError: output.overall,
      massRecall: recall ? recall.overall : 1,
      needleRecall: {
        recall: needles.recall,
        recalled: needles.recalled,
        total: needles.total,
        visibleRecall: needles.visibleRecall,
      },
      generateMs,
      referenceMs,
    };
    return { result, samples };
  } finally {
    for (const t of owned) if (!t.disposed) t.dispose();
  }
}
