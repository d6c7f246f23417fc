/** The run's results record (written to --out after every step), its log and the timed, budgeted step runner. */
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { budget, outDir, peerDir, phase } from './args.js';

const t0 = performance.now();
export const elapsed = () => performance.now() - t0;
mkdirSync(outDir, { recursive: true });
mkdirSync(peerDir, { recursive: true });

// biome-ignore lint/suspicious/noExplicitAny: a free-form results record
export const results: Record<string, any> = { started: new Date().toISOString(), phase, steps: {} };
export const save = () => writeFileSync(join(outDir, 'cuda-bench.json'), JSON.stringify(results, null, 1));
export const log = (s: string) => console.log(`[${(elapsed() / 1000).toFixed(1)}s] ${s}`);

export async function step(name: string, fn: () => Promise<unknown>): Promise<void> {
  if (elapsed() > budget) {
    results.steps[name] = { skipped: `time budget ${budget / 1000}s used` };
    log(`skip ${name}`);
    save();
    return;
  }
  const s = performance.now();
  try {
    results.steps[name] = await fn();
  } catch (e) {
    results.steps[name] = { error: String((e as Error)?.stack ?? e) };
    log(`ERROR in ${name}: ${(e as Error).message}`);
  }
  results.steps[name] = { ...(results.steps[name] ?? {}), wallMs: performance.now() - s };
  log(`done ${name}`);
  save();
}

export const median = (a: number[]) => {
  const s = [...a].sort((x, y) => x - y);
  return s[Math.floor(s.length / 2)];
};
export const causalFlops = (n: number, H: number, d: number) => 2 * n * n * H * d; // 4·n²/2·H·d
