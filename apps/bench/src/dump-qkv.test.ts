// apps/bench/peers/dump_qkv.py: it compiles, it says what is missing without torch, and where
// torch and transformers are installed its --self-test (a random tiny Llama, dumped and
// checked against the model's own attention in float64) passes.
import { spawnSync } from 'node:child_process';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

const SCRIPT = fileURLToPath(new URL('../peers/dump_qkv.py', import.meta.url));
// (bytecode goes to a scratch folder, never beside the script)
const env = { ...process.env, PYTHONPYCACHEPREFIX: mkdtempSync(join(tmpdir(), 'crisp-pycache-')) };
const py = (args: string[], timeout = 60_000) => spawnSync('python3', args, { encoding: 'utf8', env, timeout });

const python = py(['--version']);
const hasPython = python.status === 0;
const torchCheck = hasPython ? py(['-c', 'import torch, transformers']) : undefined;
const hasTorch = torchCheck?.status === 0;
const why = !hasPython ? 'python3 is not installed' : !hasTorch ? `torch and transformers are not importable (${(torchCheck?.stderr ?? '').trim().split('\n').pop()})` : '';
if (why) console.log(`[dump_qkv.py] skipping --self-test: ${why}`);

describe.skipIf(!hasPython)('dump_qkv.py', () => {
  it('compiles', () => {
    const r = py(['-m', 'py_compile', SCRIPT]);
    expect(r.status, r.stderr).toBe(0);
  });

  it.skipIf(hasTorch)('without torch and transformers says what to install and exits with status 2', () => {
    for (const args of [['--model', 'x', '--out', join(tmpdir(), 'never'), '--text', 'hi'], ['--self-test']]) {
      const r = py([SCRIPT, ...args]);
      expect(r.status).toBe(2);
      expect(r.stderr).toMatch(/needs torch, transformers .*pip install torch transformers numpy/);
    }
  });

  it('refuses a call without --model, --out and a prompt, with usage', () => {
    const r = py([SCRIPT, '--model', 'x']);
    expect(r.status).toBe(2);
    expect(r.stderr).toMatch(/--model, --out and one of --text-file or --text are required/);
  });

  it.skipIf(!hasTorch)(`--self-test reproduces the model's attention from the dumped Q/K/V${why ? ` (skipped: ${why})` : ''}`, () => {
    const r = py([SCRIPT, '--self-test'], 300_000);
    expect(r.status, `${r.stdout}\n${r.stderr}`).toBe(0);
    expect(r.stdout).toMatch(/self-test passed: 3 layers/);
  }, 320_000);
});
