/** What every suite gets: the settings, a logger, the run's deadline, and a guard against GPU work that never returns. */
import type { BenchConfig } from './config.js';

export interface SuiteContext {
  readonly config: BenchConfig;
  readonly repoRoot?: string;
  /** the command line that reproduces this run */
  readonly command: string;
  log(message: string): void;
  /**
   * Milliseconds left before the run's --deadline-s (Infinity without one). A suite starts
   * no new size or profile whose projected time exceeds it and reports the skip instead,
   * so the run ends with its figures written rather than being killed mid-way.
   */
  timeLeftMs?(): number;
  /**
   * Hand the suite's results so far to the run, which writes bench.json and bench.md at
   * once: a run killed at a wall-clock limit still leaves every finished size on disk.
   */
  progress?(suite: 'latency' | 'accuracy' | 'onCurve' | 'floors' | 'varlen' | 'parity' | 'parallel', partial: unknown): void;
}

/** Time left before the run's deadline (Infinity when there is none). */
export function timeLeft(ctx: SuiteContext): number {
  return ctx.timeLeftMs ? ctx.timeLeftMs() : Number.POSITIVE_INFINITY;
}

/** The reason recorded for work not started because the deadline would be passed. */
export function deadlineReason(projectedMs: number, leftMs: number): string {
  return `--deadline-s: projected ${(projectedMs / 1000).toFixed(0)} s, ${(Math.max(leftMs, 0) / 1000).toFixed(0)} s left of the run`;
}

/** Reject when `p` has not settled after `ms` (a lost device must not hang the run). */
export function withTimeout<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what} did not finish within ${Math.round(ms / 1000)} s`)), ms);
  });
  return Promise.race([p, timeout]).finally(() => clearTimeout(timer));
}

export function message(e: unknown): string {
  return e instanceof Error ? e.message : String(e);
}
