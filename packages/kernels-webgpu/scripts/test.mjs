// `pnpm test` of this package: the vitest suite as two processes at once, each one Dawn
// device with its modules shared across its files (vitest.config.ts). The first runs the
// files that share the default kernels' pipelines (each compiled once; on SwiftShader a
// compile takes seconds); the second the files whose pipelines are their own anyway: the
// FMA, subgroup-matrix and unknown attention kernels, a device of their own (device loss),
// and the TF.js and ONNX Runtime peers with their own shaders. On 2 cores the suite then
// ends when the longer half does, not after both. Extra arguments go to both runs.
import { spawn } from 'node:child_process';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';

const OWN_PIPELINES = ['src/attention-kernels.test.ts', 'src/device-loss.test.ts', 'src/ort-peer.test.ts', 'src/tfjs-peer.test.ts'];
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
