/**
 * The parallel suite (`--suites parallel`, not in the default set): what context-parallel
 * prefill (@crisp/parallel) moves and how evenly it loads its ranks, for the @crisp/synth
 * llama-like scenario at `--parallel-shape` (default H 32, Hkv 8, d 128).
 *
 * Every rank of a parallelPrefill makes the plan a single backend makes, so the traffic of a
 * P-rank run is a function of that plan and the zig-zag layout alone. Per size
 * (`--parallel-sizes`) and preset (`--presets`, default crisp) the plan is made once with
 * planPrefill (length gate off) on the first backend available of cuda, webgpu, reference;
 * then, per rank count P (`--parallel-ranks`, default 2, 4, 8), from that plan and
 * zigzagLayout(n, P, B):
 *
 * - K/V bytes each rank receives (the selected blocks it does not hold, K and V, in the
 *   backend's latency dtype), their total and the largest rank's, against what a dense ring
 *   moves (`denseRingBytes`) and what a causal dense exchange moves (every block before a
 *   rank's last);
 * - the plan phase's bytes per rank, computed from the message sizes parallelPrefill sends
 *   (parallel-traffic.ts: proxy rows, log-sum-exps, partial sums, key and query block means in
 *   float64, plus the shard and plan checks), not measured by running it: its statistics
 *   are float64 host work of O(B·n·H·d) per P on top of the plan. The bench's tests run the
 *   real parallelPrefill on the same inputs and check these counts, and the K/V bytes,
 *   byte for byte against its traffic counters;
 * - the attention's load: selected (head, query block, key block) triples of the query
 *   blocks each rank holds, max / mean over the ranks, beside the same ratio for dense causal
 *   attention (the zig-zag's own balance).
 *
 * Time and scaling efficiency are not measured (they need several GPUs and a communicator
 * over NCCL); the suite records a note saying so. Nothing starts whose projected time (linear
 * in n from the previous size) exceeds what --deadline-s leaves.
 */
import { bytesPerElement, planPrefill, releasePlan } from '@crisp/core';
import { denseRingBytes, shardHeaderBytes, zigzagLayout } from '@crisp/parallel';
import type { OpenBackend } from '../backends.js';
import { latencyDtype, type Shape } from '../config.js';
import { deadlineReason, type SuiteContext, message, timeLeft } from '../context.js';
import { inputsProgress, latencyInputs } from '../inputs.js';
import { LATENCY_PRESETS } from './latency.js';
import { byOwner, kvBytesPerRank, type PerRank, type PlanParts, perRank, planTraffic, readsTokenScores, selectedPerQueryBlock } from './parallel-traffic.js';

export interface ParallelRow {
  readonly backend: string;
  readonly dtype: string;
  readonly shape: Shape;
  readonly preset: string;
  readonly n: number;
  /** P */
  readonly ranks: number;
  readonly blockSize: number;
  readonly numBlocks: number;
  readonly input: string;
  /** the single-backend plan: host ms to make it, its density, its PE heads, why it is dense when it is */
  readonly planMs: number;
  readonly density: number;
  readonly peHeads: number;
  readonly denseReason?: string;
  /** K/V bytes received per rank */
  readonly kvBytes: PerRank;
  /** what a dense ring moves in all: every shard to every other rank */
  readonly denseRingBytes: number;
  /** what a causal dense exchange moves in all: every block before a rank's last that it does not hold */
  readonly causalDenseBytes: number;
  /** plan-phase bytes received per rank, and their total over the ranks by message */
  readonly planBytes: PerRank & { readonly parts: PlanParts };
  /** selected (head, query block, key block) triples of each rank's query blocks; imbalance = max / mean */
  readonly work: PerRank & { readonly imbalance: number; readonly denseImbalance: number };
  /** the run (its startedAt) that measured this row; set when results are merged */
  readonly run?: string;
}

export interface ParallelSkip {
  readonly backend: string;
  readonly n: number;
  readonly ranks?: number;
  readonly reason: string;
}

export interface ParallelResult {
  readonly rows: ParallelRow[];
  readonly skipped: ParallelSkip[];
  readonly notes: string[];
}

/** The note every run records: what the suite does not measure. */
export const NOT_TIMED =
  'time and scaling efficiency are not measured: they need several GPUs and a communicator over NCCL (one process per GPU), which this suite does not run yet; the rows are traffic and load, from the single-backend plan';

/** The backend the plan is made on: the first available of these. */
const PLAN_BACKENDS = ['cuda', 'webgpu', 'reference'] as const;

export async function parallelSuite(ctx: SuiteContext, backends: readonly OpenBackend[]): Promise<ParallelResult> {
  const result: ParallelResult = { rows: [], skipped: [], notes: [] };
  const note = (line: string) => {
    result.notes.push(line);
    ctx.log(`  parallel: ${line}`);
  };
  note(NOT_TIMED);
  const ob = PLAN_BACKENDS.map((name) => backends.find((x) => x.name === name && x.backend)).find((x) => x !== undefined);
  if (!ob?.backend) {
    note('no backend to plan on');
    return result;
  }
  const b = ob.backend;
  const c = ctx.config.parallel;
  const shape = c.shape;
  const dtype = latencyDtype(ob.name);
  const elem = bytesPerElement(dtype);
  const presets = LATENCY_PRESETS.filter((p) => c.presets.includes(p.name));
  const skip = (n: number, reason: string, ranks?: number) => {
    result.skipped.push({ backend: ob.name, n, ...(ranks === undefined ? {} : { ranks }), reason });
    ctx.log(`  parallel ${ob.name} n=${n}${ranks === undefined ? '' : ` P=${ranks}`}: skipped: ${reason}`);
  };
  let last: { n: number; ms: number } | undefined;
  for (const n of ob.name === 'reference' ? c.referenceSizes : c.sizes) {
    if (n > b.capabilities.maxSequence) {
      skip(n, `n exceeds the backend's maxSequence ${b.capabilities.maxSequence}`);
      continue;
    }
    const projected = last ? (last.ms * n) / last.n : 0;
    if (projected > timeLeft(ctx)) {
      skip(n, deadlineReason(projected, timeLeft(ctx)));
      continue;
    }
    const t0 = performance.now();
    try {
      const progress = inputsProgress((m) => ctx.log(m), `  parallel ${ob.name} n=${n}`);
      const inputs = await latencyInputs(b, 'llama-like', n, shape, dtype, ctx.config.seed, Number.POSITIVE_INFINITY, 'synth', progress, ctx.config.latency.synthThreads);
      try {
        for (const policy of presets) {
          const tPlan = performance.now();
          const plan = await planPrefill(b, inputs, policy, { minSparseLength: 0 });
          const planMs = performance.now() - tPlan;
          releasePlan(plan);
          const work = selectedPerQueryBlock(plan);
          const denseWork = selectedPerQueryBlock({ ...plan, mask: undefined });
          const peHeads = plan.routing?.routes.filter((r) => r === 'pe').length ?? 0;
          ctx.log(`  parallel ${ob.name} n=${n} ${policy.name}: plan ${(planMs / 1000).toFixed(1)} s, density ${plan.overallDensity.toFixed(3)}, ${peHeads} PE heads`);
          for (const P of c.ranks) {
            if (plan.numBlocks < P) {
              skip(n, `${plan.numBlocks} blocks of ${plan.blockSize}: fewer than ${P} ranks`, P);
              continue;
            }
            const layout = zigzagLayout(n, P, plan.blockSize);
            const kv = perRank(kvBytesPerRank(plan, layout, shape.headDim, elem));
            const causal = perRank(kvBytesPerRank({ ...plan, mask: undefined }, layout, shape.headDim, elem));
            // (parallelPrefill's own options: its default length gate is 0, as this plan's)
            const pt = planTraffic(plan, layout, readsTokenScores(policy), shardHeaderBytes(layout, plan.shape, policy));
            const w = perRank(byOwner(work, layout));
            const dw = perRank(byOwner(denseWork, layout));
            const row: ParallelRow = {
              backend: ob.name,
              dtype,
              shape,
              preset: policy.name,
              n,
              ranks: P,
              blockSize: plan.blockSize,
              numBlocks: plan.numBlocks,
              input: inputs.source,
              planMs,
              density: plan.overallDensity,
              peHeads,
              ...(plan.denseReason ? { denseReason: plan.denseReason } : {}),
              kvBytes: kv,
              denseRingBytes: denseRingBytes(layout, shape.kvHeads, shape.headDim, elem),
              causalDenseBytes: causal.total,
              planBytes: { ...perRank(pt.perRank), parts: pt.parts },
              work: { ...w, imbalance: w.max / w.mean, denseImbalance: dw.max / dw.mean },
            };
            result.rows.push(row);
            ctx.log(
              `  parallel ${ob.name} n=${n} P=${P}: K/V ${mib(kv.total)} MiB received in all (${pctOf(kv.total, row.denseRingBytes)} of a dense ring), ${mib(kv.max)} MiB on the busiest rank; plan ${mib(row.planBytes.max)} MiB per rank at most; work max/mean ${row.work.imbalance.toFixed(3)} (dense ${row.work.denseImbalance.toFixed(3)})`,
            );
          }
          ctx.progress?.('parallel', result);
        }
      } finally {
        inputs.dispose();
      }
    } catch (e) {
      skip(n, `failed: ${message(e)}`);
    }
    last = { n, ms: performance.now() - t0 };
  }
  return result;
}

const mib = (bytes: number): string => (bytes / 2 ** 20).toFixed(1);
const pctOf = (part: number, whole: number): string => `${((100 * part) / whole).toFixed(1)}%`;
