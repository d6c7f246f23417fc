#!/usr/bin/env node
/**
 * `pnpm test`: every check CI runs, in order, each one run even when one before it failed,
 * so one failure does not hide the others' results; the exit status is 1 when any failed,
 * with a closing table of what passed and what did not.
 *
 * - lint and import cycles;
 * - the typecheck and vitest suites of every package, in parallel under turbo with
 *   `--continue` (turbo otherwise stops the suites still running at the first failure);
 * - `test:heavy` (the nvcc compile check of @crisp/kernels-cuda, minutes of CPU) after them,
 *   alone, so its time limit holds however loaded the machine was by the parallel suites;
 * - the API reference (`pnpm docs:api`: TypeDoc over every published entry, warnings such as
 *   a broken `{@link}` or a referenced type that is not exported fail it);
 * - the tarball check (tools/pack-check) and `pnpm -r publish --dry-run`.
 *
 * `pnpm test -- --only suites,api-docs` runs only the named steps.
 */
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';

const root = fileURLToPath(new URL('../..', import.meta.url));
const pnpm = process.platform === 'win32' ? 'pnpm.cmd' : 'pnpm';

const steps = [
  { name: 'lint', cmd: [pnpm, 'lint'] },
  { name: 'cycles', cmd: [pnpm, 'cycles'] },
  { name: 'suites', cmd: [pnpm, 'exec', 'turbo', 'run', 'typecheck', 'test', '--continue'] },
  { name: 'heavy', cmd: [pnpm, 'exec', 'turbo', 'run', 'test:heavy', '--continue'] },
  { name: 'api-docs', cmd: [pnpm, 'docs:api'] },
  { name: 'pack', cmd: [process.execPath, 'tools/pack-check/src/main.mjs'] },
  { name: 'publish-dry-run', cmd: [pnpm, 'release:check'] },
];

const at = process.argv.indexOf('--only');
const only = at >= 0 ? new Set((process.argv[at + 1] ?? '').split(',')) : undefined;
const unknown = only ? [...only].filter((n) => !steps.some((s) => s.name === n)) : [];
if (unknown.length) {
  console.error(`test: unknown step ${unknown.join(', ')}; the steps are ${steps.map((s) => s.name).join(', ')}`);
  process.exit(2);
}

const results = [];
for (const step of steps) {
  if (only && !only.has(step.name)) continue;
  const t0 = Date.now();
  console.log(`\ntest: ${step.name}: ${step.cmd.slice(step.cmd[0] === process.execPath ? 1 : 0).join(' ')}`);
  const r = spawnSync(step.cmd[0], step.cmd.slice(1), { cwd: root, stdio: 'inherit' });
  const status = r.error ? `could not start: ${r.error.message}` : r.status === 0 ? 'ok' : `FAILED (exit ${r.status ?? r.signal})`;
  results.push({ name: step.name, status, s: (Date.now() - t0) / 1000 });
}

console.log('\ntest: summary');
for (const r of results) console.log(`test:   ${r.name.padEnd(16)} ${r.status.padEnd(18)} ${r.s.toFixed(0).padStart(4)} s`);
const failed = results.filter((r) => r.status !== 'ok');
console.log(failed.length ? `test: ${failed.length} of ${results.length} steps failed: ${failed.map((r) => r.name).join(', ')}` : `test: all ${results.length} steps passed`);
process.exit(failed.length ? 1 : 0);
