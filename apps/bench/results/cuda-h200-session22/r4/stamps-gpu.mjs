// Experiment (session 22, branch wip/stamps): the host's clock at fixed points of a 128k CRISP
// prefill's path to the proxy pass's launch, from an idle device (after the previous prefill's
// synchronize) and behind a 3 ms device head start. Points (globalThis.__st, first hit a prefill):
// 0 sparsePrefill entered, 1 its mark recorded, 2 buildPlan's checks done, 3 proxyStats called,
// 4 proxyStats entered, 5 its checks done, 6 its scratch taken, 7 before the pass's #launch,
// 9 #launch before the driver call, 8 after the pass's #launch.
import { sparsePrefill } from '@crisp/core';
import { crisp } from '@crisp/presets';
import { CudaBackend } from '../src/cuda-backend.ts';
import { loadCuda } from '../src/ffi.ts';
import { standInDriver } from '../src/stand-in-driver.ts';
import { llamaLayer } from './gpu-layer.mjs';

const n = Number(process.argv[2] ?? 131072);
const reps = Number(process.argv[3] ?? 100);
const st = new Float64Array(10);
globalThis.__st = (i) => {
  if (st[i] === 0) st[i] = performance.now();
};
// (CRISP_AB_STAND_IN=1: the stand-in driver, to check the plumbing without a GPU)
const libs = process.env.CRISP_AB_STAND_IN ? standInDriver({ heads: 32 }).libs : loadCuda();
const be = new CudaBackend(libs, { kernelDir: 'packages/kernels-cuda/kernels', cacheDir: '/tmp/crisp-cubin' });
const { inputs, out } = llamaLayer(be, n);
const order = [0, 1, 2, 3, 4, 5, 6, 7, 9, 8];
const med = (a) => [...a].sort((x, y) => x - y)[a.length >> 1];
const warmN = Number(process.argv[4] ?? 20);
for (let i = 0; i < warmN; i++) await sparsePrefill(be, inputs, crisp, { minSparseLength: 0, out });
for (const head of [0, 3]) {
  const d = order.map(() => []);
  const plan = [];
  for (let i = 0; i < reps; i++) {
    await be.synchronize();
    if (head) be.deviceSleep(head);
    st.fill(0);
    const r = await sparsePrefill(be, inputs, crisp, { minSparseLength: 0, out });
    plan.push(r.timings.planMs);
    order.forEach((p, j) => d[j].push((st[p] - st[0]) * 1000));
  }
  console.log(`${head ? `behind a ${head} ms head start` : 'from idle'}: plan median ${med(plan).toFixed(3)} ms; host us from sparsePrefill's entry (medians of ${reps}):`);
  order.forEach((p, j) => console.log(`  ${p} ${med(d[j]).toFixed(1)}`));
}
be.dispose();
