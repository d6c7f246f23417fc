#!/usr/bin/env node
/**
 * `pnpm test`: every check CI runs, each one run even when one before it failed, so one
 * failure does not hide the others' results; the exit status is 1 when any failed, with a
 * closing table of what passed and what did not.
 *
 * - lint and import cycles;
 * - the typecheck (one program over the Node-side packages, tsconfig.workspace.json, and the
 *   few packages with compiler options of their own) and the vitest suites of every package,
 *   in parallel under turbo with `--continue` (turbo otherwise stops the suites still running
 *   at the first failure), and
 *   in the same run `test:heavy` (the nvcc compile check of @crisp/kernels-cuda, minutes of
 *   CPU), whose nvcc runs at a low CPU priority (nice 10): it fills the CPU the suites leave idle
 *   towards their end (a few long suites, one process each) instead of running after them;
 * - the API reference (`pnpm docs:api`: TypeDoc over every published entry, warnings such as
 *   a broken `{@link}` or a referenced type that is not exported fail it), beside
 * - the tarball check (tools/pack-check), then `pnpm -r publish --dry-run`: TypeDoc reads the
 *   sources and writes only docs/api, the tarball check builds (cache hits after the suites)
 *   and packs, so the two share nothing but the CPU (one process each, on 2 cores).
 *
 * Steps of one `group` run at once; the output of each is shown whole when it ends.
 * `pnpm test -- --only suites,api-docs` runs only the named steps.
 */
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';

const root = fileURLToPath(new URL('../..', import.meta.url));
const pnpm = process.platform === 'win32' ? 'pnpm.cmd' : 'pnpm';

/** `after`: the step waits for that one (in the same group) and runs after it. */
const steps = [
  { name: 'lint', cmd: [pnpm, 'lint'] },
  { name: 'cycles', cmd: [pnpm, 'cycles'] },
  { name: 'suites', cmd: [pnpm, 'exec', 'turbo', 'run', 'typecheck', 'typecheck:workspace', 'test', 'test:heavy', '--continue'] },
  { name: 'api-docs', cmd: [pnpm, 'docs:api'], group: 'publish' },
  { name: 'pack', cmd: [process.execPath, 'tools/pack-check/src/main.mjs'], group: 'publish' },
  { name: 'publish-dry-run', cmd: [pnpm, 'release:check'], group: 'publish', after: 'pack' },
];

const at = process.argv.indexOf('--only');
const only = at >= 0 ? new Set((process.argv[at + 1] ?? '').split(',')) : undefined;
const unknown = only ? [...only].filter((n) => !steps.some((s) => s.name === n)) : [];
if (unknown.length) {
  console.error(`test: unknown step ${unknown.join(', ')}; the steps are ${steps.map((s) => s.name).join(', ')}`);
  process.exit(2);
}

const shown = (cmd) => cmd.slice(cmd[0] === process.execPath ? 1 : 0).join(' ');

/** Runs one step; `quiet` buffers its output and prints it whole at the end (steps run at once). */
function runStep(step, quiet) {
  return new Promise((resolve) => {
    const t0 = Date.now();
    if (!quiet) console.log(`\ntest: ${step.name}: ${shown(step.cmd)}`);
    const child = spawn(step.cmd[0], step.cmd.slice(1), { cwd: root, stdio: quiet ? ['ignore', 'pipe', 'pipe'] : 'inherit' });
    const out = [];
    child.stdout?.on('data', (b) => out.push(b));
    child.stderr?.on('data', (b) => out.push(b));
    let ended = false;
    const done = (status) => {
      if (ended) return;
      ended = true;
      if (quiet) {
        console.log(`\ntest: ${step.name}: ${shown(step.cmd)}`);
        process.stdout.write(Buffer.concat(out));
      }
      resolve({ name: step.name, status, s: (Date.now() - t0) / 1000 });
    };
    child.on('error', (e) => done(`could not start: ${e.message}`));
    child.on('close', (code, signal) => done(code === 0 ? 'ok' : `FAILED (exit ${code ?? signal})`));
  });
}

const chosen = steps.filter((s) => !only || only.has(s.name));
const results = [];
for (let i = 0; i < chosen.length; ) {
  const group = chosen[i].group;
  const batch = group === undefined ? [chosen[i]] : chosen.filter((s) => s.group === group);
  i += batch.length;
  const quiet = batch.length > 1;
  const started = new Map();
  for (const step of batch) {
    const before = step.after && batch.find((s) => s.name === step.after) ? started.get(step.after) : undefined;
    started.set(step.name, before ? before.then(() => runStep(step, quiet)) : runStep(step, quiet));
  }
  for (const r of await Promise.all(started.values())) results.push(r);
}

console.log('\ntest: summary');
for (const r of results) console.log(`test:   ${r.name.padEnd(16)} ${r.status.padEnd(18)} ${r.s.toFixed(0).padStart(4)} s`);
const failed = results.filter((r) => r.status !== 'ok');
console.log(failed.length ? `test: ${failed.length} of ${results.length} steps failed: ${failed.map((r) => r.name).join(', ')}` : `test: all ${results.length} steps passed`);
process.exit(failed.length ? 1 : 0);
