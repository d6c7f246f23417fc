/**
 * `pnpm --filter @crisp/io fuzz -- --seconds 180 [--seed N] [--out fuzz-results.json]`:
 * mutation fuzzing of the safetensors and .npy parsers for a given time. Prints the
 * summary (inputs per parser, outcomes by error code, crashes) and, with --out, writes it as
 * JSON (whole or not at all: a temporary file renamed into place); exits 1 if anything crashed.
 */
import { rename, writeFile } from 'node:fs/promises';
import { resolve } from 'node:path';
import { fuzz } from './fuzz-lib.js';

function arg(name: string, fallback: string): string {
  const argv = process.argv.slice(2).filter((a) => a !== '--');
  const at = argv.indexOf(`--${name}`);
  return at >= 0 && at + 1 < argv.length ? argv[at + 1] : fallback;
}

const seconds = Number(arg('seconds', '60'));
const seed = Number(arg('seed', String(Math.floor(Math.random() * 2 ** 31))));
const outArg = arg('out', '');
const out = outArg === '' ? undefined : resolve(outArg);
if (!(seconds > 0) || !Number.isSafeInteger(seed)) {
  console.error('usage: fuzz [--seconds N] [--seed N] [--out FILE]  (N > 0)');
  process.exit(2);
}
console.log(`fuzzing the safetensors and .npy parsers for ${seconds} s (seed ${seed}) ...`);
const summary = await fuzz({ seconds, seed });
if (out !== undefined) {
  const tmp = `${out}.${process.pid}.tmp`;
  await writeFile(tmp, `${JSON.stringify(summary, null, 2)}\n`);
  await rename(tmp, out);
}
for (const [target, s] of Object.entries(summary.targets)) {
  const codes = Object.entries(s.outcomes)
    .sort((a, b) => b[1] - a[1])
    .map(([c, k]) => `${c} ${k}`)
    .join(', ');
  console.log(`${target.padEnd(12)} ${String(s.inputs).padStart(9)} inputs, ${s.crashes} crashes (${codes})`);
}
console.log(`${summary.totalInputs} inputs in all, ${summary.crashes.length} crashes${out ? `; summary written to ${out}` : ''}`);
if (summary.crashes.length > 0) {
  for (const c of summary.crashes.slice(0, 3)) console.error(`\n[${c.target}] ${c.error}\ninput (base64): ${c.inputBase64}`);
  process.exit(1);
}
