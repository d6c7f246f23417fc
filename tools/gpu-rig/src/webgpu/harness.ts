/** The results record (written to --out after every item), the log, and the timing and time-limit helpers. */
import { appendFileSync, writeFileSync } from 'node:fs';
import { D, H, args, budgetMs, jsonPath, logPath } from './args.js';
import type { Gpu } from './tensors.js';

const started = performance.now();
export const elapsed = () => performance.now() - started;
export const left = (frac: number) => budgetMs * frac - elapsed();
export const result: Record<string, unknown> = { started: new Date().toISOString(), args: Object.fromEntries(args), node: process.version };
export const save = () => writeFileSync(jsonPath, JSON.stringify(result, null, 1));
writeFileSync(logPath, '');
export const log = (...a: unknown[]) => {
  const line = `[${(elapsed() / 1000).toFixed(1)}s] ${a.map((x) => (typeof x === 'string' ? x : JSON.stringify(x))).join(' ')}`;
  console.log(line);
  appendFileSync(logPath, `${line}\n`);
};

export function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)];
}

export const causalFlops = (n: number) => 4 * D * H * ((n * (n + 1)) / 2);

export async function timeIt(g: Gpu, f: () => Promise<unknown>, reps: number): Promise<number[]> {
  await f();
  await g.b.synchronize();
  const ts: number[] = [];
  for (let r = 0; r < reps; r++) {
    const t0 = performance.now();
    await f();
    await g.b.synchronize();
    ts.push(performance.now() - t0);
  }
  return ts;
}

/**
 * A hung kernel never resolves its promise: give up after `ms`, mark the variant, and let
 * the run go on (each variant has its own device, so the others keep working).
 */
export async function withTimeout<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const t = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: no result after ${(ms / 1000).toFixed(0)} s (hung or far too slow)`)), ms);
  });
  try {
    return await Promise.race([p, t]);
  } finally {
    clearTimeout(timer);
  }
}

export function reps(n: number): number {
  // short runs (8k: ~22 ms) get more samples: their median is what the 25 TFLOP/s target reads
  return n >= 32768 ? 3 : n >= 16384 ? 5 : 9;
}
