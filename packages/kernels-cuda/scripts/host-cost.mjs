// The CUDA backend's host cost (JavaScript and FFI marshalling, no GPU): CRISP prefills at a
// Llama shape through the stand-in driver (src/stand-in-driver.ts), whose calls return at
// once: the host time from sparsePrefill's call to its first launch (the device waits for it)
// and to the attention's launch (the plan is queued by then; on the GPU machine the driver
// adds ~5-10 us a launch). The device reads come back as zeros (C_struct 0: every head routes
// to PE, and the device's PE list is empty).
//
//   pnpm -F @crisp/kernels-cuda build && node packages/kernels-cuda/scripts/host-cost.mjs [n] [plans] [sleepMs]
// sleepMs > 0: the process sleeps that long before each prefill (a timer, so the thread idles),
// as the host does while the GPU runs the previous call's attention: the host's path then
// starts cold (session 16: 0.064-0.092 ms to the first launch after 30 ms, 0.010-0.013 back to
// back, before that session's changes).
//   node --cpu-prof --cpu-prof-dir=/tmp/prof packages/kernels-cuda/scripts/host-cost.mjs
// A fourth argument `timeline` also prints each launch of a prefill with its median time from
// the call (session 19: where the host's cold path goes between the proxy pass's launch and
// the plan's last one), e.g. `host-cost.mjs 131072 150 30 timeline`.
import { sparsePrefill } from '@crisp/core';
import { crisp } from '@crisp/presets';
import { CudaBackend } from '../dist/cuda-backend.js';
import { standInDriver } from '../dist/stand-in-driver.js';

const n = Number(process.argv[2] ?? 131072);
const plans = Number(process.argv[3] ?? 400);
const sleepMs = Number(process.argv[4] ?? 0);
const timeline = process.argv[5] === 'timeline';
const H = 32;
const Hkv = 8;
const D = 128;

const { libs, log } = standInDriver({ heads: H });
// kernelDir from the cwd (the repository root), so that the bundled script finds the sources too
const be = new CudaBackend(libs, { cacheDir: null, kernelDir: 'packages/kernels-cuda/kernels' });
const q = be.allocate('bf16', [n, H, D]);
const k = be.allocate('bf16', [n, Hkv, D]);
const v = be.allocate('bf16', [n, Hkv, D]);
const inputs = { q, k, v };
const policy = crisp;
for (let i = 0; i < 50; i++) (await sparsePrefill(be, inputs, policy, { minSparseLength: 0 })).output.dispose();
log.length = 0;
const first = [];
const queued = [];
// each prefill's launches: [name, ms from the call]
const launchTimes = [];
for (let i = 0; i < plans; i++) {
  if (sleepMs > 0) await new Promise((resolve) => setTimeout(resolve, sleepMs));
  const from = log.length;
  const t0 = performance.now();
  const r = await sparsePrefill(be, inputs, policy, { minSparseLength: 0 });
  const launches = log.slice(from).filter((e) => e.kind === 'launch');
  first.push(launches[0].at - t0);
  queued.push(launches.find((e) => e.name.startsWith('attn_')).at - t0);
  if (timeline) launchTimes.push(launches.map((e) => [e.name, e.at - t0]));
  r.output.dispose();
}
const median = (a) => [...a].sort((x, y) => x - y)[a.length >> 1];
const med = (a) => median(a).toFixed(3);
console.log(
  `host cost of a CRISP prefill, n=${n} H=${H} Hkv=${Hkv} d=${D}, stand-in driver (median of ${plans}${sleepMs > 0 ? `, each after ${sleepMs} ms asleep` : ''}): ${med(first)} ms to the first launch, ${med(queued)} ms to the attention's launch`,
);
if (timeline) {
  // (prefills launch the same kernels in the same order here: the stand-in's reads are zeros)
  const count = Math.min(...launchTimes.map((l) => l.length));
  const rows = [];
  for (let j = 0; j < count; j++) rows.push(`  ${launchTimes[0][j][0].padEnd(44)} ${(1000 * median(launchTimes.map((l) => l[j][1]))).toFixed(1)} us`);
  console.log(`launches, median time from the call:\n${rows.join('\n')}`);
}
const per = {};
for (const e of log) per[e.kind] = (per[e.kind] ?? 0) + 1 / plans;
console.log(`launches and reads a prefill: ${JSON.stringify(per)}`);
be.dispose();
