/** What every suite gets: the settings, a logger, and a guard against GPU work that never returns. */
import type { BenchConfig } from './config.js';

export interface SuiteContext {
  readonly config: BenchConfig;
  readonly repoRoot?: string;
  /** the command line that reproduces this run */
  readonly command: string;
  log(message: string): void;
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
