/**
 * crisp-bench: every suite on every backend this machine has, into
 * apps/bench/results/<machine>/ (bench.json, bench.md, SVG figures).
 */
import { existsSync, mkdirSync, renameSync, writeFileSync } from 'node:fs';
import { basename, isAbsolute, join, relative, resolve, sep } from 'node:path';
import { Command, Option } from 'commander';
import { ATTENTION_VARIANTS, type AttentionVariant, PROXY_LAYOUTS, type ProxyLayout } from '@crisp/kernels-cuda';
import { ATTENTION_KERNELS, type AttentionKernel, SUBGROUP_MATRIX_FORMS, type SubgroupMatrixForm } from '@crisp/kernels-webgpu';
import { ALL_PROFILE_NAMES } from '@crisp/synth';
import { type OpenBackend, openBackend } from './backends.js';
import { BACKEND_NAMES, type BackendName, type BenchConfig, CUDA_SCHEDULES, defaultConfig, PARITY_PRESETS, PEER_NAMES, parseRange, parseSizes, SUITE_NAMES, type SuiteName, type Shape, VARLEN_POLICIES } from './config.js';
import { type SuiteContext, message } from './context.js';
import { figures } from './figures.js';
import { findRepoRoot, machineInfo } from './machine.js';
import { densePeers, resolvePeerScript } from './peers.js';
import { foldResults, mergeResults, readResult, stampRuns } from './merge.js';
import { headline, markdown } from './report.js';
import type { BenchResult } from './result.js';
import { accuracySuite } from './suites/accuracy.js';
import { crossoverSuite } from './suites/crossover.js';
import { floorsSuite } from './suites/floors.js';
import { latencySuite } from './suites/latency.js';
import { onCurveSuite } from './suites/on-curve.js';
import { parallelSuite } from './suites/parallel.js';
import { paritySuite, resolveFlexPrefillPeer } from './suites/parity.js';
import { tfjsSuite } from './suites/tfjs.js';
import { varlenSuite } from './suites/varlen.js';

function list<T extends string>(text: string, allowed: readonly T[], what: string): T[] {
  const items = text.split(',').map((s) => s.trim()).filter(Boolean);
  for (const x of items) if (!allowed.includes(x as T)) throw new Error(`unknown ${what} '${x}'; use ${allowed.join(', ')}`);
  return items as T[];
}

function shape(text: string): Shape {
  const [heads, kvHeads, headDim] = text.split(',').map(Number);
  if (![heads, kvHeads, headDim].every((x) => Number.isInteger(x) && x > 0) || heads % kvHeads !== 0) {
    throw new Error(`bad shape '${text}': use H,Hkv,d with H % Hkv == 0 (e.g. 32,8,128)`);
  }
  return { heads, kvHeads, headDim };
}

function program(): Command {
  return new Command('crisp-bench')
    .description('CRISP benchmarks: latency, accuracy, the O(n) curve, crossover, floors; JSON + markdown + SVG per machine')
    .option('--smoke', 'tiny sizes, every suite (CI; under ~2 minutes on a CPU)')
    .option('--backends <list>', `comma-separated subset of ${BACKEND_NAMES.join(',')} (default: every one available)`)
    .option('--suites <list>', `comma-separated subset of ${SUITE_NAMES.join(',')}`)
    .option('--out <dir>', 'output folder (default: apps/bench/results/<machine>/ under the repository root)')
    .option('--sizes <sizes>', 'latency sizes for GPU backends: 8192,16384 or 8k..512k')
    .option('--reference-sizes <sizes>', 'latency sizes for the float64 reference')
    .option('--shape <H,Hkv,d>', 'latency shape for GPU backends (default 32,8,128: Llama-3.1-8B)')
    .option('--reference-shape <H,Hkv,d>', 'latency shape for the reference')
    .option('--acc-sizes <sizes>', 'accuracy sizes')
    .option('--tfjs-sizes <sizes>', 'tfjs suite sizes (@crisp/tfjs against TF.js dense attention on tfjs-backend-webgpu)')
    .option('--varlen-batch <count>', 'varlen suite: sequences in the ragged batch (default 8)')
    .option('--varlen-seed <seed>', 'varlen suite: seed of the length draw (default 7)')
    .option('--varlen-range <min..max>', 'varlen suite: the sequences\' lengths are drawn uniformly from this range (default 4k..128k)')
    .option('--varlen-policy <name>', `varlen suite: ${VARLEN_POLICIES.join(', ')} (default crisp; crisp-b64: B 64, kMin 256, for short sequences)`)
    .option('--chunked-n <n>', 'varlen suite: the chunked-prefill sequence\'s length (default 128k)')
    .option('--chunks <count>', 'varlen suite: equal query chunks of the chunked-prefill sequence (default 4)')
    .option('--parity-sizes <sizes>', 'parity suite sizes (default 8k..512k)')
    .option('--parity-profiles <list>', `parity suite: comma-separated @crisp/synth profiles (default llama-like,qwen-like,retrieval,diffuse; also ${ALL_PROFILE_NAMES.slice(4).join(',')})`)
    .option('--parity-seeds <list>', 'parity suite: comma-separated scenario seeds (default 1,2)')
    .option('--parity-shape <H,Hkv,d>', "parity suite shape (default 16,4,64; d must be 16, 32, 64 or 128: FlexPrefill's kernels)")
    .option('--parity-rows <count>', 'parity suite: query rows sampled for both outputs\' error against float64 dense attention (default 64)')
    .option('--parity-presets <list>', "parity suite: CRISP's presets timed and scored on the same layers as FlexPrefill's code (default crisp,crispGuarded; none for none)")
    .option('--flexprefill-dir <dir>', "parity suite: folder holding FlexPrefill's flex_prefill package (default apps/bench/peers/.flexprefill)")
    .option('--parallel-sizes <sizes>', 'parallel suite sizes (default 32k..512k with a GPU backend, 16k,32k on the reference)')
    .option('--parallel-ranks <list>', 'parallel suite: comma-separated rank counts P (default 2,4,8)')
    .option('--parallel-shape <H,Hkv,d>', 'parallel suite shape (default 32,8,128: Llama-3.1-8B)')
    .option('--acc-shape <H,Hkv,d>', 'accuracy and floors shape')
    .option('--acc-profiles <list>', `accuracy: @crisp/synth profiles, a comma-separated subset of ${ALL_PROFILE_NAMES.join(',')} (default: all of them; smoke: the first four)`)
    .option('--acc-rows <count>', 'query rows sampled for mass recall and output error')
    .option(
      '--acc-flex-gammas <list>',
      "accuracy: FlexPrefill at these coverage γ (each in (0, 1)) beside the presets, for the comparison at matched error; 'none' for none (default: 0.98,0.99,0.995,0.999; smoke: none)",
    )
    .option(
      '--acc-guard-alphas <list>',
      "accuracy: crispGuarded with its VS heads' noise floor at these α (each > 0; its PE heads' lists as the preset's) beside the presets, for the comparison at matched density; 'none' for none (default: 1.25,1.5,2; smoke: none)",
    )
    .option('--proxy-sizes <sizes>', 'O(n) curve sizes on real proxy statistics')
    .option('--curve-sizes <sizes>', 'O(n) curve sizes on constructed score vectors')
    .option('--floors-n <n>', 'n for the floors comparison')
    .option('--presets <list>', 'latency presets (default dense,crisp,crispFast,crispGuarded,flexPrefill) and parallel presets (default crisp)')
    .option('--peers <list>', `dense peers timed beside the latency suite: a comma-separated subset of ${PEER_NAMES.join(',')}, or none (default: every one)`)
    .option('--reps <count>', 'timed runs per measurement (>= 3)')
    .option('--warmup <count>', 'untimed runs first')
    .option('--jit-warmup <count>', 'GPU backends: untimed prefills at 8k before the first size (at most 30 s after one prefill of each preset, which compile the kernels), so the timed calls run JIT-optimised JavaScript (default 2000: functions a prefill calls once need ~1,000 calls before V8 optimises them; 0: cold)')
    .option('--budget-s <seconds>', 'latency time budget per backend; larger sizes are skipped once the projection exceeds it')
    .option('--latency-inputs <kind>', 'auto (default), fill (the llama fill on every backend and size: comparable across GPUs) or synth')
    .option('--max-host-values <count>', 'largest q+k+v generated on the host for backends without a device fill')
    .option(
      '--synth-threads <count>',
      'latency: host threads generating synth inputs of 32k tokens and more (default: the cores less one, at most 16; 1: the main thread only)',
    )
    .option('--fresh-inputs', 'latency: mark q, k and v rewritten before every run (a new layer each time: input checks run every time)')
    .option('--host-timings', "latency: plan and attention times from the host clock, the backend's device marks unused")
    .option('--kernel-times', 'latency: one more run per preset and size with every kernel timed on the GPU (WebGPU: timestamp queries; CUDA: events around each launch, waited for in turn), reported per kernel')
    .option('--seed <seed>', 'scenario seed')
    .option('--cuda-schedule <mode>', "CUDA: how the host thread waits for the GPU (the primary context's scheduling flags): auto (default: left as they are), spin, yield or blocking")
    .option('--cuda-proxy-layout <layout>', "CUDA: the proxy statistics' kernel layout (default: the backend's choice for the GPU; wg on sm_90); w32 (every GPU) or wg (sm_90 wgmma)")
    .option('--cuda-pdl <on|off>', "CUDA: launch the plan's small kernels after the proxy pass programmatically (default on where the GPU, sm_90 and later, and the driver have it); off: plain launches, for A/B runs")
    .option(
      '--cuda-guard-plan <host|device>',
      "CUDA: where crispGuarded's plan is made: device (the backend's default, its peVsExcessOnDevice) or host",
    )
    .option(
      '--webgpu-kernel <kernel>',
      "WebGPU: the attention kernel: fma or subgroup-matrix[:pipelined|staged|direct|two-pass] (tensor cores where the adapter offers them; the dense baseline runs it too). Default: the backend's own choice, subgroup-matrix:pipelined where offered, else fma",
    )
    .option('--webgpu-pe-cut <device|host>', "WebGPU: where the device plan cuts the PE heads' pooled maps: device (the backend's default: nothing read back before the attention) or host")
    .option('--cuda-attention <layout>', "CUDA: the attention kernel layout (default: the backend's choice for the GPU, wg3 on sm_90); w32 (every GPU), wgw, wgt or wg3 (sm_90; wg3 is wgt with three consumer warpgroups for dense d 64)")
    .option('--cuda-flex-plan <host|device>', "CUDA: where the flexPrefill preset's plan is made: device (the default: its jsd router and coverage selection on the device planner, the backend's flexPrefillOnDevice) or host")
    .option('--peer-script <path>', 'PyTorch SDPA peer (default apps/bench/peers/sdpa_peer.py from the repository root)')
    .option('--merge', "fold this run into the output folder's existing bench.json (by backend and suite) instead of replacing it; a missing bench.json starts a new one")
    .option('--fold <files>', 'comma-separated bench.json files merged (in order, as with --merge) into the output before this run, or with --render-only into its bench.json; e.g. a second folder of the same machine')
    .option('--render-only', "rewrite bench.md, headline.md and the figures of --out's bench.json with this version's report; runs nothing, changes no measurement (with --fold: merges those files into that bench.json first)")
    .option('--deadline-s <seconds>', 'wall-clock limit for the whole run: no size, profile or peer starts whose projected time exceeds what is left (reported as skipped)')
    .option('--link-base <path>', "where headline.md's links point (default: the output folder relative to the repository root, or apps/bench/results/<folder name> when it is outside)")
    .addOption(new Option('--quiet', 'no progress lines'))
    .exitOverride()
    .configureOutput({ writeErr: (s) => process.stderr.write(s) });
}

export interface MainOptions {
  /** where progress goes (default stderr) */
  readonly log?: (line: string) => void;
}

/** `--webgpu-kernel`: fma, subgroup-matrix or subgroup-matrix:FORM. */
function webgpuKernelOption(x: string): NonNullable<BenchConfig['webgpuKernel']> {
  const [kernel, form, ...rest] = x.split(':');
  const known = ATTENTION_KERNELS.includes(kernel as AttentionKernel);
  if (rest.length || !known || (form !== undefined && (kernel !== 'subgroup-matrix' || !SUBGROUP_MATRIX_FORMS.includes(form as SubgroupMatrixForm)))) {
    throw new Error(`--webgpu-kernel must be fma or subgroup-matrix[:${SUBGROUP_MATRIX_FORMS.join('|')}]; got ${x}`);
  }
  return form === undefined ? { kernel: kernel as AttentionKernel } : { kernel: 'subgroup-matrix', form: form as SubgroupMatrixForm };
}

/** Resolve the command line into a config (exported for tests). */
export function resolveConfig(o: Record<string, string | boolean | undefined>): BenchConfig {
  const base = defaultConfig(o.smoke ? 'smoke' : 'full');
  const num = (x: string | boolean | undefined, what: string, min: number): number | undefined => {
    if (x === undefined) return undefined;
    const v = Number(x);
    if (!Number.isFinite(v) || v < min) throw new Error(`--${what} must be a number >= ${min}; got ${String(x)}`);
    return v;
  };
  const integer = (x: string | boolean | undefined, what: string, min: number): number | undefined => {
    const v = num(x, what, min);
    if (v !== undefined && !Number.isInteger(v)) throw new Error(`--${what} must be an integer; got ${String(x)}`);
    return v;
  };
  const sizes = (x: string | boolean | undefined) => (typeof x === 'string' ? parseSizes(x) : undefined);
  const shp = (x: string | boolean | undefined) => (typeof x === 'string' ? shape(x) : undefined);
  const budget = num(o.budgetS, 'budget-s', 1);
  const accShape = shp(o.accShape);
  const chunkedN = typeof o.chunkedN === 'string' ? oneSize(o.chunkedN, 'chunked-n') : base.varlen.chunkedN;
  const chunks = integer(o.chunks, 'chunks', 1) ?? base.varlen.chunks;
  if (chunks > chunkedN) throw new Error(`--chunks ${chunks} is more than --chunked-n ${chunkedN}: every chunk needs a query row`);
  const presetList = typeof o.presets === 'string' ? list(o.presets, ['dense', 'crisp', 'crispFast', 'crispGuarded', 'flexPrefill'], 'preset') : undefined;
  return {
    ...base,
    seed: num(o.seed, 'seed', 0) ?? base.seed,
    cudaSchedule: typeof o.cudaSchedule === 'string' ? list(o.cudaSchedule, CUDA_SCHEDULES, 'CUDA schedule')[0] : base.cudaSchedule,
    ...(typeof o.cudaProxyLayout === 'string'
      ? { cudaProxyLayout: list(o.cudaProxyLayout, Object.keys(PROXY_LAYOUTS) as ProxyLayout[], 'CUDA proxy layout')[0] }
      : {}),
    ...(typeof o.cudaPdl === 'string' ? { cudaPdl: list(o.cudaPdl, ['on', 'off'], 'CUDA programmatic launch setting')[0] === 'on' } : {}),
    ...(typeof o.cudaFlexPlan === 'string' ? { cudaFlexOnDevice: list(o.cudaFlexPlan, ['host', 'device'], "CUDA flexPrefill plan setting")[0] === 'device' } : {}),
    ...(typeof o.cudaAttention === 'string' ? { cudaAttention: list(o.cudaAttention, Object.keys(ATTENTION_VARIANTS) as AttentionVariant[], 'CUDA attention layout')[0] } : {}),
    ...(typeof o.cudaGuardPlan === 'string' ? { cudaGuardOnDevice: list(o.cudaGuardPlan, ['host', 'device'], 'CUDA crispGuarded plan setting')[0] === 'device' } : {}),
    ...(typeof o.webgpuKernel === 'string' ? { webgpuKernel: webgpuKernelOption(o.webgpuKernel) } : {}),
    ...(typeof o.webgpuPeCut === 'string' ? { webgpuPeCut: list(o.webgpuPeCut, ['device', 'host'] as const, 'WebGPU PE cut setting')[0] } : {}),
    suites: typeof o.suites === 'string' ? list(o.suites, SUITE_NAMES, 'suite') : base.suites,
    latency: {
      ...base.latency,
      sizes: sizes(o.sizes) ?? base.latency.sizes,
      referenceSizes: sizes(o.referenceSizes) ?? base.latency.referenceSizes,
      shape: shp(o.shape) ?? base.latency.shape,
      referenceShape: shp(o.referenceShape) ?? base.latency.referenceShape,
      presets: presetList ?? base.latency.presets,
      gpuPresets: presetList ?? base.latency.gpuPresets,
      ...(typeof o.peers === 'string' ? { peers: o.peers === 'none' ? [] : list(o.peers, PEER_NAMES, 'peer') } : {}),
      reps: num(o.reps, 'reps', 3) ?? base.latency.reps,
      warmup: num(o.warmup, 'warmup', 1) ?? base.latency.warmup,
      jitWarmup: num(o.jitWarmup, 'jit-warmup', 0) ?? base.latency.jitWarmup,
      budgetMs: budget !== undefined ? budget * 1000 : base.latency.budgetMs,
      maxHostValues: num(o.maxHostValues, 'max-host-values', 1) ?? base.latency.maxHostValues,
      inputs: typeof o.latencyInputs === 'string' ? list(o.latencyInputs, ['auto', 'fill', 'synth'] as const, 'input kind')[0] : base.latency.inputs,
      ...(o.synthThreads !== undefined ? { synthThreads: num(o.synthThreads, 'synth-threads', 1) } : {}),
      freshInputs: o.freshInputs === true || base.latency.freshInputs,
      hostTimings: o.hostTimings === true || base.latency.hostTimings,
      kernelTimes: o.kernelTimes === true || base.latency.kernelTimes,
    },
    tfjs: { ...base.tfjs, sizes: sizes(o.tfjsSizes) ?? base.tfjs.sizes },
    varlen: {
      batch: integer(o.varlenBatch, 'varlen-batch', 1) ?? base.varlen.batch,
      seed: integer(o.varlenSeed, 'varlen-seed', 0) ?? base.varlen.seed,
      range: typeof o.varlenRange === 'string' ? parseRange(o.varlenRange) : base.varlen.range,
      chunkedN,
      chunks,
      policy: typeof o.varlenPolicy === 'string' ? list(o.varlenPolicy, VARLEN_POLICIES, 'varlen policy')[0] : base.varlen.policy,
    },
    parity: {
      ...base.parity,
      sizes: sizes(o.paritySizes) ?? base.parity.sizes,
      profiles: typeof o.parityProfiles === 'string' ? list(o.parityProfiles, ALL_PROFILE_NAMES, 'profile') : base.parity.profiles,
      seeds: typeof o.paritySeeds === 'string' ? seedList(o.paritySeeds) : base.parity.seeds,
      shape: shp(o.parityShape) ?? base.parity.shape,
      rows: integer(o.parityRows, 'parity-rows', 1) ?? base.parity.rows,
      reps: num(o.reps, 'reps', 3) ?? base.parity.reps,
      warmup: num(o.warmup, 'warmup', 1) ?? base.parity.warmup,
      ...(typeof o.flexprefillDir === 'string' ? { flexprefillDir: resolve(o.flexprefillDir) } : {}),
      presets: typeof o.parityPresets === 'string' ? (o.parityPresets === 'none' ? [] : list(o.parityPresets, PARITY_PRESETS, 'parity preset')) : base.parity.presets,
    },
    parallel: {
      ...base.parallel,
      sizes: sizes(o.parallelSizes) ?? base.parallel.sizes,
      referenceSizes: sizes(o.parallelSizes) ?? base.parallel.referenceSizes,
      ranks: typeof o.parallelRanks === 'string' ? rankList(o.parallelRanks) : base.parallel.ranks,
      shape: shp(o.parallelShape) ?? base.parallel.shape,
      presets: presetList ?? base.parallel.presets,
    },
    accuracy: {
      ...base.accuracy,
      sizes: sizes(o.accSizes) ?? base.accuracy.sizes,
      shape: accShape ?? base.accuracy.shape,
      ...(typeof o.accProfiles === 'string'
        ? { profiles: list(o.accProfiles, ALL_PROFILE_NAMES, 'profile'), gpuProfiles: list(o.accProfiles, ALL_PROFILE_NAMES, 'profile') }
        : {}),
      rows: num(o.accRows, 'acc-rows', 1) ?? base.accuracy.rows,
      flexGammas: typeof o.accFlexGammas === 'string' ? gammaList(o.accFlexGammas) : base.accuracy.flexGammas,
      guardAlphas: typeof o.accGuardAlphas === 'string' ? alphaList(o.accGuardAlphas) : base.accuracy.guardAlphas,
    },
    onCurve: {
      ...base.onCurve,
      syntheticSizes: sizes(o.curveSizes) ?? base.onCurve.syntheticSizes,
      proxySizes: sizes(o.proxySizes) ?? base.onCurve.proxySizes,
    },
    floors: {
      ...base.floors,
      n: typeof o.floorsN === 'string' ? oneSize(o.floorsN, 'floors-n') : base.floors.n,
      shape: accShape ?? base.floors.shape,
      rows: num(o.accRows, 'acc-rows', 1) ?? base.floors.rows,
    },
  };
}

/** "1,2": non-negative integer seeds. */
function seedList(text: string): number[] {
  const out = text.split(',').map((x) => x.trim()).filter(Boolean).map(Number);
  if (out.length === 0 || out.some((x) => !Number.isInteger(x) || x < 0)) throw new Error(`bad seed list '${text}': use comma-separated integers >= 0 (e.g. 1,2)`);
  return out;
}

/** "2,4,8": rank counts, integers >= 2. */
function rankList(text: string): number[] {
  const out = text.split(',').map((x) => x.trim()).filter(Boolean).map(Number);
  if (out.length === 0 || out.some((x) => !Number.isInteger(x) || x < 2)) throw new Error(`bad rank list '${text}': use comma-separated integers >= 2 (e.g. 2,4,8)`);
  return out;
}

/**
 * A swept parameter's values ("0.99,0.995", or 'none' for none): each must pass `ok`; sorted,
 * without repeats. `what` names the list and the values it takes in the error.
 */
function sweepList(text: string, name: string, ok: (x: number) => boolean, what: string): number[] {
  if (text.trim() === 'none') return [];
  const out = text.split(',').map((x) => x.trim()).filter(Boolean).map(Number);
  if (out.length === 0 || out.some((x) => !ok(x))) throw new Error(`bad ${name} list '${text}': use comma-separated ${what}, or 'none'`);
  return [...new Set(out)].sort((a, b) => a - b);
}

const gammaList = (text: string): number[] => sweepList(text, 'γ', (x) => x > 0 && x < 1, 'numbers in (0, 1) (e.g. 0.99,0.995)');
const alphaList = (text: string): number[] => sweepList(text, 'α', (x) => Number.isFinite(x) && x > 0, 'numbers > 0 (e.g. 1.5,2)');

/** One size: 8192 or 8k. */
function oneSize(text: string, what: string): number {
  const sizes = parseSizes(text);
  if (sizes.length !== 1) throw new Error(`--${what} takes one size (8192 or 8k); got '${text}'`);
  return sizes[0];
}

const want = (c: BenchConfig, s: SuiteName) => c.suites.includes(s);

/** Run the bench; returns the process exit code. */
export async function main(argv: readonly string[], opts: MainOptions = {}): Promise<number> {
  const cmd = program();
  try {
    cmd.parse(argv as string[]);
  } catch (e) {
    // --help and --version exit 0; every usage error (an unknown option, a missing value) is 2,
    // like the errors of the option values below
    const code = (e as { exitCode?: number }).exitCode;
    return code === 0 ? 0 : 2;
  }
  const o = cmd.opts<Record<string, string | boolean | undefined>>();
  let config: BenchConfig;
  try {
    config = resolveConfig(o);
  } catch (e) {
    process.stderr.write(`crisp-bench: ${message(e)}\n`);
    return 2;
  }
  const log = o.quiet ? () => {} : (opts.log ?? ((line: string) => process.stderr.write(`${line}\n`)));
  const repoRoot = findRepoRoot();
  const command = `node apps/bench/dist/crisp-bench.mjs ${argv.slice(2).join(' ')}`.trim();
  const deadlineS = o.deadlineS === undefined ? undefined : Number(o.deadlineS);
  if (deadlineS !== undefined && !(deadlineS > 0)) {
    process.stderr.write(`crisp-bench: --deadline-s must be a number > 0; got ${String(o.deadlineS)}\n`);
    return 2;
  }
  const t0 = performance.now();
  const ctx: SuiteContext = {
    config,
    repoRoot,
    command,
    log,
    timeLeftMs: deadlineS === undefined ? undefined : () => deadlineS * 1000 - (performance.now() - t0),
  };
  const machine = machineInfo(repoRoot, {});
  const outDir = resolve(typeof o.out === 'string' ? o.out : join(repoRoot ?? process.cwd(), repoRoot ? 'apps/bench/results' : 'bench-results', machine.slug));
  const fold = typeof o.fold === 'string' ? o.fold.split(',').map((x) => x.trim()).filter((x) => x !== '') : [];
  if (o.renderOnly) return renderOnly(outDir, typeof o.linkBase === 'string' ? o.linkBase : resultsLink(repoRoot, outDir), fold, log);
  let names: BackendName[];
  try {
    names = typeof o.backends === 'string' ? list(o.backends, BACKEND_NAMES, 'backend') : [...BACKEND_NAMES];
  } catch (e) {
    process.stderr.write(`crisp-bench: ${message(e)}\n`);
    return 2;
  }
  // A lost GPU promise must not let Node exit early with half a report: keep the loop alive
  // (every return from here on is inside the try that clears it).
  const keepAlive = setInterval(() => {}, 1 << 30);
  const started = t0;
  const opened: OpenBackend[] = [];
  try {
    for (const name of names) {
      const ob = await openBackend(name, repoRoot, {
        cudaSchedule: config.cudaSchedule,
        ...(config.cudaProxyLayout ? { proxyLayout: config.cudaProxyLayout } : {}),
        ...(config.cudaPdl === undefined ? {} : { programmaticLaunch: config.cudaPdl }),
        ...(config.cudaFlexOnDevice === undefined ? {} : { flexPrefillOnDevice: config.cudaFlexOnDevice }),
        ...(config.cudaGuardOnDevice === undefined ? {} : { peVsExcessOnDevice: config.cudaGuardOnDevice }),
        ...(config.cudaAttention ? { attentionVariant: config.cudaAttention } : {}),
        ...(config.webgpuKernel ? { webgpuKernel: config.webgpuKernel } : {}),
        ...(config.webgpuPeCut ? { webgpuPeCut: config.webgpuPeCut } : {}),
      });
      log(ob.backend ? `backend ${name}: ${ob.device ?? 'available'}` : `backend ${name}: unavailable (${ob.reason})`);
      opened.push(ob);
    }
    mkdirSync(outDir, { recursive: true });
    const previousFile = join(outDir, 'bench.json');
    // Read once, before the first checkpoint overwrites it: every write merges into this.
    let previous = o.merge && existsSync(previousFile) ? readResult(previousFile) : undefined;
    if (o.merge) log(previous ? `merging into ${previousFile}` : `--merge: no ${previousFile} yet; starting it`);
    try {
      previous = foldResults(previous, fold, log);
    } catch (e) {
      process.stderr.write(`crisp-bench: ${message(e)}\n`);
      return 2;
    }
    const ran = opened.filter((b) => b.backend).map((b) => b.name);
    const result: BenchResult = {
      schema: 'crisp-bench/1',
      command,
      cwd: process.cwd(),
      startedAt: new Date().toISOString(),
      machine,
      config,
      backends: opened.map((b) => ({ name: b.name, available: Boolean(b.backend), reason: b.reason, device: b.device, shippedCrossover: b.shippedCrossover })),
      suites: {},
    };
    if (opened.every((b) => !b.backend)) {
      process.stderr.write('crisp-bench: no backend is available here\n');
      return 1;
    }
    const linkBase = typeof o.linkBase === 'string' ? o.linkBase : resultsLink(repoRoot, outDir);
    /** Write what this run has so far (merged into the earlier file with --merge); figures only when asked. */
    const checkpoint = async (withFigures: boolean): Promise<BenchResult> => {
      result.durationS = Math.round((performance.now() - started) / 100) / 10;
      const merged = previous ? mergeResults(previous, result, ran) : stampRuns(result);
      if (withFigures) {
        const figs = await figures(merged);
        for (const fig of figs) writeAtomic(join(outDir, fig.file), fig.svg);
        merged.figures = figs.map((x) => x.file);
      } else if (previous?.figures || result.figures) {
        merged.figures = result.figures ?? previous?.figures;
      }
      result.figures = merged.figures;
      writeAtomic(join(outDir, 'bench.json'), `${JSON.stringify(merged, null, 1)}\n`);
      writeAtomic(join(outDir, 'bench.md'), markdown(merged));
      writeAtomic(join(outDir, 'headline.md'), headline(merged, linkBase));
      return merged;
    };
    ctx.progress = (suite, partial) => {
      if (suite === 'latency') {
        const lat = partial as Omit<NonNullable<BenchResult['suites']['latency']>, 'peers'>;
        result.suites.latency = { ...lat, peers: result.suites.latency?.peers ?? { rows: [], notes: [] } };
        if (want(config, 'crossover')) result.suites.crossover = crossoverSuite(lat.rows, new Map(opened.map((b) => [b.name, b.shippedCrossover])));
      } else {
        (result.suites as Record<string, unknown>)[suite] = partial;
      }
      void checkpoint(false).catch((e) => log(`checkpoint failed: ${message(e)}`));
    };
    const phase = async (suite: string) => {
      result.inProgress = suite;
      log(`suite ${suite}`);
      await checkpoint(false);
    };
    if (want(config, 'latency') || want(config, 'crossover')) {
      await phase('latency');
      const lat = await latencySuite(ctx, opened);
      ctx.progress('latency', lat);
      const measured = new Map<string, number[]>();
      for (const r of lat.rows) if (r.preset === 'dense') measured.set(r.backend, [...(measured.get(r.backend) ?? []), r.n]);
      const peers = await densePeers(ctx, opened, measured, resolvePeerScript(repoRoot, typeof o.peerScript === 'string' ? o.peerScript : undefined));
      result.suites.latency = { ...lat, peers };
      if (want(config, 'crossover')) {
        result.suites.crossover = crossoverSuite(lat.rows, new Map(opened.map((b) => [b.name, b.shippedCrossover])));
        for (const g of result.suites.crossover.gates) {
          log(`crossover ${g.backend}: ${g.gate === null ? `none measured (${g.note})` : `length gate ${g.gate} keys`}${g.shipped !== undefined ? ` (ships ${g.shipped})` : ''}`);
        }
      }
      await checkpoint(true);
    }
    if (want(config, 'accuracy')) {
      await phase('accuracy');
      result.suites.accuracy = await accuracySuite(ctx, opened);
      await checkpoint(true);
    }
    if (want(config, 'onCurve')) {
      await phase('onCurve');
      result.suites.onCurve = await onCurveSuite(ctx, opened);
      await checkpoint(true);
    }
    if (want(config, 'floors')) {
      await phase('floors');
      result.suites.floors = await floorsSuite(ctx, opened);
    }
    if (want(config, 'tfjs')) {
      await phase('tfjs');
      result.suites.tfjs = { ...(await tfjsSuite(ctx)), run: result.startedAt };
    }
    if (want(config, 'varlen')) {
      await phase('varlen');
      result.suites.varlen = { ...(await varlenSuite(ctx, opened, resolvePeerScript(repoRoot, typeof o.peerScript === 'string' ? o.peerScript : undefined))), run: result.startedAt };
    }
    if (want(config, 'parity')) {
      await phase('parity');
      result.suites.parity = { ...(await paritySuite(ctx, opened, resolveFlexPrefillPeer(repoRoot))), run: result.startedAt };
    }
    if (want(config, 'parallel')) {
      await phase('parallel');
      result.suites.parallel = await parallelSuite(ctx, opened);
    }
    result.inProgress = undefined;
    result.finishedAt = new Date().toISOString();
    const final = await checkpoint(true);
    if (previous) log(`merged into ${previousFile} (this run's backends: ${ran.join(', ')})`);
    log(`wrote ${relative(process.cwd(), outDir) || '.'}/bench.json, bench.md, headline.md and ${final.figures?.length ?? 0} figures in ${result.durationS} s`);
    return 0;
  } finally {
    clearInterval(keepAlive);
    for (const b of opened) {
      try {
        b.backend?.dispose();
      } catch {
        // disposing a lost device can throw; the results are already written
      }
    }
  }
}

/** Write through a temporary file and rename: a run killed mid-write never leaves half a file. */
function writeAtomic(file: string, text: string): void {
  const tmp = `${file}.${process.pid}.tmp`;
  writeFileSync(tmp, text);
  renameSync(tmp, file);
}

/**
 * Where headline.md links to, from the repository root: the output folder itself when it
 * is inside the repository, else apps/bench/results/<its name> (results made on a machine
 * without the repository are copied there under the same folder name).
 */
export function resultsLink(repoRoot: string | undefined, outDir: string): string {
  if (repoRoot) {
    const rel = relative(repoRoot, outDir);
    if (rel && !rel.startsWith('..') && !isAbsolute(rel)) return rel.split(sep).join('/');
  }
  return `apps/bench/results/${basename(outDir)}`;
}

/**
 * --render-only: the report of an existing bench.json, re-rendered; its measurements are
 * untouched. With --fold, each file is first merged into it in order (as --merge would have:
 * a folded file's rows replace the rows with the same key), and the merged bench.json is
 * written before the report; a file that cannot be read stops it with nothing written.
 */
async function renderOnly(outDir: string, linkBase: string, fold: readonly string[], log: (line: string) => void): Promise<number> {
  const file = join(outDir, 'bench.json');
  if (!existsSync(file)) {
    process.stderr.write(`crisp-bench: --render-only: no ${file}\n`);
    return 2;
  }
  let r: BenchResult;
  try {
    r = foldResults(readResult(file), fold, log) as BenchResult;
  } catch (e) {
    process.stderr.write(`crisp-bench: --render-only: ${message(e)}\n`);
    return 2;
  }
  if (fold.length > 0) writeAtomic(file, `${JSON.stringify(r, null, 1)}\n`);
  const figs = await figures(r);
  for (const fig of figs) writeAtomic(join(outDir, fig.file), fig.svg);
  r.figures = figs.map((x) => x.file);
  writeAtomic(join(outDir, 'bench.md'), markdown(r));
  writeAtomic(join(outDir, 'headline.md'), headline(r, linkBase));
  log(`rendered ${file}: bench.md, headline.md and ${figs.length} figures`);
  return 0;
}
