// Test helpers: run main() with captured output.
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
