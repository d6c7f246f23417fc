// Test helpers: run main() with captured output, temporary directories.
import { mkdtempSync, readdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { CliIo } from './cli-io.js';
import { main } from './main.js';

export interface Captured {
  readonly code: number;
  readonly stdout: string;
  readonly stderr: string;
}

export async function runCli(args: readonly string[]): Promise<Captured> {
  let stdout = '';
  let stderr = '';
  const io: CliIo = {
    stdout: { write: (s: string) => (stdout += s), isTTY: false },
    stderr: { write: (s: string) => (stderr += s), isTTY: false },
  };
  const code = await main(['node', 'crisp', ...args], io);
  return { code, stdout, stderr };
}

/** Fresh seed per test run, printed so a failure can be replayed with CRISP_TEST_SEED. */
export function testSeed(): number {
  const seed = Number(process.env.CRISP_TEST_SEED ?? Math.floor(Math.random() * 2 ** 31));
  console.log(`cli tests: seed ${seed} (replay with CRISP_TEST_SEED=${seed})`);
  return seed;
}

/** A fresh, empty temporary directory. */
export function tempDir(prefix = 'crisp-cli-'): string {
  return mkdtempSync(join(tmpdir(), prefix));
}

/** Every path under `dir` (relative, sorted), hidden files included: to prove nothing was written. */
export function listTree(dir: string): string[] {
  const out: string[] = [];
  const walk = (rel: string) => {
    for (const e of readdirSync(join(dir, rel), { withFileTypes: true })) {
      const p = rel ? `${rel}/${e.name}` : e.name;
      out.push(p);
      if (e.isDirectory()) walk(p);
    }
  };
  walk('');
  return out.sort();
}
