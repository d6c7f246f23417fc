/**
 * What a bench run measures and at which sizes. `--smoke` is the CI setting (tiny, every
 * suite, under ~2 minutes on a CPU machine); the full setting is the GPU machine's
 * (Llama-3.1-8B attention shape, n 8k..512k, each backend stopping where its memory or a
 * time budget stops it). Every size list can be overridden from the command line.
 */
import type { AttentionKernel, SubgroupMatrixForm } from '@crisp/kernels-webgpu';
import type { DType } from '@crisp/core';
import type { AttentionVariant, CudaSchedule, ProxyLayout } from '@crisp/kernels-cuda';
import { ALL_PROFILE_NAMES, PROFILE_NAMES, type ProfileName } from '@crisp/synth';

export const BACKEND_NAMES = ['reference', 'webgpu', 'cuda'] as const;
export type BackendName = (typeof BACKEND_NAMES)[number];
export const SUITE_NAMES = ['latency', 'accuracy', 'onCurve', 'crossover', 'floors', 'tfjs', 'varlen', 'parity', 'parallel'] as const;
/** The dense peers of the latency suite, per GPU backend: PyTorch SDPA beside CUDA, three beside WebGPU. */
export const PEERS_OF = {
  cuda: ['torch-sdpa-flash', 'torch-sdpa-cudnn'],
  webgpu: ['webgpu-fma', 'tfjs-webgpu', 'ort-web-webgpu'],
} as const;
export const PEER_NAMES = [...PEERS_OF.cuda, ...PEERS_OF.webgpu] as const;
export type PeerName = (typeof PEER_NAMES)[number];

/** CRISP's presets the parity suite may run beside FlexPrefill's code (config.parity.presets) */
export const PARITY_PRESETS = ['crisp', 'crispFast', 'crispGuarded'] as const;
export type ParityPreset = (typeof PARITY_PRESETS)[number];
export type SuiteName = (typeof SUITE_NAMES)[number];
/**
 * What runs without --suites: every suite but tfjs (it needs a WebGPU adapter of its own),
 * varlen (ragged batches and chunked prefill, a GPU phase of its own), parity (FlexPrefill's
 * own code on the same tensors: PyTorch, Triton and a copy of that code) and parallel
 * (context-parallel traffic and load per rank); they are asked for by name.
 */
export const DEFAULT_SUITES: readonly SuiteName[] = SUITE_NAMES.filter((s) => s !== 'tfjs' && s !== 'varlen' && s !== 'parity' && s !== 'parallel');
/**
 * The varlen suite's policies: the crisp preset, its copy scaled to B = 64 for short sequences
 * (CPU tests), or dense (every head dense: chunked prefill where sparse chunks are refused).
 */
export const VARLEN_POLICIES = ['crisp', 'crisp-b64', 'dense'] as const;
export type VarlenPolicyName = (typeof VARLEN_POLICIES)[number];

export interface Shape {
  readonly heads: number;
  readonly kvHeads: number;
  readonly headDim: number;
}

export interface BenchConfig {
  readonly mode: 'smoke' | 'full';
  readonly seed: number;
  /**
   * the CUDA backend's `schedule` (how the host thread waits for the GPU: the primary
   * context's scheduling flags); auto leaves them as they are
   */
  readonly cudaSchedule: CudaSchedule;
  /** the CUDA backend's `proxyLayout` (undefined: the backend's default for the GPU) */
  readonly cudaProxyLayout?: ProxyLayout;
  /** the CUDA backend's `programmaticLaunch` (undefined: the backend's default, on where the GPU and driver have it) */
  readonly cudaPdl?: boolean;
  /** the CUDA backend's `flexPrefillOnDevice` (undefined: the backend's default, on) */
  readonly cudaFlexOnDevice?: boolean;
  /** CUDA: the attention kernel layout (the backend's attentionVariant); undefined: the backend's default for the GPU */
  readonly cudaAttention?: AttentionVariant;
  /** CUDA: the backend's peVsExcessOnDevice (crispGuarded's narrowed PE lists on the device planner); undefined: the backend's default (device) */
  readonly cudaGuardOnDevice?: boolean;
  /** WebGPU: the attention kernel (and the tensor-core kernel's form); undefined: the backend's default ('fma') */
  readonly webgpuKernel?: { readonly kernel: AttentionKernel; readonly form?: SubgroupMatrixForm };
  /** WebGPU: where the device plan cuts the PE heads' maps (the backend's peCut); undefined: its default ('device') */
  readonly webgpuPeCut?: 'device' | 'host';
  readonly suites: readonly SuiteName[];
  readonly latency: {
    readonly sizes: readonly number[];
    /** the reference is float64 JS: it gets its own (smaller) shape and sizes */
    readonly referenceSizes: readonly number[];
    readonly shape: Shape;
    readonly referenceShape: Shape;
    readonly reps: number;
    readonly warmup: number;
    /**
     * GPU backends: this many untimed prefills at n = JIT_WARMUP_N (every timed preset in
     * turn) before the first size, so that the timed calls run the JavaScript JIT's optimised
     * code, as a serving loop's would (V8 tiers a function up by the bytecode it has run, so
     * the functions a prefill calls once, such as the plan's checks before the proxy pass, need
     * ~1,000 calls: at 300 they were not optimised yet, and 2,000 took ~0.02 ms off the 128k
     * plan from an idle H200). 0: the timed calls start from cold code.
     */
    readonly jitWarmup: number;
    /**
     * GPU backends: each preset's warm-up runs at a size go on until this many milliseconds
     * have passed (at least `warmup` runs): a GPU idle while the host made the inputs runs its
     * first short calls slowly. Absent in results written before it existed.
     */
    readonly gpuWarmMs?: number;
    /** per backend: stop growing n once the projected time of the next size exceeds what is left */
    readonly budgetMs: number;
    /**
     * the dense peers timed beside the latency suite (PEER_NAMES); absent: every one. A peer
     * left out is noted as not run (`--peers`), so before/after runs need not wait for them.
     */
    readonly peers?: readonly PeerName[];
    readonly profile: ProfileName;
    /** presets timed on the reference, and on the other backends (names from @crisp/presets) */
    readonly presets: readonly string[];
    readonly gpuPresets: readonly string[];
    /** above this many q/k/v values the synth scenario is replaced by the fast llama fill */
    readonly maxHostValues: number;
    /**
     * auto: a backend's device fill if it has one, else the synth scenario up to
     * maxHostValues, else the host port of the fill; fill: always the llama fill (device or
     * host port: the same layer on every GPU backend and size); synth: always the scenario.
     */
    readonly inputs: 'auto' | 'fill' | 'synth';
    /**
     * host threads generating synth inputs of 32k tokens and more (worker threads running the
     * bench's own entry; the same values as one thread); undefined: the cores less one, at most 16
     */
    readonly synthThreads?: number;
    /**
     * mark q, k and v rewritten before every run (a new layer's tensors, as a runtime
     * hands them over): the backend's once-per-version input checks then run every time
     */
    readonly freshInputs: boolean;
    /**
     * time the plan with the host clock: the backend's device marks (Backend.mark) are
     * hidden from sparsePrefill (an A/B of what marking the device timeline costs)
     */
    readonly hostTimings: boolean;
    /**
     * after each preset's timed runs, one more run with every kernel timed on the GPU
     * (a backend's `profile`, timestamp queries: WebGPU), reported per program
     */
    readonly kernelTimes: boolean;
  };
  readonly accuracy: {
    readonly sizes: readonly number[];
    readonly shape: Shape;
    readonly profiles: readonly ProfileName[];
    /** profiles on backends other than the reference (smoke: one, to stay fast on SwiftShader) */
    readonly gpuProfiles: readonly ProfileName[];
    /** query rows sampled for mass recall and output error (float64, host) */
    readonly rows: number;
    /**
     * FlexPrefill at these coverage γ (its VS and PE selections) beside the presets, for the
     * comparison at matched error (the report finds the smallest γ whose error is within
     * crispGuarded's); empty: none. Absent in results written before it existed.
     */
    readonly flexGammas?: readonly number[];
    /**
     * crispGuarded with its VS heads' noise floor at these α (its PE heads' lists at the
     * preset's, Policy.peVs) beside the presets, for the comparison at matched density (the
     * report finds the smallest α whose density is within flexPrefill's); empty: none. Absent
     * in results written before it.
     */
    readonly guardAlphas?: readonly number[];
  };
  readonly onCurve: {
    /** score-vector sizes (pure TS, no backend) */
    readonly syntheticSizes: readonly number[];
    /** sizes for real proxy statistics through each backend */
    readonly proxySizes: readonly number[];
    readonly shape: Shape;
  };
  readonly floors: {
    readonly n: number;
    readonly shape: Shape;
    readonly profiles: readonly ProfileName[];
    readonly rows: number;
  };
  /** @crisp/tfjs on tfjs-backend-webgpu against TF.js dense attention (f32) */
  readonly tfjs: {
    readonly sizes: readonly number[];
    readonly shape: Shape;
    readonly reps: number;
    readonly warmup: number;
    /** the size at which the host path is timed beside the zero-copy path */
    readonly copyN: number;
  };
  /**
   * Ragged batches (varlenPrefill against one sparsePrefill per sequence, CRISP's dense kernel
   * and the SDPA peers per sequence) and chunked prefill (one sequence in equal query chunks
   * over its growing KV prefix against one full prefill). Shape, dtype, reps and warm-up are
   * the latency suite's (the reference: its referenceShape).
   */
  readonly varlen: {
    /** sequences in the batch */
    readonly batch: number;
    /** seed of the length draw (each sequence's scenario seed is the run's seed + its index) */
    readonly seed: number;
    /** lengths are drawn uniformly from [min, max] tokens */
    readonly range: readonly [number, number];
    /** the chunked sequence's length and its query chunks */
    readonly chunkedN: number;
    readonly chunks: number;
    readonly policy: VarlenPolicyName;
  };
  /**
   * The flexPrefill preset against FlexPrefill's published code (apps/bench/peers/flexprefill_peer.py)
   * on the same bf16 tensors, CUDA only: routes, block sets, output error, density and time per
   * (profile, n, seed). The shape's head dim must be one FlexPrefill's kernels take (16, 32, 64, 128).
   */
  readonly parity: {
    readonly sizes: readonly number[];
    readonly profiles: readonly ProfileName[];
    readonly seeds: readonly number[];
    readonly shape: Shape;
    /** query rows sampled for both outputs' error against float64 dense attention */
    readonly rows: number;
    readonly reps: number;
    readonly warmup: number;
    /** folder holding FlexPrefill's flex_prefill package (default apps/bench/peers/.flexprefill) */
    readonly flexprefillDir?: string;
    /** CRISP's own presets run on the same layers, timed and scored beside FlexPrefill's code */
    readonly presets: readonly ParityPreset[];
  };
  /**
   * Context-parallel prefill (@crisp/parallel) from the single-backend plan: per size and rank
   * count, the K/V bytes each rank receives against a dense ring, the plan-phase bytes and the
   * attention's load balance over the zig-zag shards. The plan is made once per size, on the
   * first backend available of cuda, webgpu, reference.
   */
  readonly parallel: {
    /** sizes when the plan is made on a GPU backend */
    readonly sizes: readonly number[];
    /** sizes when it is made on the float64 reference (its proxy statistics are O(B·n·H·d) on the host) */
    readonly referenceSizes: readonly number[];
    /** rank counts P */
    readonly ranks: readonly number[];
    readonly shape: Shape;
    /** presets planned (names from @crisp/presets) */
    readonly presets: readonly string[];
  };
}

const ALL_PRESETS = ['dense', 'crisp', 'crispFast', 'crispGuarded', 'flexPrefill'];
export const CUDA_SCHEDULES: readonly CudaSchedule[] = ['auto', 'spin', 'yield', 'blocking'];

const pow2 = (from: number, to: number): number[] => {
  const out: number[] = [];
  for (let n = from; n <= to; n *= 2) out.push(n);
  return out;
};

export function defaultConfig(mode: 'smoke' | 'full'): BenchConfig {
  if (mode === 'smoke') {
    return {
      mode,
      seed: 7,
      cudaSchedule: 'auto',
      suites: DEFAULT_SUITES,
      latency: {
        sizes: [1152],
        referenceSizes: [1152, 1536],
        shape: { heads: 1, kvHeads: 1, headDim: 64 },
        referenceShape: { heads: 1, kvHeads: 1, headDim: 64 },
        reps: 3,
        warmup: 1,
        jitWarmup: 0,
        gpuWarmMs: 0,
        budgetMs: 60_000,
        profile: 'llama-like',
        presets: ALL_PRESETS,
        // SwiftShader compiles and runs WGSL slowly: the smoke times the two ends only.
        gpuPresets: ['dense', 'crisp'],
        maxHostValues: 64e6,
        inputs: 'auto',
        freshInputs: false,
        hostTimings: false,
        kernelTimes: false,
      },
      accuracy: { sizes: [2048], shape: { heads: 4, kvHeads: 1, headDim: 64 }, profiles: PROFILE_NAMES, gpuProfiles: ['llama-like'], rows: 8, flexGammas: [], guardAlphas: [] },
      onCurve: { syntheticSizes: pow2(8192, 131072), proxySizes: [2048], shape: { heads: 4, kvHeads: 1, headDim: 64 } },
      floors: { n: 2048, shape: { heads: 4, kvHeads: 1, headDim: 64 }, profiles: ['llama-like', 'diffuse'], rows: 8 },
      tfjs: { sizes: [1024], shape: { heads: 2, kvHeads: 1, headDim: 64 }, reps: 2, warmup: 1, copyN: 1024 },
      varlen: { batch: 3, seed: 7, range: [300, 1500], chunkedN: 1536, chunks: 4, policy: 'crisp-b64' },
      parity: { sizes: [2048], profiles: ['llama-like'], seeds: [1], shape: { heads: 4, kvHeads: 1, headDim: 64 }, rows: 8, reps: 3, warmup: 1, presets: ['crisp', 'crispGuarded'] },
      parallel: { sizes: [2048], referenceSizes: [2048], ranks: [2, 4], shape: { heads: 4, kvHeads: 2, headDim: 64 }, presets: ['crisp'] },
    };
  }
  return {
    mode,
    seed: 7,
    cudaSchedule: 'auto',
    suites: DEFAULT_SUITES,
    latency: {
      sizes: pow2(8192, 524288),
      referenceSizes: [2048, 4096, 8192, 16384],
      shape: { heads: 32, kvHeads: 8, headDim: 128 },
      referenceShape: { heads: 2, kvHeads: 1, headDim: 64 },
      reps: 3,
      warmup: 1,
      jitWarmup: 2000,
      gpuWarmMs: 500,
      budgetMs: 240_000,
      profile: 'llama-like',
      presets: ALL_PRESETS,
      gpuPresets: ALL_PRESETS,
      maxHostValues: 100e6,
      inputs: 'auto',
      freshInputs: false,
      hostTimings: false,
      kernelTimes: false,
    },
    accuracy: {
      sizes: [8192],
      shape: { heads: 16, kvHeads: 4, headDim: 64 },
      profiles: ALL_PROFILE_NAMES,
      gpuProfiles: ALL_PROFILE_NAMES,
      rows: 32,
      flexGammas: [0.98, 0.99, 0.995, 0.999],
      guardAlphas: [1.25, 1.5, 2],
    },
    onCurve: { syntheticSizes: pow2(8192, 524288), proxySizes: pow2(4096, 32768), shape: { heads: 8, kvHeads: 2, headDim: 64 } },
    floors: { n: 8192, shape: { heads: 16, kvHeads: 4, headDim: 64 }, profiles: PROFILE_NAMES, rows: 32 },
    tfjs: { sizes: [8192, 16384, 32768], shape: { heads: 32, kvHeads: 8, headDim: 128 }, reps: 3, warmup: 1, copyN: 16384 },
    varlen: { batch: 8, seed: 7, range: [4096, 131072], chunkedN: 131072, chunks: 4, policy: 'crisp' },
    parity: { sizes: pow2(8192, 524288), profiles: PROFILE_NAMES, seeds: [1, 2], shape: { heads: 16, kvHeads: 4, headDim: 64 }, rows: 64, reps: 3, warmup: 1, presets: ['crisp', 'crispGuarded'] },
    parallel: { sizes: pow2(32768, 524288), referenceSizes: [16384, 32768], ranks: [2, 4, 8], shape: { heads: 32, kvHeads: 8, headDim: 128 }, presets: ['crisp'] },
  };
}

/** The element type each backend is timed in (bf16 on CUDA as in the paper; f16 on WebGPU; f32 on the reference). */
export function latencyDtype(backend: string): DType {
  return backend === 'cuda' ? 'bf16' : backend === 'webgpu' ? 'f16' : 'f32';
}

/** "4k..128k" or "300..1500": a [min, max] token range (both ends as parseSizes reads one size). */
export function parseRange(text: string): [number, number] {
  const m = /^(.+)\.\.(.+)$/.exec(text.trim());
  const ends = m ? [m[1], m[2]].map((x) => parseSizes(x)) : [];
  if (ends.length !== 2 || ends.some((e) => e.length !== 1) || !(ends[1][0] >= ends[0][0])) {
    throw new Error(`bad range '${text}': use min..max with min <= max (e.g. 4k..128k)`);
  }
  return [ends[0][0], ends[1][0]];
}

/** "8192,16384" or "8k..512k" (powers of two) or "2048..16384". */
export function parseSizes(text: string): number[] {
  const num = (s: string): number => {
    const m = /^(\d+(?:\.\d+)?)([kK])?$/.exec(s.trim());
    if (!m) throw new Error(`not a size: '${s}' (use 8192, 8k or 8k..512k)`);
    return Math.round(Number(m[1]) * (m[2] ? 1024 : 1));
  };
  const range = /^(.+)\.\.(.+)$/.exec(text.trim());
  if (range) {
    const a = num(range[1]);
    const b = num(range[2]);
    if (!(a >= 1 && b >= a)) throw new Error(`bad size range '${text}'`);
    return pow2(a, b);
  }
  const out = text.split(',').filter((s) => s.trim() !== '').map(num);
  if (out.length === 0 || out.some((n) => !(n >= 1))) throw new Error(`bad size list '${text}'`);
  return out;
}
