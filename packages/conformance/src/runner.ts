/**
 * runConformance: the whole suite against any backend factory, in plain Node (no test
 * framework), returning one result per case. GPU machines run it from a script.
 */
import { type Backend, type DType, DTYPES, InvalidArgumentError, type Policy } from '@crisp/core';
import { createReferenceBackend } from '@crisp/reference';
import { type CaseContext, type ConformanceCase, LARGE_SIZES, type ShapeCase, SMALL_SIZES, buildCases } from './cases.js';
import { DEFAULT_TOLERANCES, type Tolerance } from './compare.js';
import { defaultPolicies } from './policies.js';
import { caseSeed, randomSeed } from './random.js';
import { buildLseMergeCases } from './lse-merge-cases.js';
import { LARGE_VARLEN, SMALL_VARLEN, type VarlenShapeCase, buildVarlenCases } from './varlen-cases.js';

export type BackendFactory = () => Backend | Promise<Backend>;

export interface ConformanceOptions {
  /** run seed (each case mixes in its name); default random, printed in every result */
  readonly seed?: number;
  /** shapes: a list, or the 'small' (default, CI) or 'large' (n up to 65536) preset */
  readonly sizes?: readonly ShapeCase[] | 'small' | 'large';
  /**
   * ragged batches for the varlen cases: a list, a preset, or 'none'; default the preset
   * `sizes` names ('small' or 'large'), none with a list of sizes
   */
  readonly varlenSizes?: readonly VarlenShapeCase[] | 'small' | 'large' | 'none';
  /** default: every dtype the backend declares (all three for the vitest layer's listing) */
  readonly dtypes?: readonly DType[];
  /** policies for the pipeline cases; default @crisp/presets' crisp and flexPrefill and their B = 64 copies */
  readonly policies?: readonly Policy[];
  /** case name (or a pattern with * wildcards) -> why it is skipped */
  readonly skip?: Readonly<Record<string, string>>;
  /** only run cases whose name matches (substring or RegExp) */
  readonly filter?: string | RegExp;
  /**
   * Run only every `count`-th case from the `index`-th (0-based), after `filter`: `count`
   * processes with indexes 0..count-1 run the whole suite between them, each case once (the
   * float64 reference is single-threaded; a GPU host has cores to spare).
   */
  readonly shard?: { readonly index: number; readonly count: number };
  /** per-dtype tolerance overrides */
  readonly tolerances?: Partial<Record<DType, Partial<Tolerance>>>;
  /** exact checks on every query row up to this n (default 2048); above it, sampled rows */
  readonly fullCheckLimit?: number;
  /** sampled query rows for long shapes (default 64) */
  readonly sampleCount?: number;
  /** called after each case (progress output in scripts) */
  readonly onResult?: (r: CaseResult) => void;
}

export interface CaseResult {
  readonly name: string;
  readonly passed: boolean;
  /** set when the case did not run: skipped by options or beyond the backend's capabilities */
  readonly skipped?: string;
  readonly maxError: number;
  readonly tolerance: number;
  /** the case's own seed (rerun: same run seed, or filter to this case) */
  readonly seed: number;
  /** what went wrong, with the seeds to reproduce it */
  readonly detail: string;
}

export interface ConformanceReport {
  readonly backend: string;
  readonly seed: number;
  readonly passed: boolean;
  readonly counts: { readonly passed: number; readonly failed: number; readonly skipped: number };
  readonly results: readonly CaseResult[];
}

function resolveSizes(s: ConformanceOptions['sizes']): readonly ShapeCase[] {
  if (s === undefined || s === 'small') return SMALL_SIZES;
  if (s === 'large') return LARGE_SIZES;
  return s;
}

function resolveVarlen(o: ConformanceOptions): readonly VarlenShapeCase[] {
  const v = o.varlenSizes ?? (Array.isArray(o.sizes) ? 'none' : (o.sizes ?? 'small'));
  if (v === 'none') return [];
  if (v === 'small') return SMALL_VARLEN;
  if (v === 'large') return LARGE_VARLEN;
  return v as readonly VarlenShapeCase[];
}

/** The cases a run with these options would hold (before capability checks). */
export function listConformanceCases(options: ConformanceOptions = {}): ConformanceCase[] {
  const dtypes = options.dtypes ?? DTYPES;
  const policies = options.policies ?? defaultPolicies();
  const cases = [
    ...buildCases({ sizes: resolveSizes(options.sizes), dtypes, policies }),
    ...buildVarlenCases(resolveVarlen(options), dtypes, policies),
    ...buildLseMergeCases(resolveSizes(options.sizes), dtypes),
  ];
  const f = options.filter;
  const kept = f === undefined ? cases : cases.filter((c) => (typeof f === 'string' ? c.name.includes(f) : f.test(c.name)));
  const sh = options.shard;
  if (sh === undefined) return kept;
  if (!Number.isInteger(sh.count) || sh.count < 1 || !Number.isInteger(sh.index) || sh.index < 0 || sh.index >= sh.count) {
    throw new InvalidArgumentError(`shard must be { index, count } with integers 0 <= index < count; got ${JSON.stringify(sh)}`);
  }
  return kept.filter((_, i) => i % sh.count === sh.index);
}

/** Why a case is skipped by options, if it is. */
export function skipReason(name: string, skip: ConformanceOptions['skip']): string | undefined {
  if (!skip) return undefined;
  if (skip[name] !== undefined) return skip[name];
  for (const [pattern, why] of Object.entries(skip)) {
    if (!pattern.includes('*')) continue;
    const re = new RegExp(`^${pattern.split('*').map((p) => p.replace(/[.+?^${}()|[\]\\]/g, '\\$&')).join('.*')}$`);
    if (re.test(name)) return why;
  }
  return undefined;
}

/** Why a backend cannot run a case (declared capabilities), if it cannot. */
export function capabilityGap(backend: Backend, c: ConformanceCase): string | undefined {
  const caps = backend.capabilities;
  if (!caps.dtypes.includes(c.dtype)) return `backend does not take ${c.dtype}`;
  if (!caps.headDims.includes(c.shape.headDim)) return `backend has no head dim ${c.shape.headDim}`;
  if (!caps.blockSizes.includes(c.needs.blockSize)) return `backend has no block size ${c.needs.blockSize}`;
  if (c.shape.n > caps.maxSequence) return `n = ${c.shape.n} exceeds the backend's maxSequence ${caps.maxSequence}`;
  if (c.needs.chunked && !caps.chunkedPrefill) return 'backend has no chunked prefill';
  if (c.needs.lse && !caps.logSumExp) return 'backend returns no log-sum-exp';
  if (c.needs.varlen && (typeof backend.varlenAttention !== 'function' || typeof backend.sliceRows !== 'function')) {
    return 'backend has no varlenAttention / sliceRows (ragged batches)';
  }
  if (c.needs.deviceSelector && !backend.planner?.selectors.includes(c.needs.deviceSelector)) {
    return `backend does not select with ${c.needs.deviceSelector} on the device`;
  }
  if (c.needs.deviceRouter && !backend.planner?.routers.includes(c.needs.deviceRouter)) {
    return `backend does not route with ${c.needs.deviceRouter} on the device`;
  }
  if (c.needs.narrowedPeLists && backend.planner?.peVsExcess !== true) {
    return "backend's planner does not narrow PE heads' lists on the device (DevicePlanner.peVsExcess; CUDA: peVsExcessOnDevice)";
  }
  if (c.needs.narrowedPeLists && backend.planner?.peVs !== true) {
    return "backend's planner does not take PE heads' lists at their own α (DevicePlanner.peVs)";
  }
  return undefined;
}

/** A run's shared state: the backend under test, the reference, tolerances. */
export class ConformanceSession {
  readonly seed: number;
  readonly backend: Backend;
  readonly reference: Backend;
  readonly #options: ConformanceOptions;
  private constructor(backend: Backend, seed: number, options: ConformanceOptions) {
    this.backend = backend;
    this.reference = createReferenceBackend();
    this.seed = seed;
    this.#options = options;
  }
  static async open(factory: BackendFactory, options: ConformanceOptions = {}): Promise<ConformanceSession> {
    const seed = options.seed ?? randomSeed();
    return new ConformanceSession(await factory(), seed, options);
  }
  tolerance(dtype: DType): Tolerance {
    return { ...DEFAULT_TOLERANCES[dtype], ...this.#options.tolerances?.[dtype] };
  }
  /** Run one case; never throws (an exception is a failed result naming it). */
  async run(c: ConformanceCase): Promise<CaseResult> {
    const seed = caseSeed(this.seed, c.name);
    const repro = `seed ${seed} (run seed ${this.seed}: runConformance(factory, { seed: ${this.seed}, filter: '${c.name}' }))`;
    const base = { name: c.name, seed, tolerance: 0, maxError: 0 };
    const skip = skipReason(c.name, this.#options.skip) ?? capabilityGap(this.backend, c);
    if (skip !== undefined) return { ...base, passed: true, skipped: skip, detail: `skipped: ${skip}` };
    const ctx: CaseContext = {
      backend: this.backend,
      reference: this.reference,
      seed,
      tolerance: this.tolerance(c.dtype),
      fullCheckLimit: this.#options.fullCheckLimit ?? 2048,
      sampleCount: this.#options.sampleCount ?? 64,
    };
    try {
      const o = await c.run(ctx);
      return { ...base, ...o, detail: o.passed ? o.detail : `${o.detail}\n${repro}` };
    } catch (e) {
      const err = e as Error & { code?: string };
      return {
        ...base,
        passed: false,
        maxError: Number.POSITIVE_INFINITY,
        tolerance: ctx.tolerance.output,
        detail: `threw ${err?.name ?? 'error'}${err?.code ? ` [${err.code}]` : ''}: ${err?.message ?? String(e)}\n${repro}`,
      };
    }
  }
  close(): void {
    this.backend.dispose();
    this.reference.dispose();
  }
}

/**
 * Run the suite: every case for the options against a fresh backend from `factory`,
 * compared with @crisp/reference. Resolves with a report; does not throw on failures.
 */
export async function runConformance(factory: BackendFactory, options: ConformanceOptions = {}): Promise<ConformanceReport> {
  const session = await ConformanceSession.open(factory, options);
  const results: CaseResult[] = [];
  try {
    const dtypes = options.dtypes ?? session.backend.capabilities.dtypes;
    for (const c of listConformanceCases({ ...options, dtypes })) {
      const r = await session.run(c);
      results.push(r);
      options.onResult?.(r);
    }
  } finally {
    session.close();
  }
  const skipped = results.filter((r) => r.skipped !== undefined).length;
  const failed = results.filter((r) => !r.passed).length;
  return {
    backend: session.backend.name,
    seed: session.seed,
    passed: failed === 0,
    counts: { passed: results.length - failed - skipped, failed, skipped },
    results,
  };
}

/** A short text summary: one line per failure, with details. */
export function formatReport(r: ConformanceReport): string {
  const lines = [
    `conformance ${r.backend}: ${r.counts.passed} passed, ${r.counts.failed} failed, ${r.counts.skipped} skipped (run seed ${r.seed})`,
  ];
  for (const x of r.results) if (!x.passed) lines.push(`FAIL ${x.name}\n  ${x.detail.replace(/\n/g, '\n  ')}`);
  return lines.join('\n');
}
