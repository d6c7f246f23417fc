// `pnpm test` of this package: the vitest suite as two processes at once, each one Dawn
// device with its modules shared across its files (vitest.config.ts), so a WGSL pipeline is
// compiled once per process (on SwiftShader a compile takes seconds). As one process the
// suite ran on one core for minutes after every other suite had ended. The second process
// takes attention-kernels (the FMA kernel in f16 and f32 at d 64 and 128, dispatch splitting,
// the subgroup-matrix and unknown kernels), device-loss (a device of its own), the TF.js
// and ONNX Runtime peers (their libraries' shaders), varlen and the conformance suite's varlen
// cases (the varlen kernel; they left the first process the last suite running in CI), the
// conformance suite's longest pipeline cases (n = 2100: the default kernels, which the varlen
// pipeline cases compile here anyway), device-plan (the device planner's kernels, which those
// pipeline cases compile here too), primitives (its f16 d 128 attention is
// attention-kernels') and faults (its wrapped device shares the pipelines of the first
// device); the first the rest, which share the default kernels' pipelines with the
// conformance suite. On 2 idle cores the two take 217 and 210 s, 424 s of CPU. Before
// WebAssembly was kept on V8's baseline compiler (vitest.config.ts) they took 266 and 260 s,
// and 309-334 and 234 s with the long pipeline cases and device-plan in the first. Only the
// pipelines that both halves use are compiled twice: moving a file whose kernels the first
// process compiles anyway costs the compile time again (device-coverage, readme and soak:
// about 70 s of CPU more). Extra arguments go to both runs.
import { spawn } from 'node:child_process';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';

const OWN_PIPELINES = [
  'src/attention-kernels.test.ts',
  'src/conformance-long.test.ts',
  'src/conformance-varlen.test.ts',
  'src/device-loss.test.ts',
  'src/device-plan.test.ts',
  'src/faults.test.ts',
  'src/ort-peer.test.ts',
  'src/primitives.test.ts',
  'src/tfjs-peer.test.ts',
  'src/varlen.test.ts',
];
const manifest = createRequire(import.meta.url).resolve('vitest/package.json');
const vitest = join(dirname(manifest), 'vitest.mjs');
const extra = process.argv.slice(2);
const runs = [
  ['run', ...OWN_PIPELINES.flatMap((f) => ['--exclude', f]), ...extra],
  ['run', ...OWN_PIPELINES, ...extra],
];
const codes = await Promise.all(
  runs.map(
    (args) =>
      new Promise((resolve) => {
        const child = spawn(process.execPath, [vitest, ...args], { stdio: 'inherit' });
        child.on('error', () => resolve(1));
        child.on('close', (code) => resolve(code ?? 1));
      }),
  ),
);
process.exit(codes.some((c) => c !== 0) ? 1 : 0);
