/**
 * Latency against n: one layer's attention per preset (dense, crisp, crispFast,
 * flexPrefill) from Q/K/V on the device to the output on the device, routing and selection
 * included (sparsePrefill, synchronised). The length gate is switched off
 * (minSparseLength 0) so the sparse presets always take the sparse path: this suite is
 * what measures where that path starts to pay. Median of `reps` runs after `warmup`.
 */
import { PerformanceObserver } from 'node:perf_hooks';
import { type Backend, type DeviceTensor, type DType, type PlanPhases, type Policy, type PrefillInputs, numBlocks, planPrefill, releasePlan, runPlan, sparsePrefill } from '@crisp/core';
import type { GpuKernelTime, WebGpuBackend } from '@crisp/kernels-webgpu';
import { crisp, crispFast, crispGuarded, dense, flexPrefill } from '@crisp/presets';
import type { OpenBackend } from '../backends.js';
import { latencyDtype, type Shape } from '../config.js';
import { deadlineReason, type SuiteContext, message, timeLeft, withTimeout } from '../context.js';
import { inputsProgress, latencyInputs, SkipError } from '../inputs.js';
import { type Spread, spread } from '../stats.js';

/** Time a run with --deadline-s keeps for the dense peers (TF.js, PyTorch SDPA) after the GPU latency sizes. */
export const PEER_RESERVE_MS = 20_000;

export const LATENCY_PRESETS: readonly Policy[] = [dense, crisp, crispFast, crispGuarded, flexPrefill];

export interface LatencyRow {
  readonly backend: string;
  readonly preset: string;
  readonly n: number;
  readonly dtype: string;
  readonly shape: Shape;
  /** total ms (plan + attention): median, min, max over the timed runs */
  readonly ms: Spread;
  /** proxy statistics + routing + selection (median) */
  readonly planMs: number;
  /** planMs split by phase (median ms each), when @crisp/core reports the split */
  readonly planPhases?: Record<string, number>;
  /**
   * Each timed run's planMs and its phases, in run order (ms, 3 decimals): whether a median
   * sits in one mode of a bimodal plan or between two, and which phase moves
   */
  readonly planRuns?: {
    readonly planMs: number[];
    /** each timed run's total and attention (ms): whether a slow plan comes with a slow run (the GPU's clock) or alone */
    readonly totalMs?: number[];
    readonly attentionMs?: number[];
    readonly phases?: Record<string, number[]>;
    /** the garbage collector's pauses that began inside each run (ms; node:perf_hooks 'gc' entries) */
    readonly gcMs?: number[];
  };
  /** the attention call alone (median; sparse kernel + mask expansion, or dense) */
  readonly attentionMs?: number;
  /**
   * 'serial': planMs and attentionMs (and the plan's phases) come from separate runs that
   * waited for the device after the plan and after the attention (medians). A backend without
   * device marks (WebGPU) queues its plan's device work without waiting for it, so the timed
   * runs' own split holds only the plan's host part and counts the rest as attention; `ms`
   * stays the timed runs' total, and planRuns their own split.
   */
  readonly planSplit?: 'serial';
  readonly density: number;
  readonly denseReason?: string;
  readonly input: string;
  /** q, k and v were marked rewritten before every run (--fresh-inputs) */
  readonly freshInputs?: true;
  /** plan and attention times from the host clock (--host-timings) */
  readonly hostTimings?: true;
  /** the run (its startedAt) that measured this row; set when results are merged */
  readonly run?: string;
  /** --kernel-times: one more (untimed) run with every kernel timed on the GPU */
  readonly kernelTimes?: KernelTimes;
}

/** GPU time per program of one sparsePrefill (a backend's `profile`: timestamp queries). */
export interface KernelTimes {
  /** every kernel's GPU time summed, and the first kernel's start to the last one's end (ms) */
  readonly busyMs: number;
  readonly spanMs: number;
  readonly passes: number;
  /** per program, the longest first */
  readonly kernels: readonly GpuKernelTime[];
  /**
   * the launches were timed one at a time, each waited for (CUDA's events): busy is exact per
   * kernel, the span is that run's wall time (nothing overlapped) and says nothing of the
   * timed runs' overlap
   */
  readonly serialized?: true;
  /** why there are none (the backend cannot time its kernels, or the profiled run failed) */
  readonly error?: string;
}

/** A backend that times its kernels on the GPU (WebGpuBackend.profile). */
type Profiling = Pick<WebGpuBackend, 'profile'>;
const profiles = (b: Backend): b is Backend & Profiling => typeof (b as Partial<Profiling>).profile === 'function';
/** A backend that times each launch by events, waiting for it (CudaBackend.startProfile). */
interface LaunchProfiling {
  startProfile(): void;
  stopProfile(): { kernel: string; calls: number; ms: number }[];
}
const profilesLaunches = (b: Backend): b is Backend & LaunchProfiling =>
  typeof (b as Partial<LaunchProfiling>).startProfile === 'function' && typeof (b as Partial<LaunchProfiling>).stopProfile === 'function';

/** One more run of `policy`, its kernels timed on the GPU; an error is reported, not thrown. */
export async function kernelTimesOf(b: Backend, inputs: PrefillInputs, out: DeviceTensor, policy: Policy, ms: number): Promise<KernelTimes> {
  const none = (error: string): KernelTimes => ({ busyMs: 0, spanMs: 0, passes: 0, kernels: [], error });
  const run = () => sparsePrefill(b, inputs, policy, { minSparseLength: 0, out });
  const what = `${b.name} ${policy.name} (kernel times)`;
  try {
    if (profiles(b)) {
      const { profile } = await withTimeout(b.profile(run), ms, what);
      return { busyMs: profile.totalMs, spanMs: profile.spanMs, passes: profile.passes, kernels: profile.kernels };
    }
    if (profilesLaunches(b)) {
      // every launch waited for in turn: the span is the run's wall time with nothing overlapped
      b.startProfile();
      const t0 = performance.now();
      let launches: { kernel: string; calls: number; ms: number }[] = [];
      try {
        await withTimeout(run(), ms, what);
      } finally {
        launches = b.stopProfile();
      }
      const kernels = launches.map((k) => ({ name: k.kernel, ms: k.ms, passes: k.calls })).sort((x, y) => y.ms - x.ms);
      const busyMs = kernels.reduce((a, k) => a + k.ms, 0);
      return { busyMs, spanMs: performance.now() - t0, passes: kernels.reduce((a, k) => a + k.passes, 0), kernels, serialized: true };
    }
    return none(`the ${b.name} backend does not time its kernels on the GPU`);
  } catch (e) {
    return none(message(e));
  }
}

/** bench.md's kernel-time table of the rows that have them. */
export function kernelTimesMarkdown(rows: readonly LatencyRow[]): string[] {
  const withTimes = rows.filter((r) => r.kernelTimes);
  if (!withTimes.length) return [];
  const out = [
    '',
    '### GPU time per kernel',
    '',
    "One more run of each preset after its timed runs, every kernel timed on the GPU: on WebGPU by timestamp queries (the backend's `profile`), span = the first kernel's start to the last one's end (host gaps included); on CUDA by events around each launch, each waited for (`startProfile`), span = that run's wall time with nothing overlapped (marked *). Busy = the kernels' GPU time summed; then the kernels, longest first, with their share of busy time and their launch (pass) count. The timed runs above had no timestamps or events.",
    '',
    '| backend | n | preset | total (timed runs) | span | busy | kernels |',
    '|---|---|---|---|---|---|---|',
  ];
  const f = (x: number) => (x >= 100 ? x.toFixed(0) : x >= 10 ? x.toFixed(1) : x.toFixed(2));
  for (const r of withTimes) {
    const t = r.kernelTimes!;
    const kernels = t.error
      ? `not timed: ${t.error}`
      : t.kernels
          .slice(0, 8)
          .map((k) => `${k.name} ${f(k.ms)} ms (${t.busyMs > 0 ? Math.round((100 * k.ms) / t.busyMs) : 0}%, ${k.passes})`)
          .join('; ') + (t.kernels.length > 8 ? `; ${t.kernels.length - 8} more` : '');
    out.push(`| ${r.backend} | ${r.n} | ${r.preset} | ${f(r.ms.median)} ms | ${t.error ? '–' : `${f(t.spanMs)} ms${t.serialized ? '*' : ''}`} | ${t.error ? '–' : `${f(t.busyMs)} ms`} | ${kernels} |`);
  }
  return out;
}

export interface LatencySkip {
  readonly backend: string;
  readonly n: number;
  readonly preset?: string;
  readonly reason: string;
}

export interface LatencyResult {
  readonly rows: LatencyRow[];
  readonly skipped: LatencySkip[];
}

/** One run's plan phases (ms each) added to their values over the runs. */
function addPhases(into: Map<string, number[]>, phases: PlanPhases | undefined): void {
  if (phases) for (const [k, v] of Object.entries(phases) as [string, number][]) into.set(k, [...(into.get(k) ?? []), v]);
}

/** Each phase's median over the runs; undefined when no run split its plan. */
function phaseMedians(phases: ReadonlyMap<string, number[]>): Record<string, number> | undefined {
  return phases.size ? Object.fromEntries([...phases].map(([k, v]) => [k, spread(v).median])) : undefined;
}

/**
 * The plan and the attention timed apart, `reps` times: planPrefill (which reads its plan
 * back) and a synchronize, then runPlan and a synchronize; medians, and the plan's phases.
 */
async function serialSplit(
  b: Backend,
  inputs: PrefillInputs,
  out: DeviceTensor,
  policy: Policy,
  reps: number,
  timeoutMs: number,
  fresh: boolean,
): Promise<{ planMs: number; attentionMs: number; planPhases?: Record<string, number> }> {
  const plan: number[] = [];
  const attention: number[] = [];
  const phases = new Map<string, number[]>();
  for (let i = 0; i < reps; i++) {
    if (fresh) for (const t of [inputs.q, inputs.k, inputs.v]) (t as { markWritten?: () => void }).markWritten?.();
    const t0 = performance.now();
    const p = await withTimeout(planPrefill(b, inputs, policy, { minSparseLength: 0 }), timeoutMs, `${b.name} ${policy.name} plan`);
    try {
      await b.synchronize();
      const t1 = performance.now();
      await withTimeout(runPlan(b, p, inputs, { out }), timeoutMs, `${b.name} ${policy.name} attention`);
      await b.synchronize();
      plan.push(t1 - t0);
      attention.push(performance.now() - t1);
      addPhases(phases, p.phases);
    } finally {
      releasePlan(p);
    }
  }
  const planPhases = phaseMedians(phases);
  return { planMs: spread(plan).median, attentionMs: spread(attention).median, ...(planPhases ? { planPhases } : {}) };
}

async function timePreset(
  b: Backend,
  inputs: { q: import('@crisp/core').DeviceTensor; k: import('@crisp/core').DeviceTensor; v: import('@crisp/core').DeviceTensor },
  out: import('@crisp/core').DeviceTensor,
  policy: Policy,
  reps: number,
  warmup: number,
  timeoutMs: number,
  fresh: boolean,
  warmMs = 0,
): Promise<{
  ms: Spread;
  planMs: number;
  planPhases?: Record<string, number>;
  planRuns: NonNullable<LatencyRow['planRuns']>;
  attentionMs: number;
  density: number;
  denseReason?: string;
}> {
  const once = (ms = timeoutMs) => {
    // a new layer's tensors: backends that check inputs once per version (CUDA) check again
    if (fresh) for (const t of [inputs.q, inputs.k, inputs.v]) (t as { markWritten?: () => void }).markWritten?.();
    return withTimeout(sparsePrefill(b, inputs, policy, { minSparseLength: 0, out }), ms, `${b.name} ${policy.name}`);
  };
  // The first run builds the pipelines: SwiftShader's shader compiles on a loaded 2-core CI
  // machine have exceeded the 60 s the timed runs get (the timeout is for lost devices).
  for (let i = 0; i < warmup; i++) await once(i === 0 ? Math.max(timeoutMs, 300_000) : timeoutMs);
  // GPU backends: warm-up runs go on until `warmMs` of them have passed. A GPU left idle while
  // the host made the size's inputs came back slow for its first few short runs (WebGPU dense
  // at 16k on an H100: 98.7, 58.1, then 20.4 ms, where the GPU rig's back-to-back median is
  // 20.1), which one warm-up run did not absorb.
  for (const t0 = performance.now(); warmMs > 0 && performance.now() - t0 < warmMs; ) await once();
  const total: number[] = [];
  const plan: number[] = [];
  const attention: number[] = [];
  let density = 1;
  let denseReason: string | undefined;
  const phases = new Map<string, number[]>();
  const windows: [number, number][] = [];
  const gc = gcPauses();
  for (let i = 0; i < reps; i++) {
    const t0 = performance.now();
    // (a failed run: the observer goes too)
    const r = await once().catch((e: unknown) => {
      void gc.stop();
      throw e;
    });
    const t1 = performance.now();
    windows.push([t0, t1]);
    total.push(t1 - t0);
    plan.push(r.timings.planMs);
    attention.push(r.timings.attentionMs);
    density = r.plan.overallDensity;
    denseReason = r.plan.denseReason;
    // Where the plan time went (statistics, selection, PE rows, mask); dense plans have none.
    addPhases(phases, r.plan.phases);
  }
  const planPhases = phaseMedians(phases);
  const ms3 = (v: number[]) => v.map((x) => Math.round(x * 1000) / 1000);
  const pauses = await gc.stop();
  const gcMs = windows.map(([a, b]) => pauses.reduce((s, p) => s + (p.start >= a && p.start < b ? p.ms : 0), 0));
  const planRuns = {
    planMs: ms3(plan),
    totalMs: ms3(total),
    attentionMs: ms3(attention),
    ...(phases.size ? { phases: Object.fromEntries([...phases].map(([k, v]) => [k, ms3(v)])) } : {}),
    ...(pauses.length ? { gcMs: ms3(gcMs) } : {}),
  };
  return { ms: spread(total), planMs: spread(plan).median, planPhases, planRuns, attentionMs: spread(attention).median, density, denseReason };
}

/**
 * The garbage collector's pauses from now until stop() (start on performance.now()'s clock,
 * duration): which timed runs a collection fell into. Node delivers the entries after a task,
 * so stop() waits one timer before it takes what is left.
 */
function gcPauses(): { stop(): Promise<{ start: number; ms: number }[]> } {
  const got: { start: number; ms: number }[] = [];
  const obs = new PerformanceObserver((l) => {
    for (const e of l.getEntries()) got.push({ start: e.startTime, ms: e.duration });
  });
  obs.observe({ entryTypes: ['gc'] });
  return {
    async stop() {
      await new Promise((r) => setTimeout(r, 20));
      for (const e of obs.takeRecords()) got.push({ start: e.startTime, ms: e.duration });
      obs.disconnect();
      return got;
    },
  };
}

/** The size of the JIT warm-up's prefills (BenchConfig.latency.jitWarmup). */
export const JIT_WARMUP_N = 8192;
/** The JIT warm-up stops here even short of its count (a slow backend: SwiftShader takes seconds a prefill). */
export const JIT_WARMUP_MAX_MS = 30_000;

/**
 * Whether the JIT warm-up runs another prefill: up to `count`, and within JIT_WARMUP_MAX_MS
 * counted from the end of the first round (one prefill of each of the `presets`): each
 * preset's first prefill compiles its kernels (NVRTC, ~40 s on a fresh GPU machine for the
 * sparse path), which must not use up the cap (counted from the start, a fresh machine's
 * headline run stopped after 2 prefills). Exported for tests.
 */
export function jitWarmupGoesOn(done: number, count: number, presets: number, msSinceFirstRound: number): boolean {
  if (done >= count || presets < 1) return false;
  return done < presets || msSinceFirstRound < JIT_WARMUP_MAX_MS;
}

/**
 * Untimed prefills at JIT_WARMUP_N, every timed preset in turn, through the same calls the
 * timed runs make (sparse plans forced, as there): the JavaScript of the plan and the launches
 * is JIT-optimised before the first timed size. A failure here is logged and the suite goes on
 * (the sizes then report their own errors).
 */
async function jitWarmup(ctx: SuiteContext, name: string, b: Backend, shape: Shape, dtype: DType): Promise<void> {
  const c = ctx.config.latency;
  const t0 = performance.now();
  let opened: SizeInputs | undefined;
  try {
    opened = await openInputs(ctx, b, JIT_WARMUP_N, shape, dtype, name);
    const { inputs, out } = opened;
    const presets = LATENCY_PRESETS.filter((p) => c.gpuPresets.includes(p.name));
    let t1 = performance.now();
    let done = 0;
    while (jitWarmupGoesOn(done, c.jitWarmup, presets.length, performance.now() - t1)) {
      const policy = presets[done % presets.length];
      // the output lands in `out`, as in the timed runs
      await withTimeout(sparsePrefill(b, inputs, policy, { minSparseLength: 0, out }), Math.max(c.budgetMs, 300_000), `${name} ${policy.name}`);
      done++;
      if (done === presets.length) t1 = performance.now();
    }
    ctx.log(
      `  latency ${name}: JIT warm-up, ${done} prefills at n=${JIT_WARMUP_N} in ${((performance.now() - t0) / 1000).toFixed(1)} s${done < c.jitWarmup ? ` (stopped at ${JIT_WARMUP_MAX_MS / 1000} s)` : ''}`,
    );
  } catch (e) {
    ctx.log(`  latency ${name}: JIT warm-up stopped (${message(e)})`);
  } finally {
    opened?.out.dispose();
    opened?.inputs.dispose();
  }
}

type SizeInputs = { inputs: Awaited<ReturnType<typeof latencyInputs>>; out: import('@crisp/core').DeviceTensor };

/** One size's q, k, v (the suite's input kind) and an output tensor; nothing is left allocated on failure. */
async function openInputs(ctx: SuiteContext, b: Backend, n: number, shape: Shape, dtype: DType, name: string): Promise<SizeInputs> {
  const c = ctx.config.latency;
  const progress = inputsProgress((m) => ctx.log(m), `  latency ${name} n=${n}`);
  const inputs = await latencyInputs(b, c.profile, n, shape, dtype, ctx.config.seed, c.maxHostValues, c.inputs, progress, c.synthThreads);
  try {
    return { inputs, out: b.allocate(dtype, [n, shape.heads, shape.headDim]) };
  } catch (e) {
    inputs.dispose();
    throw e;
  }
}

/** The backend without `mark`: sparsePrefill then times on the host clock. */
function withoutMarks(b: Backend): Backend {
  return new Proxy(b, {
    get: (t, p) => {
      if (p === 'mark') return undefined;
      const x = Reflect.get(t, p, t);
      return typeof x === 'function' ? x.bind(t) : x;
    },
  });
}

/**
 * A size's time once the backend is warm, to project the next size from: each preset's timed
 * median times the runs it made. The wall time of the first size also holds one-off costs
 * (NVRTC compiling every kernel on a fresh machine: ~50 s on the H200, which projected 16k to
 * 199 s and skipped every size above 8k); it is the fallback when no preset ran, and the cap.
 */
export function steadySizeMs(medians: readonly number[], runsEach: number, wallMs: number): number {
  if (!medians.length) return wallMs;
  return Math.min(
    wallMs,
    medians.reduce((a, m) => a + m * runsEach, 0),
  );
}

export async function latencySuite(ctx: SuiteContext, backends: readonly OpenBackend[]): Promise<LatencyResult> {
  const c = ctx.config.latency;
  const rows: LatencyRow[] = [];
  const skipped: LatencySkip[] = [];
  for (const ob of backends) {
    const b = ob.backend;
    if (!b) continue;
    const isRef = ob.name === 'reference';
    const sizes = isRef ? c.referenceSizes : c.sizes;
    const shape = isRef ? c.referenceShape : c.shape;
    const dtype = latencyDtype(ob.name);
    if (!isRef && c.jitWarmup > 0) await jitWarmup(ctx, ob.name, b, shape, dtype);
    const started = performance.now();
    let last: { n: number; ms: number; inputsMs: number } | undefined;
    let broken = false;
    for (const n of sizes) {
      const skip = (reason: string, preset?: string) => {
        skipped.push({ backend: ob.name, n, preset, reason });
        ctx.log(`  latency ${ob.name} n=${n}${preset ? ` ${preset}` : ''}: skipped (${reason})`);
      };
      if (broken) {
        skip('an earlier size failed on this backend');
        continue;
      }
      if (n > b.capabilities.maxSequence) {
        skip(`n exceeds the backend's maxSequence ${b.capabilities.maxSequence}`);
        continue;
      }
      const left = c.budgetMs - (performance.now() - started);
      // Attention is O(n^2): project this size from the last one.
      const projected = last ? last.ms * (n / last.n) ** 2 : 0;
      if (projected > left) {
        skip(`time budget: projected ${(projected / 1000).toFixed(0)} s, ${(Math.max(left, 0) / 1000).toFixed(0)} s left of --budget-s ${c.budgetMs / 1000}`);
        continue;
      }
      // Against the run's deadline the input generation counts too (O(n) on the host for
      // backends without a device fill: tens of seconds at 64k x 32 heads).
      const projectedAll = last ? projected + last.inputsMs * (n / last.n) : 0;
      // The dense peers run after the suite: leave them PEER_RESERVE_MS of the deadline.
      const runLeft = timeLeft(ctx) - (isRef ? 0 : PEER_RESERVE_MS);
      if (projectedAll > runLeft || runLeft <= 0) {
        skip(deadlineReason(projectedAll, runLeft));
        continue;
      }
      const t0 = performance.now();
      let opened: SizeInputs;
      try {
        opened = await openInputs(ctx, b, n, shape, dtype, ob.name);
      } catch (e) {
        skip(e instanceof SkipError ? e.message : `inputs: ${message(e)}`);
        continue;
      }
      const { inputs, out } = opened;
      const tGen = performance.now();
      const medians: number[] = [];
      try {
        const names = isRef ? c.presets : c.gpuPresets;
        for (const policy of LATENCY_PRESETS.filter((p) => names.includes(p.name))) {
          try {
            const timed = c.hostTimings ? withoutMarks(b) : b;
            const timedRuns = await timePreset(timed, inputs, out, policy, c.reps, c.warmup, Math.max(c.budgetMs, 60_000), c.freshInputs, isRef ? 0 : (c.gpuWarmMs ?? 0));
            // a GPU backend without device marks: the plan and the attention timed apart
            const serial = !isRef && typeof b.mark !== 'function' && timedRuns.denseReason === undefined;
            const r = serial
              ? { ...timedRuns, ...(await serialSplit(b, inputs, out, policy, Math.min(c.reps, 3), Math.max(c.budgetMs, 60_000), c.freshInputs)), planSplit: 'serial' as const }
              : timedRuns;
            const kt = c.kernelTimes && !isRef ? await kernelTimesOf(b, inputs, out, policy, Math.max(c.budgetMs, 60_000)) : undefined;
            if (kt) {
              ctx.log(
                `  kernel times ${ob.name} n=${n} ${policy.name}: ${kt.error ? `not timed (${kt.error})` : `busy ${kt.busyMs.toFixed(2)} ms, span ${kt.spanMs.toFixed(2)} ms: ${kt.kernels.map((k) => `${k.name} ${k.ms.toFixed(2)} (${k.passes})`).join(', ')}`}`,
              );
            }
            rows.push({
              backend: ob.name,
              preset: policy.name,
              n,
              dtype,
              shape,
              ...r,
              input: inputs.source,
              ...(c.freshInputs ? { freshInputs: true as const } : {}),
              ...(c.hostTimings ? { hostTimings: true as const } : {}),
              ...(kt ? { kernelTimes: kt } : {}),
            });
            medians.push(r.ms.median);
            ctx.progress?.('latency', { rows, skipped });
            ctx.log(
              `  latency ${ob.name} n=${n} ${policy.name}${c.freshInputs ? ' (fresh q/k/v)' : ''}: ${r.ms.median.toFixed(1)} ms [${r.ms.min.toFixed(1)}, ${r.ms.max.toFixed(1)}] plan ${r.planMs.toFixed(1)} ms${r.planPhases ? ` (${Object.entries(r.planPhases).map(([k, v]) => `${k.replace(/Ms$/, '')} ${v.toFixed(1)}`).join(', ')})` : ''} attention ${r.attentionMs.toFixed(1)} ms density ${r.density.toFixed(3)}`,
            );
          } catch (e) {
            skip(message(e), policy.name);
            if (/did not finish|lost|DEVICE_LOST/i.test(message(e))) broken = true;
          }
          if (broken) break;
        }
      } finally {
        out.dispose();
        inputs.dispose();
      }
      const wallMs = performance.now() - tGen;
      last = { n, ms: steadySizeMs(medians, c.reps + c.warmup, wallMs), inputsMs: tGen - t0 };
      ctx.progress?.('latency', { rows, skipped });
      ctx.log(
        `  latency ${ob.name} n=${n}: inputs ${((tGen - t0) / 1000).toFixed(1)} s, timing ${(wallMs / 1000).toFixed(1)} s, ${(last.ms / 1000).toFixed(1)} s warm (Nb=${numBlocks(n, 128)})`,
      );
    }
  }
  return { rows, skipped };
}
