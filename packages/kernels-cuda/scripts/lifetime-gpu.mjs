// Host memory over a loop of awaited CRISP prefills in one job (the GPU machine): session 20
// found that the backend's WeakRef to every statistics object kept each plan's statistics, and
// the 0.8 MB (128k) its eviction downloads into them, alive until the job ended, and a layer
// loop of `await sparsePrefill(...)` is one job (6fd6484 fixed it on the stand-in driver). This
// prints the process's array-buffer bytes and RSS after a full collection every 50 prefills,
// then once more after the job, for one build (a bundle from apps/bench/scripts/host-ab-pack.sh):
//
//   bash apps/bench/scripts/host-ab-pack.sh 4ac4bd9 HEAD
//   node apps/bench/scripts/bundle.mjs packages/kernels-cuda/scripts/lifetime-gpu.mjs .device/app/lifetime-gpu.mjs
//   (on the GPU machine, from the repository root)
//   node --expose-gc .device/app/lifetime-gpu.mjs .device/app/ab-<commit>.mjs [n=131072] [prefills=400]
// CRISP_AB_STAND_IN=1 runs it through the stand-in driver (no GPU; the bundle exports it).
import { resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { sparsePrefill } from '@crisp/core';
import { crisp } from '@crisp/presets';
import { buildDriver, buildOptions, llamaLayer } from './gpu-layer.mjs';

const [bundle, nArg, countArg] = process.argv.slice(2);
if (!bundle || typeof globalThis.gc !== 'function') {
  console.error('usage: node --expose-gc lifetime-gpu.mjs <bundle> [n=131072] [prefills=400]');
  process.exit(2);
}
const n = Number(nArg ?? 131072);
const count = Number(countArg ?? 400);
const M = await import(pathToFileURL(resolve(bundle)).href);
const be = new M.CudaBackend(buildDriver(M), buildOptions(M));
const { inputs, out } = llamaLayer(be, n);
const mb = (x) => (x / 2 ** 20).toFixed(1);
const show = (label) => {
  globalThis.gc();
  const m = process.memoryUsage();
  console.log(`${label}: arrayBuffers ${mb(m.arrayBuffers)} MB, rss ${mb(m.rss)} MB, heapUsed ${mb(m.heapUsed)} MB`);
};
show(`${bundle} n=${n}, before`);
const t0 = performance.now();
for (let i = 1; i <= count; i++) {
  await sparsePrefill(be, inputs, crisp, { minSparseLength: 0, out });
  if (i % 50 === 0 || i === count) show(`${i} prefills (${((performance.now() - t0) / 1000).toFixed(1)} s)`);
}
// the job ends here: a macrotask, then a collection
await new Promise((r) => setTimeout(r, 0));
show('after the job');
be.dispose();
