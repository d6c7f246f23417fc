/**
 * The hostile-input soak: N calls drawn with a fixed seed, valid ones (sparsePrefill with the
 * presets and custom policies, planPrefill + runPlan, dense and chunked attention, a user's
 * mask, into a given output) interleaved with invalid ones (soak-calls.ts: bad shapes, dtypes,
 * disposed and foreign tensors, masks out of range, NaN/Inf inputs, policies returning
 * garbage, allocations that must fail, an output aliasing an input) and injected faults
 * (a failed allocation or launch part way through a call). Every valid call's output is
 * checked on a few rows against float64 attention on the host under the same mask; every
 * invalid call must end in its expected CrispError code. Device memory (cuMemGetInfo) and the
 * pool's counters are read before and after, once the backend gave back what it keeps.
 */
import type { Backend } from '@crisp/core';
import { isCrispError, mulberry32 } from '@crisp/core';
import type { CudaFaults } from '@crisp/kernels-cuda';
import { buildHelpers } from './soak-calls.js';
import { type Problem, type ProblemSpec, ROW_TOLERANCE, maskRowBlocks, outputRows, referenceRow, rowError } from './soak-check.js';
import type { Call, CudaTools, Helpers, SoakContext, SoakTarget, Valid } from './soak-types.js';

export type { CudaTools, SoakTarget } from './soak-types.js';

export interface SoakOptions {
  /** calls to make (default 1000) */
  readonly calls?: number;
  readonly seed?: number;
  /** the problems the calls run on (default DEFAULT_PROBLEMS) */
  readonly problems?: readonly ProblemSpec[];
  /** check valid calls' outputs against float64 rows (default true; off on a stand-in driver, whose outputs are zeros) */
  readonly verify?: boolean;
  /** also the policy outputs core refuses only once it checks them before coercing (unknown routes, NaN or fractional indices, async routers, empty selections) */
  readonly strictPolicy?: boolean;
  /**
   * The backend computes (default true). False on a stand-in driver, whose outputs and
   * statistics are zeros: the checks a device makes while computing (NaN/Inf counts, mask rows
   * while expanding) and FlexPrefill's router (which refuses all-zero statistics) are left out.
   */
  readonly computes?: boolean;
  /** stop drawing calls after this many milliseconds (the summary says so) */
  readonly budgetMs?: number;
  /** free device memory after may be this much below before (default 64 MiB: lazily made streams, events, module data) */
  readonly toleranceBytes?: number;
  readonly log?: (line: string) => void;
}

/** Llama-like and odd shapes, 1k-16k: each is uploaded once and reused. */
export const DEFAULT_PROBLEMS: readonly ProblemSpec[] = [
  { n: 1024, H: 8, Hkv: 2, d: 128, dtype: 'bf16' },
  { n: 2048, H: 4, Hkv: 4, d: 64, dtype: 'f16' },
  { n: 4096, H: 8, Hkv: 2, d: 128, dtype: 'f16' },
  { n: 6000, H: 8, Hkv: 4, d: 128, dtype: 'bf16' },
  { n: 8192, H: 16, Hkv: 4, d: 64, dtype: 'bf16' },
  { n: 16384, H: 8, Hkv: 2, d: 128, dtype: 'bf16' },
];

/** Per call kind: how its calls ended. */
export interface KindCounts {
  calls: number;
  /** a valid call whose output matched, or an invalid one that gave its expected code */
  ok: number;
  /** CrispError codes (and 'ok') seen */
  outcomes: Record<string, number>;
  /** valid calls whose output did not match the reference */
  mismatched: number;
  /** valid calls that threw */
  failed: number;
  /** invalid calls that succeeded or gave another code */
  unexpected: number;
}

export interface MemorySnapshot {
  readonly free?: number;
  readonly total?: number;
  readonly liveBytes?: number;
  readonly pooledBytes?: number;
  readonly misses?: number;
}

export interface SoakSummary {
  seed: number;
  calls: number;
  /** calls made, the warm-up's included */
  completed: number;
  /** the warm-up's calls (each valid kind once on each problem, before the memory baseline) */
  warmUpCalls: number;
  stoppedEarly: boolean;
  verify: boolean;
  strictPolicy: boolean;
  problems: string[];
  byKind: Record<string, KindCounts>;
  byFamily: Record<string, KindCounts>;
  byCode: Record<string, number>;
  checkedRows: number;
  worstRowError: Record<string, number>;
  /** valid calls that failed or whose output did not match */
  lost: number;
  /** invalid calls that did not end in their expected code */
  unexpected: number;
  failures: string[];
  faultCases: FaultCaseResult[];
  memory: { before: MemorySnapshot; after: MemorySnapshot; freeDropBytes?: number; liveDeltaBytes?: number; toleranceBytes: number; leak: boolean };
  wallMs: number;
  passed: boolean;
}

/** One explicit fault case (fault-cases.ts): the fault, its code, and the valid call after it. */
export interface FaultCaseResult {
  readonly name: string;
  readonly expected: readonly string[];
  readonly got: string;
  /** the valid call right after: 'ok' (checked) or what went wrong */
  readonly after: string;
  /** the pool's live bytes back at the case's start once trimmed (CUDA) */
  readonly memoryBack?: boolean;
  readonly passed: boolean;
}

const emptyCounts = (): KindCounts => ({ calls: 0, ok: 0, outcomes: {}, mismatched: 0, failed: 0, unexpected: 0 });

/** The running soak: the problems, the helpers of the invalid calls, the counters. */
export class Soak implements SoakContext {
  readonly be: Backend & Partial<CudaTools>;
  readonly tools: CudaTools | undefined;
  readonly faults: CudaFaults | undefined;
  readonly r: () => number;
  readonly verify: boolean;
  readonly strictPolicy: boolean;
  readonly summary: SoakSummary;
  readonly #log: (line: string) => void;
  readonly #t0 = performance.now();
  h!: Helpers;

  constructor(
    readonly target: SoakTarget,
    readonly opts: SoakOptions,
  ) {
    this.be = target.backend;
    const b = target.backend;
    this.tools = b.memoryInfo && b.poolStats && b.trimMemory && b.readRows ? (b as CudaTools) : undefined;
    this.faults = target.faults;
    const seed = opts.seed ?? 37;
    this.r = mulberry32(seed);
    this.verify = opts.verify ?? true;
    this.strictPolicy = Boolean(opts.strictPolicy);
    this.#log = opts.log ?? (() => {});
    this.summary = {
      seed,
      calls: opts.calls ?? 1000,
      completed: 0,
      warmUpCalls: 0,
      stoppedEarly: false,
      verify: this.verify,
      strictPolicy: Boolean(opts.strictPolicy),
      problems: [],
      byKind: {},
      byFamily: {},
      byCode: {},
      checkedRows: 0,
      worstRowError: { bf16: 0, f16: 0 },
      lost: 0,
      unexpected: 0,
      failures: [],
      faultCases: [],
      memory: { before: {}, after: {}, toleranceBytes: opts.toleranceBytes ?? 64 * 2 ** 20, leak: false },
      wallMs: 0,
      passed: false,
    };
  }

  log(line: string): void {
    this.#log(line);
  }

  get elapsedMs(): number {
    return performance.now() - this.#t0;
  }

  /** The problems uploaded and the invalid calls' helpers made (kept to the end: part of the baseline). */
  async setup(): Promise<void> {
    this.h = await buildHelpers(this, this.opts.problems ?? DEFAULT_PROBLEMS, this.opts.computes ?? true);
    this.summary.problems = this.h.problems.map((p) => p.name);
  }

  /** Device memory and the pool, once the backend gave back what it keeps between calls. */
  snapshot(): MemorySnapshot {
    const t = this.tools;
    if (!t) return {};
    t.trimMemory();
    const m = t.memoryInfo();
    const p = t.poolStats();
    return { free: m.free, total: m.total, liveBytes: p.liveBytes, pooledBytes: p.pooledBytes, misses: p.misses };
  }

  fail(line: string): void {
    if (this.summary.failures.length < 40) this.summary.failures.push(line);
    this.log(`FAIL ${line}`);
  }

  /** Check a valid call's output on a few rows and heads against float64 attention; false (and a failure line) when it does not match. */
  async check(kind: string, v: Valid): Promise<boolean> {
    if (!this.verify) return true;
    const p = v.problem;
    const m = v.output.shape[0];
    const rows = new Set<number>([m - 1]);
    while (rows.size < Math.min(m, 4)) rows.add(Math.floor(this.r() * m));
    const heads = new Set<number>();
    while (heads.size < Math.min(p.H, 2)) heads.add(Math.floor(this.r() * p.H));
    const list = [...rows].sort((a, b) => a - b);
    const got = await outputRows(this.be as never, v.output, list);
    const scale = 1 / Math.sqrt(p.d);
    const host = v.qHost ? { q: v.qHost, k: p.host.k, v: p.host.v } : p.host;
    const dims = { m, n: p.n, H: p.H, Hkv: p.Hkv, d: p.d };
    let worst = 0;
    for (let i = 0; i < list.length; i++) {
      for (const h of heads) {
        // a valid plan leaves no query block without a key block (its output row would be zeros)
        const I = Math.floor((p.n - m + list[i]) / (v.mask?.blockSize ?? 1));
        if (v.mask && maskRowBlocks(v.mask, h, I).length === 0) {
          this.fail(`${kind} on ${p.name}: the mask leaves query block ${I} of head ${h} without a key block`);
          return false;
        }
        const want = referenceRow(host, dims, list[i], h, scale, v.mask);
        const err = rowError(got[i].subarray(h * p.d, (h + 1) * p.d), want);
        this.summary.checkedRows++;
        if (!(err <= worst)) worst = err;
      }
    }
    const w = this.summary.worstRowError;
    if (!(worst <= w[p.dtype])) w[p.dtype] = worst;
    if (!(worst <= ROW_TOLERANCE[p.dtype])) {
      this.fail(`${kind} on ${p.name}: a row's relative error is ${worst} (tolerance ${ROW_TOLERANCE[p.dtype]})`);
      return false;
    }
    return true;
  }

  /** Runs one call, checks how it ended and counts it. */
  async execute(call: Call): Promise<void> {
    const s = this.summary;
    const k = (s.byKind[call.kind] ??= emptyCounts());
    const f = (s.byFamily[call.family] ??= emptyCounts());
    const count = (fn: (c: KindCounts) => void) => {
      fn(k);
      fn(f);
    };
    count((c) => c.calls++);
    let outcome = 'ok';
    try {
      const res = await call.run();
      if (res) {
        try {
          const good = await this.check(call.kind, res);
          if (!good) count((c) => c.mismatched++);
          else if (!call.expect || call.mayPass) count((c) => c.ok++);
          if (call.expect && !call.mayPass) {
            count((c) => c.unexpected++);
            this.fail(`${call.kind}: expected ${call.expect.join(' or ')}, the call succeeded`);
          }
        } finally {
          res.release();
        }
      } else if (call.expect && !call.mayPass) {
        count((c) => c.unexpected++);
        this.fail(`${call.kind}: expected ${call.expect.join(' or ')}, the call succeeded`);
      } else count((c) => c.ok++);
    } catch (e) {
      outcome = isCrispError(e) ? e.code : `untyped ${(e as Error)?.name ?? typeof e}`;
      if (call.expect?.includes(outcome)) count((c) => c.ok++);
      else if (call.expect) {
        count((c) => c.unexpected++);
        this.fail(`${call.kind}: expected ${call.expect.join(' or ')}, got ${outcome}: ${(e as Error)?.message?.slice(0, 300)}`);
      } else {
        count((c) => c.failed++);
        this.fail(`${call.kind} (valid) threw ${outcome}: ${(e as Error)?.message?.slice(0, 300)}`);
      }
    } finally {
      await call.cleanup?.();
    }
    count((c) => {
      c.outcomes[outcome] = (c.outcomes[outcome] ?? 0) + 1;
    });
    s.byCode[outcome] = (s.byCode[outcome] ?? 0) + 1;
    s.completed++;
  }

  /** The random calls, until N or the time budget. */
  async runCalls(): Promise<void> {
    const N = this.summary.calls;
    for (let i = 0; i < N; i++) {
      if (this.opts.budgetMs !== undefined && this.elapsedMs > this.opts.budgetMs) {
        this.summary.stoppedEarly = true;
        this.log(`soak: time budget reached after ${i} of ${N} calls`);
        break;
      }
      await this.execute(this.h.draw());
      if ((i + 1) % 100 === 0) this.log(`soak: ${i + 1}/${N} calls, ${this.summary.failures.length} failures`);
    }
  }

  /** Each valid kind once on each problem (kernels compiled and loaded, inputs checked), checked and counted. */
  async warmUp(): Promise<void> {
    for (const p of this.h.problems) for (const kind of this.h.validKinds) await this.execute(this.h.valid(p, kind));
    this.summary.warmUpCalls = this.summary.completed;
    this.log(`soak: warmed up with ${this.summary.completed} calls`);
  }

  /** Totals, the memory verdict and the wall time. */
  finish(before: MemorySnapshot, after: MemorySnapshot): SoakSummary {
    const s = this.summary;
    const f = Object.values(s.byFamily);
    s.lost = f.reduce((a, c) => a + c.failed + c.mismatched, 0);
    s.unexpected = f.reduce((a, c) => a + c.unexpected, 0);
    const mem = s.memory;
    mem.before = before;
    mem.after = after;
    if (before.free !== undefined && after.free !== undefined) mem.freeDropBytes = before.free - after.free;
    if (before.liveBytes !== undefined && after.liveBytes !== undefined) mem.liveDeltaBytes = after.liveBytes - before.liveBytes;
    mem.leak = (mem.freeDropBytes ?? 0) > mem.toleranceBytes || (mem.liveDeltaBytes ?? 0) !== 0 || (after.pooledBytes ?? 0) !== 0;
    s.wallMs = this.elapsedMs;
    s.passed = s.lost === 0 && s.unexpected === 0 && !mem.leak && s.faultCases.every((c) => c.passed) && s.completed > 0;
    return s;
  }
}

/**
 * The whole soak on one backend: problems up, a warm-up call of each kind (kernels loaded),
 * the memory baseline, N random calls, the explicit fault cases (when `explicit` is given),
 * the memory again. Returns the summary; throws only for a broken harness.
 */
export async function runSoak(
  target: SoakTarget,
  opts: SoakOptions = {},
  explicit?: (soak: Soak) => Promise<FaultCaseResult[]>,
): Promise<SoakSummary> {
  const soak = new Soak(target, opts);
  await soak.setup();
  await soak.warmUp();
  const before = soak.snapshot();
  soak.log(`soak: baseline ${JSON.stringify(before)}`);
  await soak.runCalls();
  if (explicit) soak.summary.faultCases = await explicit(soak);
  const after = soak.snapshot();
  soak.log(`soak: after ${JSON.stringify(after)}`);
  return soak.finish(before, after);
}

export type { Problem };
