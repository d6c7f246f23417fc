/**
 * The varlen suite's chunked-prefill part: one sequence of `--chunked-n` tokens (the
 * llama-like scenario) prefilled in `--chunks` equal query chunks, chunk c's queries
 * (rows [c·n/C, (c+1)·n/C), a sliceRows view) against the keys and values of rows
 * [0, (c+1)·n/C), each with its LSE, as a runtime prefills a long prompt piece by piece;
 * against one sparsePrefill of the whole sequence with the same policy in the same run. Both
 * outputs are compared with CRISP's dense output on sampled rows.
 *
 * A planner that refuses sparse chunks (q shorter than k) throws a CrispError: the part then
 * records it in the notes and reports the full prefill alone.
 */
import { type Backend, CrispError, type DeviceTensor, type DType, sparsePrefill } from '@crisp/core';
import { dense } from '@crisp/presets';
import { sampleRows } from '@crisp/reference';
import type { Shape } from '../config.js';
import { type SuiteContext, message, timeLeft } from '../context.js';
import type { Spread } from '../stats.js';
import { allocatePacked, hostRows, medianOf, relErr, timeRuns, varlenPolicy, writeScenarioRows } from './varlen-support.js';

export interface ChunkRow {
  /** query rows and key rows of the chunk */
  readonly queries: number;
  readonly keys: number;
  readonly density: number;
  readonly denseReason?: string;
  /** median ms of this chunk's sparsePrefill (its own totalMs) */
  readonly ms: number;
  readonly planMs: number;
}

export interface ChunkedResult {
  readonly backend: string;
  readonly dtype: string;
  readonly shape: Shape;
  readonly policy: string;
  readonly n: number;
  readonly chunks: number;
  readonly seed: number;
  readonly input: string;
  /** the chunks in turn: wall ms of all of them per run, the sum of their plan times (median), each chunk's row */
  readonly chunked?: { readonly ms: Spread; readonly planMs: number; readonly perChunk: ChunkRow[] };
  /** a chunk the planner refused (the error's code and message) */
  readonly refused?: { readonly chunk: number; readonly code: string; readonly message: string };
  /** one sparsePrefill of the whole sequence */
  readonly full?: { readonly ms: Spread; readonly planMs: number; readonly density: number };
  /** ‖o − dense‖ / ‖dense‖ over the sampled rows, for the chunked and the full output */
  readonly relErrVsDense?: { readonly chunked?: number; readonly full?: number; readonly rows: number };
}

/** Rows sampled from the sequence for the error against dense (plus each chunk's first and last). */
const ERROR_ROWS = 64;

/** A chunk's sparsePrefill refused, with the chunk it was. */
class ChunkRefused extends Error {
  constructor(
    readonly chunk: number,
    readonly error: CrispError,
  ) {
    super(error.message);
  }
}

export async function chunkedPart(ctx: SuiteContext, name: string, b: Backend, shape: Shape, dtype: DType, note: (l: string) => void): Promise<ChunkedResult | undefined> {
  const c = ctx.config.varlen;
  const { chunkedN: n, chunks: C } = c;
  if (typeof b.sliceRows !== 'function' || !b.capabilities.chunkedPrefill) {
    note(`${name}: chunked prefill skipped: the backend has ${typeof b.sliceRows !== 'function' ? 'no sliceRows (the chunks are row views)' : 'no chunked prefill'}`);
    return undefined;
  }
  if (n > b.capabilities.maxSequence) {
    note(`${name}: chunked prefill skipped: n=${n} exceeds the backend's maxSequence ${b.capabilities.maxSequence}`);
    return undefined;
  }
  if (timeLeft(ctx) <= 0) {
    note(`${name}: chunked prefill skipped: no time left before --deadline-s`);
    return undefined;
  }
  const policy = varlenPolicy(c.policy);
  const reps = ctx.config.latency.reps;
  const warmup = ctx.config.latency.warmup;
  const bounds = Array.from({ length: C + 1 }, (_, i) => Math.floor((i * n) / C));
  const seed = ctx.config.seed;
  const res = { backend: name, dtype, shape, policy: policy.name, n, chunks: C, seed, input: '' } as { -readonly [K in keyof ChunkedResult]: ChunkedResult[K] };
  ctx.log(`  varlen ${name}: chunked prefill, n=${n} in ${C} chunks, ${policy.name}`);
  const made: { dispose(): void }[] = [];
  try {
    const {
      packed: whole,
      outs: [outChunked, outFull, outDense],
    } = allocatePacked(b, n, shape, dtype, 3, made);
    res.input = await writeScenarioRows(ctx, b, whole, 0, n, shape, dtype, seed, `  varlen ${name} chunked (n=${n})`);
    const view = (t: DeviceTensor, start: number, rows: number) => {
      const x = b.sliceRows!(t, start, rows);
      made.push(x);
      return x;
    };
    const parts = bounds.slice(0, C).map((start, i) => {
      const end = bounds[i + 1];
      return { q: view(whole.q, start, end - start), k: view(whole.k, 0, end), v: view(whole.v, 0, end), out: view(outChunked, start, end - start) };
    });
    const inChunks = async () => {
      const rows: Omit<ChunkRow, 'ms' | 'planMs'>[] = [];
      const ms: number[] = [];
      const plan: number[] = [];
      for (let i = 0; i < parts.length; i++) {
        const p = parts[i];
        const r = await sparsePrefill(b, p, policy, { returnLse: true, out: p.out }).catch((e: unknown) => {
          throw e instanceof CrispError ? new ChunkRefused(i, e) : e;
        });
        r.lse?.dispose();
        rows.push({ queries: p.q.shape[0], keys: p.k.shape[0], density: r.plan.overallDensity, ...(r.plan.denseReason ? { denseReason: r.plan.denseReason } : {}) });
        ms.push(r.timings.totalMs);
        plan.push(r.timings.planMs);
      }
      return { rows, ms, plan };
    };
    try {
      const t = await timeRuns(ctx, inChunks, reps, warmup);
      if ('skipped' in t) note(`${name}: chunked prefill not timed: ${t.skipped}`);
      else {
        const rows = t.runs[t.runs.length - 1].rows;
        const perChunk = rows.map((r, i) => ({ ...r, ms: medianOf(t.runs, (x) => x.ms[i]), planMs: medianOf(t.runs, (x) => x.plan[i]) }));
        res.chunked = { ms: t.ms, planMs: medianOf(t.runs, (x) => x.plan.reduce((a, y) => a + y, 0)), perChunk };
        ctx.log(`  varlen ${name}: ${C} chunks ${t.ms.median.toFixed(1)} ms (densities ${perChunk.map((x) => x.density.toFixed(3)).join(', ')})`);
      }
    } catch (e) {
      if (!(e instanceof ChunkRefused)) throw e;
      res.refused = { chunk: e.chunk, code: e.error.code, message: e.error.message };
      note(`${name}: chunked prefill with ${policy.name}: chunk ${e.chunk} (q ${parts[e.chunk].q.shape[0]} rows, k ${parts[e.chunk].k.shape[0]}) refused: ${e.error.code}: ${e.error.message}`);
    }

    const fullOnce = async () => {
      const r = await sparsePrefill(b, whole, policy, { returnLse: true, out: outFull });
      r.lse?.dispose();
      return r;
    };
    const full = await timeRuns(ctx, fullOnce, reps, warmup);
    if ('skipped' in full) note(`${name}: full prefill not timed: ${full.skipped}`);
    else {
      const last = full.runs[full.runs.length - 1];
      res.full = { ms: full.ms, planMs: medianOf(full.runs, (r) => r.timings.planMs), density: last.plan.overallDensity };
      ctx.log(`  varlen ${name}: full prefill ${full.ms.median.toFixed(1)} ms (density ${last.plan.overallDensity.toFixed(3)})`);
    }

    if (res.chunked || res.full) {
      await sparsePrefill(b, whole, dense, { out: outDense });
      const rows = [...new Set([...sampleRows(n, ERROR_ROWS), ...bounds.slice(0, C), ...bounds.slice(1).map((x) => x - 1)])].sort((x, y) => x - y);
      const ref = await hostRows(b, outDense, rows);
      const err = async (t: DeviceTensor) => relErr(await hostRows(b, t, rows), ref);
      res.relErrVsDense = {
        ...(res.chunked ? { chunked: await err(outChunked) } : {}),
        ...(res.full ? { full: await err(outFull) } : {}),
        rows: rows.length,
      };
    }
  } catch (e) {
    note(`${name}: chunked prefill failed: ${message(e)}`);
  } finally {
    for (const t of made.reverse()) t.dispose();
  }
  return res;
}
