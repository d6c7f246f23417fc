/**
 * The main job: one layer's prefill through a backend with a policy, against dense on the
 * same backend in the same process. Inputs are a synthetic scenario (@crisp/synth) or a
 * Q/K/V dump (@crisp/io). Reports per head: route and routing score, density, mass recall,
 * output error; overall: the same plus needle recall, routing agreement and times.
 *
 * Shape legend: q [n, H, d], k and v [n, Hkv, d], B block size, Nb = ceil(n / B).
 */
import {
  type Backend,
  type BlockRows,
  CrispError,
  isCrispError,
  type DeviceTensor,
  type DType,
  expandToRows,
  type HostTensor,
  type PrefillPlan,
  type ProxyStats,
  sparsePrefill,
  headSlice,
} from '@crisp/core';
import type { WebGpuBackend } from '@crisp/kernels-webgpu';
import { cStruct, jsDistance, jsd, routingAgreement } from '@crisp/router';
import { type GroundTruth, type HeadKind, needleRecall } from '@crisp/synth';
import { type BackendChoice, type SelectedBackend, selectBackend } from './backends.js';
import { synthThreads, synthWorkerEntry } from '@crisp/synth/node';
import { massRecallOf, relativeErrorPerHead, sampledBlockMasses, sampleRowsOf } from './check.js';
import { blockMassesOnWorkers } from './check-workers.js';
import type { CliIo } from './cli-io.js';
import { type RunEstimate, estimateLine, estimateRun } from './estimate.js';
import { type DumpLayer, type Inputs, type ScenarioFlags, loadInputs, toF32 } from './inputs.js';
import { type OutRequest, type OutWritten, writeRunOutput } from './out-tensors.js';
import type { QkvNameFlags } from './options.js';
import { type PolicyOverrides, runPolicies } from './policy.js';
import { type PassProgress, passBar } from './progress.js';
import { type Provenance, collectProvenance } from './provenance.js';

/** The backend and scenario a command runs on (shared by run, report and calibrate). */
export interface ScenarioChoice extends ScenarioFlags {
  readonly backend: BackendChoice;
}

export interface RunOptions extends ScenarioChoice {
  readonly preset: string;
  readonly overrides: PolicyOverrides;
  /** extra presets run on the same inputs (the report compares them) */
  readonly compare?: readonly string[];
  readonly qkv?: string;
  readonly layout?: string;
  /** tensor names (safetensors) or file stems (.npy directory) for q, k, v */
  readonly names?: QkvNameFlags;
  /** what '<u2' .npy arrays hold */
  readonly npyUint16?: 'bf16';
  /** query rows sampled for mass recall (default 64 on the reference, 16 on GPUs) */
  readonly sampleRows?: number;
  /** timed runs after the warm-up (default 3 on GPUs, 1 on the reference) */
  readonly repeats?: number;
  /** apply the backend's dense/sparse length gate (default true) */
  readonly gate: boolean;
  /** run the dense baseline (default true); without it there is no output error or speedup */
  readonly dense?: boolean;
  /** write the preset's output (and LSE, plan) here (--out; the path already checked) */
  readonly out?: OutRequest;
  /** one layer of a model dump (--qkv DIR), opened and checked by layers.ts */
  readonly dumpLayer?: DumpLayer;
}

export interface HeadResult {
  readonly head: number;
  readonly kind?: HeadKind;
  readonly route: 'vs' | 'pe' | 'dense';
  /** the router's score (C_struct or JSD distance); null for dense plans */
  readonly score: number | null;
  readonly density: number;
  readonly massRecall: number;
  /**
   * the plan's own per-head check (PrefillPlan.proxyRecall): the proxy rows' mass inside the
   * blocks kept for the last query block, with no dense attention; null for dense plans
   */
  readonly proxyRecall: number | null;
  /** ‖O_sparse − O_dense‖ / ‖O_dense‖; null when the dense baseline was skipped (--no-dense) */
  readonly outputError: number | null;
}

export interface PolicyResult {
  readonly policy: string;
  readonly denseReason?: string;
  /** why a backend with a device planner made this plan on the host (PrefillPlan.hostReason) */
  readonly hostReason?: string;
  readonly scoreName?: string;
  readonly threshold?: number;
  readonly heads: readonly HeadResult[];
  readonly density: number;
  readonly massRecall: number;
  /** null when the dense baseline was skipped */
  readonly outputError: number | null;
  readonly needleRecall?: { readonly recall: number; readonly visibleRecall: number; readonly recalled: number; readonly total: number };
  /** C_struct vs JSD decisions on this plan's proxy statistics */
  readonly routingAgreement?: number;
  readonly timeMs: { readonly median: number; readonly runs: readonly number[]; readonly planMs: number };
  /** dense median / this median; null when the dense baseline was skipped */
  readonly speedup: number | null;
  /** selected key blocks per (head, query block), for the report's heatmaps */
  readonly rows?: BlockRows;
}

export interface RunSummary {
  readonly backend: string;
  /**
   * the kernels a WebGPU backend ran for this dtype and head dim: the attention kernel and the
   * proxy statistics' score tiles ('subgroup-matrix' or 'fma'); absent elsewhere
   */
  readonly kernels?: { readonly attention: string; readonly statistics: string };
  readonly backendNotes: readonly string[];
  readonly input: {
    readonly source: string;
    readonly profile?: string;
    readonly seed?: number;
    readonly n: number;
    readonly heads: number;
    readonly kvHeads: number;
    readonly headDim: number;
    readonly dtype: DType;
  };
  readonly blockSize: number;
  readonly numBlocks: number;
  readonly sampleRows: number;
  /** the dense baseline; null when it was skipped (--no-dense) */
  readonly dense: { readonly timeMs: { readonly median: number; readonly runs: readonly number[] } } | null;
  readonly policies: readonly PolicyResult[];
  /** proxy statistics of the first sparse plan (for reports): per head p_v, C_struct, JSD */
  readonly proxy?: {
    readonly verticalBlocks: readonly (readonly number[])[];
    readonly cStruct: readonly number[];
    readonly jsd: readonly number[];
  };
  readonly truth?: Pick<GroundTruth, 'heads' | 'needles'> & Partial<Pick<GroundTruth, 'stripes'>>;
  /** when, from which commit, with which versions, on which machine (absent in older run JSON) */
  readonly provenance?: Provenance;
  /**
   * Where the wall time went, ms. backend: selecting and starting it; generate: making the
   * scenario on `threads` host threads (null for a dump); upload: writing it (or reading and
   * writing a dump) onto the backend; estimate: the reference backend's calibration; dense:
   * every dense pass (warm-up included; null under --no-dense); prefill: every plan+prefill
   * pass of every policy (warm-up included); check: exact rows, downloads and output error;
   * wall: the whole job. The rest of wall is bookkeeping between phases.
   */
  readonly phasesMs: {
    readonly backend: number;
    readonly generate: number | null;
    readonly upload: number;
    readonly estimate: number | null;
    readonly dense: number | null;
    readonly prefill: number;
    readonly check: number;
    readonly wall: number;
  };
  /** host threads that generated the scenario */
  readonly threads: number;
  /** host threads that computed the exact rows */
  readonly checkThreads: number;
  /** the estimate printed before the work (reference backend only) */
  readonly estimate?: RunEstimate;
  /** what --out wrote, and how long it took */
  readonly out?: OutWritten & { readonly ms: number };
}

function median(xs: readonly number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  const m = Math.floor(s.length / 2);
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
}

async function timed<T extends { output: DeviceTensor; lse?: DeviceTensor }>(
  backend: Backend,
  warm: boolean,
  repeats: number,
  once: () => Promise<T>,
): Promise<{ last: T; runs: number[] }> {
  if (warm) {
    const w = await once();
    await backend.synchronize();
    w.output.dispose();
    w.lse?.dispose();
  }
  const runs: number[] = [];
  let last: T | undefined;
  for (let r = 0; r < repeats; r++) {
    if (last) {
      last.output.dispose();
      last.lse?.dispose();
    }
    await backend.synchronize();
    const t0 = performance.now();
    last = await once();
    await backend.synchronize();
    runs.push(performance.now() - t0);
  }
  return { last: last!, runs };
}

/** Exact rows of this many multiply-adds or more go to worker threads by default (about a second on one). */
const PARALLEL_CHECK_MACS = 5e8;

/**
 * The sampled rows' block masses: on worker threads (the process's entry) when there are
 * threads to spare and enough work, or when --threads asks; else on this thread.
 */
async function exactRows(
  inp: Inputs,
  k: Float32Array,
  sample: number[],
  B: number,
  threadsFlag: number | undefined,
  io: CliIo,
): Promise<{ masses: Float64Array[]; threads: number }> {
  const threads = Math.min(threadsFlag ?? synthThreads(), sample.length);
  const entry = synthWorkerEntry();
  const work = sample.reduce((s, i) => s + i + 1, 0) * inp.H * inp.d;
  if (entry && threads > 1 && (threadsFlag !== undefined || work >= PARALLEL_CHECK_MACS)) {
    const q: Float32Array[] = [];
    for (const i of sample) q.push(await inp.qRow(i));
    try {
      const dims = { n: inp.n, H: inp.H, Hkv: inp.Hkv, d: inp.d, B };
      return { masses: await blockMassesOnWorkers(k, q, sample, dims, { threads, workerUrl: entry }), threads };
    } catch (e) {
      io.stderr.write(`note: worker threads failed (${e instanceof Error ? e.message : String(e)}); computing the exact rows on one thread\n`);
    }
  }
  return { masses: await sampledBlockMasses(inp, k, sample, B, io), threads: 1 };
}

/** Runs `f` with the backend's in-pass progress (if any) moving pass `index` of the bar. */
async function withPassProgress<T>(sel: SelectedBackend, bar: PassProgress, index: number, f: () => Promise<T>): Promise<T> {
  const sink = sel.attentionProgress;
  if (sink) sink.listener = (done, total) => bar.at(index, total > 0 ? done / total : 1);
  try {
    return await f();
  } finally {
    if (sink) sink.listener = undefined;
    bar.at(index + 1, 0);
  }
}

/**
 * Runs one layer. With `shared` (a model's layers, one after another) the backend is that
 * one, already started, and stays alive afterwards; otherwise it is selected here and
 * disposed at the end.
 */
export async function runJob(o: RunOptions, io: CliIo, shared?: SelectedBackend): Promise<RunSummary> {
  const wall0 = performance.now();
  const policies = runPolicies(o.preset, o.overrides, o.compare ?? []);
  const sel = shared ?? (await selectBackend(o.backend));
  const backendMs = performance.now() - wall0;
  const backend = sel.backend;
  const release = () => {
    if (!shared) backend.dispose();
  };
  if (!shared) for (const note of sel.notes) io.stderr.write(`note: ${note}\n`);
  const gpu = sel.name !== 'reference';
  const repeats = o.repeats ?? (gpu ? 3 : 1);
  const sampleCount = o.sampleRows ?? (gpu ? 16 : 64);
  let inp: Inputs;
  try {
    inp = await loadInputs(
      sel,
      { ...o, blockSize: o.overrides.blockSize ?? 128, sampleRows: sampleCount, policies: policies.length },
      io,
    );
  } catch (e) {
    release();
    throw e;
  }
  const disposeAll: DeviceTensor[] = [inp.q, inp.k, inp.v];
  try {
    const { n, H, d } = inp;
    const B = o.overrides.blockSize ?? 128;
    const Nb = Math.ceil(n / B);
    const inputs = { q: inp.q, k: inp.k, v: inp.v };

    const passes = repeats + (gpu ? 1 : 0);
    const sample = sampleRowsOf(n, sampleCount);
    let checkMs = 0;
    let c0 = performance.now();
    const kF32 = toF32(await backend.download(inp.k));
    checkMs += performance.now() - c0;

    let estimate: RunEstimate | undefined;
    if (sel.name === 'reference') {
      estimate = await estimateRun({ backend, inp, policies, passes, dense: o.dense !== false, sample, blockSize: B, gate: o.gate });
      io.stderr.write(estimateLine(estimate, passes));
    }

    let dense: RunSummary['dense'] = null;
    let denseOut: HostTensor | undefined;
    let denseMs: number | null = null;
    if (o.dense !== false) {
      const d0 = performance.now();
      const denseBar = passBar(io.stderr, 'dense baseline', passes);
      let denseDone = 0;
      const runs = await timed(backend, gpu, repeats, () => withPassProgress(sel, denseBar, denseDone++, () => backend.denseAttention(inp.q, inp.k, inp.v)));
      denseBar.stop();
      denseMs = performance.now() - d0;
      c0 = performance.now();
      denseOut = await backend.download(runs.last.output);
      runs.last.output.dispose();
      checkMs += performance.now() - c0;
      dense = { timeMs: { median: median(runs.runs), runs: runs.runs } };
    }

    c0 = performance.now();
    const { masses, threads: checkThreads } = await exactRows(inp, kF32, sample, B, o.threads, io);
    checkMs += performance.now() - c0;
    let prefillMs = 0;

    const results: PolicyResult[] = [];
    let proxy: RunSummary['proxy'];
    let written: RunSummary['out'];
    for (const policy of policies) {
      // --out takes the run's preset (the first policy); --out-lse asks its runs for the LSE
      const outReq = results.length === 0 ? o.out : undefined;
      const p0 = performance.now();
      const bar = passBar(io.stderr, `${policy.name}`, passes);
      let done = 0;
      const sp = await timed(backend, gpu, repeats, () =>
        withPassProgress(sel, bar, done++, () =>
          sparsePrefill(backend, inputs, policy, { minSparseLength: o.gate ? undefined : 0, ...(outReq?.lse ? { returnLse: true } : {}) }),
        ),
      );
      bar.stop();
      prefillMs += performance.now() - p0;
      const plan: PrefillPlan = sp.last.plan;
      if (outReq) {
        const w0 = performance.now();
        try {
          const w = await writeRunOutput(backend, outReq, sp.last, { source: inp.source, layer: o.dumpLayer?.layer });
          written = { ...w, ms: performance.now() - w0 };
        } catch (e) {
          sp.last.output.dispose();
          sp.last.lse?.dispose();
          throw e;
        }
      }
      c0 = performance.now();
      const out = await backend.download(sp.last.output);
      sp.last.output.dispose();
      sp.last.lse?.dispose();
      const rows = plan.mask ? expandToRows(plan.mask) : undefined;
      const recall = massRecallOf(rows, masses, sample, H, Nb, B);
      const err = denseOut ? relativeErrorPerHead(out, denseOut, H, d) : undefined;
      checkMs += performance.now() - c0;
      const stats: ProxyStats | undefined = plan.stats;
      if (stats && !proxy) proxy = proxyView(stats);
      const heads: HeadResult[] = [];
      for (let h = 0; h < H; h++) {
        heads.push({
          head: h,
          kind: inp.scenario?.truth.heads[h].kind,
          route: plan.routing ? plan.routing.routes[h] : 'dense',
          score: plan.routing ? plan.routing.scores[h] : null,
          density: plan.density[h],
          massRecall: recall[h],
          proxyRecall: plan.proxyRecall ? plan.proxyRecall[h] : null,
          outputError: err ? err.perHead[h] : null,
        });
      }
      const nr = inp.scenario ? needleRecall(plan, inp.scenario.truth) : undefined;
      let agreement: number | undefined;
      if (stats) agreement = routingAgreement(cStruct({ tauProxy: o.overrides.tauProxy ?? 0.2 }).route(stats), jsd({ tau: 0.1 }).route(stats));
      const med = median(sp.runs);
      results.push({
        policy: policy.name,
        denseReason: plan.denseReason,
        ...(plan.hostReason ? { hostReason: plan.hostReason } : {}),
        scoreName: plan.routing?.scoreName,
        threshold: plan.routing?.threshold,
        heads,
        density: plan.overallDensity,
        massRecall: recall.reduce((s, x) => s + x, 0) / H,
        outputError: err ? err.overall : null,
        needleRecall: nr && { recall: nr.recall, visibleRecall: nr.visibleRecall, recalled: nr.recalled, total: nr.total },
        routingAgreement: agreement,
        timeMs: { median: med, runs: sp.runs, planMs: plan.planMs },
        speedup: dense ? dense.timeMs.median / med : null,
        rows,
      });
    }
    const wk = backend as Partial<Pick<WebGpuBackend, 'attentionKernelFor' | 'statisticsKernelFor'>>;
    const kernelDtype = inp.dtype === 'f16' ? 'f16' : 'f32';
    const kernels =
      sel.name === 'webgpu' && wk.attentionKernelFor && wk.statisticsKernelFor
        ? { attention: wk.attentionKernelFor(kernelDtype, d), statistics: wk.statisticsKernelFor(kernelDtype, d) }
        : undefined;
    return {
      backend: sel.name,
      ...(kernels ? { kernels } : {}),
      backendNotes: sel.notes,
      input: {
        source: inp.source,
        profile: inp.scenario?.profile,
        seed: inp.scenario?.seed,
        n,
        heads: H,
        kvHeads: inp.Hkv,
        headDim: d,
        dtype: inp.dtype,
      },
      blockSize: B,
      numBlocks: Nb,
      sampleRows: sample.length,
      dense,
      policies: results,
      proxy,
      truth: inp.scenario ? { heads: inp.scenario.truth.heads, needles: inp.scenario.truth.needles, stripes: inp.scenario.truth.stripes } : undefined,
      provenance: collectProvenance(o.preset, o.overrides),
      phasesMs: {
        backend: backendMs,
        generate: inp.timing.generateMs,
        upload: inp.timing.uploadMs,
        estimate: estimate ? estimate.calibrationMs : null,
        dense: denseMs,
        prefill: prefillMs,
        check: checkMs,
        wall: performance.now() - wall0,
      },
      threads: inp.timing.threads,
      checkThreads,
      estimate,
      out: written,
    };
  } catch (e) {
    throw overflowHint(e, inp);
  } finally {
    for (const t of disposeAll) t.dispose();
    await inp.close();
    release();
  }
}

/** An Infinity that --dtype f16 made (values beyond ±65504) is the flag's doing, not the file's. */
function overflowHint(e: unknown, inp: Inputs): unknown {
  if (!isCrispError(e, 'NON_FINITE') || inp.dtype !== 'f16' || !inp.convertedFrom || !/Infinity/.test(e.message)) return e;
  return new CrispError(
    'NON_FINITE',
    `${e.message} (${inp.source} holds ${inp.convertedFrom} values and --dtype f16 turns those beyond ±65504 into Infinity: pass --dtype bf16 or f32)`,
    e.details,
  );
}

function proxyView(stats: ProxyStats): NonNullable<RunSummary['proxy']> {
  const { heads: H, numBlocks: Nb } = stats;
  const verticalBlocks: number[][] = [];
  const js: number[] = [];
  for (let h = 0; h < H; h++) {
    const pv = headSlice(stats.verticalBlocks, h, Nb);
    verticalBlocks.push(Array.from(pv));
    js.push(jsDistance(headSlice(stats.pooledEstimate, h, Nb), pv));
  }
  return { verticalBlocks, cStruct: Array.from(stats.cStruct), jsd: js };
}
