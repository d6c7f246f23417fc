/**
 * The varlen suite (`--suites varlen`, not in the default set), two parts per backend:
 *
 * - a ragged batch: `--varlen-batch` sequences with lengths drawn from `--varlen-range`
 *   (seed `--varlen-seed`), each the @crisp/synth llama-like scenario with its own seed,
 *   written into packed q, k, v. Timed in the same run: varlenPrefill of the whole batch
 *   (one plan per sequence, one varlenAttention launch); one sparsePrefill per sequence over
 *   sliceRows views of the same packed tensors (the same bytes, summed); CRISP's dense kernel
 *   per sequence (summed); and, on CUDA, PyTorch SDPA flash and cuDNN per sequence (summed)
 *   through the latency suite's peer. The varlen output is checked against the
 *   single-sequence outputs (same plans, same kernels);
 * - chunked prefill (suites/chunked.ts).
 *
 * Backends without varlenAttention get a note for the batch. Nothing starts whose projected
 * time exceeds what --deadline-s leaves.
 */
import { type Backend, type DeviceTensor, type DType, type Policy, sparsePrefill, varlenPrefill } from '@crisp/core';
import { dense } from '@crisp/presets';
import { sampleRows } from '@crisp/reference';
import type { OpenBackend } from '../backends.js';
import { latencyDtype, type Shape } from '../config.js';
import { type SuiteContext, message, timeLeft } from '../context.js';
import { densePeers } from '../peers.js';
import type { Spread } from '../stats.js';
import { type ChunkedResult, chunkedPart } from './chunked.js';
import { jitWarmupGoesOn } from './latency.js';
import {
  allocatePacked,
  cuSeqlens,
  deviceRelErr,
  drawLengths,
  hostRows,
  maxAbsDiff,
  medianOf,
  relErr,
  timeRuns,
  varlenPolicy,
  writeScenarioRows,
} from './varlen-support.js';

export interface VarlenSequence {
  readonly n: number;
  /** its scenario's seed */
  readonly seed: number;
  /** its plan's density (selected causal blocks / Nb(Nb+1)/2, mean over heads) */
  readonly density: number;
  readonly denseReason?: string;
  /** the varlen output against CRISP's dense kernel on this sequence, ‖o − dense‖ / ‖dense‖ on sampled rows */
  readonly relErrVsDense?: number;
}

export interface VarlenPeerSum {
  readonly peer: string;
  /** Σ over the sequences of the peer's median at that length, ms */
  readonly ms: number;
  /** per sequence, ms (null: the peer timed no run at that length) */
  readonly perSequence: (number | null)[];
}

export interface VarlenBatchResult {
  readonly backend: string;
  readonly dtype: string;
  readonly shape: Shape;
  readonly policy: string;
  readonly lengthSeed: number;
  readonly lengths: number[];
  readonly input: string;
  /** the untimed prefills of one sequence before the timed runs (GPU backends), so that their JavaScript runs JIT-optimised */
  readonly jitWarmup?: { readonly prefills: number; readonly n: number };
  readonly sequences: VarlenSequence[];
  /** the batch's selected causal blocks over all its causal blocks */
  readonly overallDensity?: number;
  /** (a) varlenPrefill of the batch: wall ms, and its own timings' medians (planMs: every plan until the attention is queued) */
  readonly varlen?: { readonly ms: Spread; readonly planMs: number; readonly attentionMs: number; readonly totalMs: number; readonly planShare: number };
  /** (b) one sparsePrefill per sequence, same data: wall ms of all of them, and the sums of their plan and attention times */
  readonly singles?: { readonly ms: Spread; readonly planMs: number; readonly attentionMs: number };
  /** (c) CRISP's dense kernel (the dense preset) per sequence, summed */
  readonly dense?: { readonly ms: Spread };
  /** the varlen output against the single-sequence outputs */
  readonly check?: {
    readonly maxAbsDiff: number;
    /** packed rows compared (every row, or sampled rows of every sequence) */
    readonly rows: number;
    readonly allRows: boolean;
    /** ‖varlen − singles‖ / ‖singles‖ over every element, on the device (CUDA) */
    readonly deviceRelErr?: number;
  };
  /** (d) PyTorch SDPA per sequence, summed (CUDA) */
  readonly peers: VarlenPeerSum[];
}

export interface VarlenResult {
  /** the command that measured this section */
  readonly command: string;
  readonly batches: VarlenBatchResult[];
  readonly chunked: ChunkedResult[];
  readonly notes: string[];
}

/** Up to this many packed values the check compares every row; beyond, sampled rows of every sequence. */
const CHECK_ALL_VALUES = 1 << 22;
/** Rows sampled per sequence for the checks. */
const CHECK_ROWS = 32;

interface SequenceViews {
  readonly q: DeviceTensor;
  readonly k: DeviceTensor;
  readonly v: DeviceTensor;
  readonly single: DeviceTensor;
  readonly dense: DeviceTensor;
}

export async function varlenSuite(ctx: SuiteContext, backends: readonly OpenBackend[], peerScript: string | undefined): Promise<VarlenResult> {
  const result: VarlenResult = { command: ctx.command, batches: [], chunked: [], notes: [] };
  const note = (line: string) => {
    result.notes.push(line);
    ctx.log(`  varlen ${line}`);
  };
  for (const ob of backends) {
    if (!ob.backend) continue;
    const isRef = ob.name === 'reference';
    const shape = isRef ? ctx.config.latency.referenceShape : ctx.config.latency.shape;
    const dtype = latencyDtype(ob.name);
    const batch = await batchPart(ctx, ob.name, ob.backend, shape, dtype, note);
    if (batch) {
      result.batches.push(batch);
      ctx.progress?.('varlen', result);
    }
    const chunked = await chunkedPart(ctx, ob.name, ob.backend, shape, dtype, note);
    if (chunked) {
      result.chunked.push(chunked);
      ctx.progress?.('varlen', result);
    }
    if (batch?.varlen) {
      if (ob.name === 'cuda') batch.peers.push(...(await peerSums(ctx, ob, batch.lengths, peerScript, note)));
      else note(`${ob.name}: PyTorch SDPA peers: CUDA only`);
      ctx.progress?.('varlen', result);
    }
  }
  return result;
}

/** The batch's lengths through the latency suite's SDPA peer (unique lengths; summed per sequence). */
async function peerSums(ctx: SuiteContext, ob: OpenBackend, lengths: readonly number[], peerScript: string | undefined, note: (l: string) => void): Promise<VarlenPeerSum[]> {
  const sizes = [...new Set(lengths)].sort((a, b) => a - b);
  const r = await densePeers(ctx, [ob], new Map([[ob.name, sizes]]), peerScript);
  for (const x of r.notes) if (x.status !== 'ran' || x.detail.includes('n=')) note(`${ob.name} ${x.peer}: ${x.status}: ${x.detail}`);
  const out: VarlenPeerSum[] = [];
  for (const peer of [...new Set(r.rows.map((x) => x.peer))]) {
    const perSequence = lengths.map((n) => r.rows.find((x) => x.peer === peer && x.n === n)?.ms.median ?? null);
    if (perSequence.some((x) => x === null)) {
      note(`${ob.name} ${peer}: timed ${perSequence.filter((x) => x !== null).length} of ${lengths.length} sequences: no sum`);
      continue;
    }
    out.push({ peer, ms: perSequence.reduce<number>((a, x) => a + (x ?? 0), 0), perSequence });
  }
  return out;
}

async function batchPart(ctx: SuiteContext, name: string, b: Backend, shape: Shape, dtype: DType, note: (l: string) => void): Promise<VarlenBatchResult | undefined> {
  const c = ctx.config.varlen;
  if (typeof b.varlenAttention !== 'function' || typeof b.sliceRows !== 'function') {
    note(`${name}: batch skipped: the backend has no varlenAttention/sliceRows (varlenPrefill needs both)`);
    return undefined;
  }
  const lengths = drawLengths(c.batch, c.range, c.seed);
  const longest = Math.max(...lengths);
  if (longest > b.capabilities.maxSequence) {
    note(`${name}: batch skipped: its longest sequence (${longest}) exceeds the backend's maxSequence ${b.capabilities.maxSequence}`);
    return undefined;
  }
  if (timeLeft(ctx) <= 0) {
    note(`${name}: batch skipped: no time left before --deadline-s`);
    return undefined;
  }
  const policy = varlenPolicy(c.policy);
  const reps = ctx.config.latency.reps;
  const warmup = ctx.config.latency.warmup;
  const cu = cuSeqlens(lengths);
  const total = cu[cu.length - 1];
  const seeds = lengths.map((_, s) => ctx.config.seed + s);
  ctx.log(`  varlen ${name}: batch of ${lengths.length} (${lengths.join(', ')}; ${total} rows), ${policy.name}`);
  const made: { dispose(): void }[] = [];
  const res = {
    backend: name,
    dtype,
    shape,
    policy: policy.name,
    lengthSeed: c.seed,
    lengths,
    input: '',
    sequences: [] as VarlenSequence[],
    peers: [] as VarlenPeerSum[],
  } as { -readonly [K in keyof VarlenBatchResult]: VarlenBatchResult[K] };
  try {
    const {
      packed,
      outs: [outVarlen, outSingles, outDense],
    } = allocatePacked(b, total, shape, dtype, 3, made);
    const t0 = performance.now();
    const sources = new Set<string>();
    for (let s = 0; s < lengths.length; s++) {
      // (each sequence's seed is in its row)
      const from = await writeScenarioRows(ctx, b, packed, cu[s], lengths[s], shape, dtype, seeds[s], `  varlen ${name} sequence ${s} (n=${lengths[s]})`);
      sources.add(from.replace(/ \(seed \d+\)/, ''));
    }
    res.input = [...sources].join('; ');
    ctx.log(`  varlen ${name}: inputs ${((performance.now() - t0) / 1000).toFixed(1)} s`);
    const views: SequenceViews[] = lengths.map((n, s) => {
      const at = (t: DeviceTensor) => {
        const x = b.sliceRows!(t, cu[s], n);
        made.push(x);
        return x;
      };
      return { q: at(packed.q), k: at(packed.k), v: at(packed.v), single: at(outSingles), dense: at(outDense) };
    });
    // (the float64 reference is timed cold, as in the latency suite; elsewhere the shortest
    // sequence the length gate lets through the sparse plan, so that its JavaScript is warmed)
    if (name !== 'reference') {
      const sparse = lengths.filter((n) => n >= b.sparseCrossover);
      const n = Math.min(...(sparse.length ? sparse : lengths));
      res.jitWarmup = { prefills: await jitWarmup(ctx, name, b, views[lengths.indexOf(n)], policy), n };
    }

    // (a) the batch in one varlenPrefill
    const a = await timeRuns(ctx, () => varlenPrefill(b, packed, { cuSeqlensQ: cu }, policy, { out: outVarlen }), reps, warmup);
    if ('skipped' in a) {
      note(`${name}: varlenPrefill not timed: ${a.skipped}`);
      return res;
    }
    const last = a.runs[a.runs.length - 1];
    const planMs = medianOf(a.runs, (r) => r.timings.planMs);
    const totalMs = medianOf(a.runs, (r) => r.timings.totalMs);
    res.varlen = { ms: a.ms, planMs, attentionMs: medianOf(a.runs, (r) => r.timings.attentionMs), totalMs, planShare: planMs / totalMs };
    res.overallDensity = last.overallDensity;
    res.sequences = lengths.map((n, s) => ({ n, seed: seeds[s], density: last.plans[s].overallDensity, ...(last.plans[s].denseReason ? { denseReason: last.plans[s].denseReason } : {}) }));
    ctx.log(`  varlen ${name}: varlenPrefill ${a.ms.median.toFixed(1)} ms (plan ${planMs.toFixed(1)} ms, ${((100 * planMs) / totalMs).toFixed(1)}% of its total; density ${last.overallDensity.toFixed(3)})`);

    // (b) one sparsePrefill per sequence over the same bytes
    const bRuns = await timeRuns(ctx, () => eachSequence(b, views, policy, 'single'), reps, warmup);
    if ('skipped' in bRuns) note(`${name}: single-sequence prefills not timed: ${bRuns.skipped}`);
    else {
      res.singles = { ms: bRuns.ms, planMs: medianOf(bRuns.runs, (r) => r.planMs), attentionMs: medianOf(bRuns.runs, (r) => r.attentionMs) };
      const dens = bRuns.runs[bRuns.runs.length - 1].density;
      const differ = dens.findIndex((d, s) => d !== res.sequences[s].density);
      if (differ >= 0) note(`${name}: sequence ${differ}'s single-sequence plan has density ${dens[differ]}, its varlen plan ${res.sequences[differ].density}`);
      ctx.log(`  varlen ${name}: ${lengths.length} sparsePrefill calls ${bRuns.ms.median.toFixed(1)} ms (plans ${res.singles.planMs.toFixed(1)} ms)`);
    }

    // (c) CRISP's dense kernel per sequence
    const cRuns = await timeRuns(ctx, () => eachSequence(b, views, dense, 'dense'), reps, warmup);
    if ('skipped' in cRuns) note(`${name}: dense per sequence not timed: ${cRuns.skipped}`);
    else {
      res.dense = { ms: cRuns.ms };
      ctx.log(`  varlen ${name}: dense per sequence ${cRuns.ms.median.toFixed(1)} ms`);
    }

    await checkBatch(b, res, cu, outVarlen, res.singles ? outSingles : undefined, res.dense ? outDense : undefined, shape);
    if (res.check) ctx.log(`  varlen ${name}: varlen vs single-sequence outputs: max |diff| ${res.check.maxAbsDiff} over ${res.check.rows} rows`);
  } catch (e) {
    note(`${name}: batch failed: ${message(e)}`);
  } finally {
    for (const t of made.reverse()) t.dispose();
  }
  return res;
}

/** One prefill per sequence (its output into its view of the packed output); the sums of their timings. */
async function eachSequence(b: Backend, views: readonly SequenceViews[], policy: Policy, into: 'single' | 'dense'): Promise<{ planMs: number; attentionMs: number; density: number[] }> {
  let planMs = 0;
  let attentionMs = 0;
  const density: number[] = [];
  for (const v of views) {
    const r = await sparsePrefill(b, v, policy, { out: v[into] });
    planMs += r.timings.planMs;
    attentionMs += r.timings.attentionMs;
    density.push(r.plan.overallDensity);
  }
  return { planMs, attentionMs, density };
}

/**
 * Untimed prefills of one sequence, as the latency suite's JIT warm-up (its count, its time
 * cap), so that the timed plans run JIT-optimised JavaScript. Stops early at the deadline.
 */
async function jitWarmup(ctx: SuiteContext, name: string, b: Backend, v: SequenceViews, policy: Policy): Promise<number> {
  const count = ctx.config.latency.jitWarmup;
  if (count <= 0) return 0;
  const t0 = performance.now();
  let t1 = t0;
  let done = 0;
  while (jitWarmupGoesOn(done, count, 1, performance.now() - t1) && timeLeft(ctx) > 60_000) {
    await sparsePrefill(b, v, policy, { out: v.single });
    if (++done === 1) t1 = performance.now();
  }
  ctx.log(`  varlen ${name}: JIT warm-up, ${done} prefills at n=${v.q.shape[0]} in ${((performance.now() - t0) / 1000).toFixed(1)} s`);
  return done;
}

/** The varlen output against the single-sequence outputs (max |diff|) and each sequence's against dense. */
async function checkBatch(
  b: Backend,
  res: { -readonly [K in keyof VarlenBatchResult]: VarlenBatchResult[K] },
  cu: readonly number[],
  outVarlen: DeviceTensor,
  outSingles: DeviceTensor | undefined,
  outDense: DeviceTensor | undefined,
  shape: Shape,
): Promise<void> {
  const total = cu[cu.length - 1];
  const allRows = total * shape.heads * shape.headDim <= CHECK_ALL_VALUES;
  const perSeq = res.lengths.map((n, s) => (allRows ? Array.from({ length: n }, (_, i) => i) : sampleRows(n, CHECK_ROWS)).map((r) => cu[s] + r));
  const rows = perSeq.flat();
  const got = await hostRows(b, outVarlen, rows);
  if (outSingles) {
    const full = deviceRelErr(b, outVarlen, outSingles);
    res.check = { maxAbsDiff: maxAbsDiff(got, await hostRows(b, outSingles, rows)), rows: rows.length, allRows, ...(full ? { deviceRelErr: full.relErr } : {}) };
  }
  if (!outDense) return;
  const ref = await hostRows(b, outDense, rows);
  const per = shape.heads * shape.headDim;
  let at = 0;
  res.sequences = res.sequences.map((x, s) => {
    const len = perSeq[s].length * per;
    const e = relErr(got.subarray(at, at + len), ref.subarray(at, at + len));
    at += len;
    return { ...x, relErrVsDense: e };
  });
}
