// Session 23 r2 (wip/stamps' points on main; WAIT=sleep|spin: 30 ms on the host before each timed prefill): the host clock on the path to the proxy pass's launch
// after a JIT warm-up like crisp-bench's (W prefills at 8k, then 20 at 128k), from idle and
// behind a 3 ms head start. Prints as it goes.
import { sparsePrefill } from '@crisp/core';
import { crisp } from '@crisp/presets';
import { CudaBackend } from '../packages/kernels-cuda/src/cuda-backend.ts';
import { loadCuda } from '../packages/kernels-cuda/src/ffi.ts';
import { standInDriver } from '../packages/kernels-cuda/src/stand-in-driver.ts';
import { llamaLayer } from '../packages/kernels-cuda/scripts/gpu-layer.mjs';

const n = Number(process.argv[2] ?? 131072);
const reps = Number(process.argv[3] ?? 100);
const W = Number(process.argv[4] ?? 2000);
const st = new Float64Array(10);
const WAIT = process.env.WAIT ?? 'none';
const sab = new Int32Array(new SharedArrayBuffer(4));
globalThis.__st = (i) => {
  if (st[i] === 0) st[i] = performance.now();
};
const libs = process.env.CRISP_AB_STAND_IN ? standInDriver({ heads: 32 }).libs : loadCuda();
const be = new CudaBackend(libs, { cacheDir: process.env.CRISP_AB_STAND_IN ? null : '/tmp/crisp-cubin' });
const small = llamaLayer(be, 8192);
const t = performance.now();
for (let i = 0; i < W; i++) {
  await sparsePrefill(be, small.inputs, crisp, { minSparseLength: 0, out: small.out });
  if (i % 500 === 0) console.log(`warm ${i} ${((performance.now() - t) / 1000).toFixed(1)} s`);
}
const { inputs, out } = llamaLayer(be, n);
const order = [0, 1, 2, 3, 4, 5, 6, 7, 9, 8];
const med = (a) => [...a].sort((x, y) => x - y)[a.length >> 1];
for (let i = 0; i < 20; i++) await sparsePrefill(be, inputs, crisp, { minSparseLength: 0, out });
for (const head of [0, 3]) {
  const d = order.map(() => []);
  const plan = [];
  for (let i = 0; i < reps; i++) {
    await be.synchronize();
    if (WAIT === 'sleep') Atomics.wait(sab, 0, 0, 30);
    else if (WAIT === 'spin') { const e = performance.now() + 30; while (performance.now() < e); }
    if (head) be.deviceSleep(head);
    st.fill(0);
    const r = await sparsePrefill(be, inputs, crisp, { minSparseLength: 0, out });
    plan.push(r.timings.planMs);
    order.forEach((p, j) => d[j].push((st[p] - st[0]) * 1000));
  }
  console.log(`${process.env.CRISP_AB_STAND_IN ? 'stand-in' : 'driver'} wait=${WAIT} W=${W} ${head ? `behind a ${head} ms head start` : 'from idle'}: plan median ${med(plan).toFixed(3)} ms; host us from sparsePrefill's entry (medians of ${reps}):`);
  order.forEach((p, j) => console.log(`  ${p} ${med(d[j]).toFixed(1)}`));
}
be.dispose();
