// The CUDA backend's host cost on a real GPU (the GPU machine; host-cost.mjs is the stand-in
// driver's version): what one driver call costs from JavaScript (an empty launch, an event),
// and the host time a CRISP prefill spends queuing its plan (from sparsePrefill's call to its
// mark behind the plan), with and without a device head start (a spin kernel queued first, so
// the device never holds the host back). Run under `node --cpu-prof` to see where it goes.
//
//   node apps/bench/scripts/bundle.mjs packages/kernels-cuda/scripts/host-cost-gpu.mjs .device/app/host-cost-gpu.mjs
//   (on the GPU machine, from the repository root) node .device/app/host-cost-gpu.mjs [n] [plans] [sched] [warm]
// Session 13's results: apps/bench/results/cuda-h200-session13/diag/host.
import { sparsePrefill } from '@crisp/core';
import { crisp } from '@crisp/presets';
import { CudaBackend } from '../src/cuda-backend.ts';
import { loadCuda } from '../src/ffi.ts';
import { llamaLayer } from './gpu-layer.mjs';

const n = Number(process.argv[2] ?? 131072);
const plans = Number(process.argv[3] ?? 100);
// the primary context's scheduling flags (CU_CTX_SCHED_*: 0 auto, 1 spin, 2 yield, 4 blocking
// sync; not given: the backend's default, which leaves them alone) and, with warm > 0, a JavaScript busy loop of that many ms between the synchronize and
// the call (the device idle meanwhile): is the slow start of a call the host's or the GPU's?
const schedArg = process.argv[4];
const sched = Number(schedArg ?? 0);
const warm = Number(process.argv[5] ?? 0);
// every driver call logged with the host clock (a shim costs well under a microsecond): the
// host's timeline of one prefill, without the trace mode's extra events
const libs = loadCuda();
if (schedArg !== undefined) {
  const lib = libs.koffi.load('libcuda.so.1');
  const setFlags = lib.func('int cuDevicePrimaryCtxSetFlags_v2(int dev, unsigned int flags)');
  libs.cu.cuInit(0);
  console.log(`cuDevicePrimaryCtxSetFlags(0, ${sched}) -> ${setFlags(0, sched)}`);
}
const spinHost = (ms) => {
  const t = performance.now();
  while (performance.now() - t < ms);
};
const calls = [];
let logging = false;
for (const name of Object.keys(libs.cu)) {
  const f = libs.cu[name];
  if (typeof f !== 'function') continue;
  libs.cu[name] = (...a) => {
    const t = performance.now();
    const r = f(...a);
    if (logging) calls.push([name, t, performance.now()]);
    return r;
  };
}
// (the flags set above, not the backend's default)
const be = new CudaBackend(libs, { kernelDir: 'packages/kernels-cuda/kernels', cacheDir: '/tmp/crisp-cubin', ...(schedArg !== undefined ? { schedule: 'auto' } : {}) });
const med = (a) => [...a].sort((x, y) => x - y)[a.length >> 1];
const us = (ms) => `${(ms * 1000).toFixed(1)} us`;

// one driver call from JavaScript
be.deviceSleep(0);
await be.synchronize();
for (const [what, call] of [
  ['an empty launch (spin_ns, 1 argument)', () => be.deviceSleep(0)],
  ['a mark (cuEventRecord)', () => be.mark()],
]) {
  const per = [];
  for (let rep = 0; rep < 5; rep++) {
    be.deviceSleep(20);
    const t = performance.now();
    for (let i = 0; i < 500; i++) call();
    per.push((performance.now() - t) / 500);
    await be.synchronize();
  }
  console.log(`${what}: ${us(med(per))} each (median of 5 x 500, device busy)`);
}

const { inputs, out } = llamaLayer(be, n);
const marks = [];
const mark = be.mark.bind(be);
be.mark = () => {
  marks.push(performance.now());
  return mark();
};
// entry times of the backend's public steps, for the host timeline below
const entries = [];
for (const m of ['proxyStats', 'planOnDevice', 'sparseAttention']) {
  const f = be[m].bind(be);
  be[m] = (...a) => {
    entries.push([m, performance.now()]);
    return f(...a);
  };
}
for (let i = 0; i < 10; i++) await sparsePrefill(be, inputs, crisp, { minSparseLength: 0, out });
for (const head of [0, 5]) {
  const host = [];
  const dev = [];
  // every measured call starts the same way: the device drained, then the head start and the
  // host's warm loop if asked for
  const start = async () => {
    await be.synchronize();
    if (head) be.deviceSleep(head);
    if (warm) spinHost(warm);
    marks.length = 0;
  };
  for (let i = 0; i < plans; i++) {
    await start();
    const r = await sparsePrefill(be, inputs, crisp, { minSparseLength: 0, out });
    host.push(marks.at(-2) - marks[0]);
    dev.push(r.timings.planMs);
  }
  // one more prefill, logged: its driver calls from its first mark to the plan's mark
  await start();
  calls.length = 0;
  entries.length = 0;
  logging = true;
  await sparsePrefill(be, inputs, crisp, { minSparseLength: 0, out });
  logging = false;
  const t0 = marks[0];
  for (const [m, t] of entries) calls.push([`enter ${m}`, t, t]);
  for (const t of marks) calls.push(['mark (JS)', t, t]);
  calls.sort((a, b) => a[1] - b[1]);
  const lines = calls
    .filter(([, t]) => t >= t0 && t <= marks.at(-2))
    .map(([name, t, e]) => `${(t - t0).toFixed(3)}+${((e - t) * 1000).toFixed(0)}us ${name}`);
  console.log(`driver calls of one prefill until the plan's mark (${head} ms head start), ms from the call:\n  ${lines.join('\n  ')}`);
  // the JIT warms up over the calls: medians by blocks of 40 calls
  const blocks = [];
  for (let i = 0; i + 40 <= plans; i += 40) {
    blocks.push(`${i + 1}-${i + 40}: host ${med(host.slice(i, i + 40)).toFixed(3)} device ${med(dev.slice(i, i + 40)).toFixed(3)}`);
  }
  if (blocks.length > 1) console.log(`  by blocks of calls (${head} ms head start): ${blocks.join('; ')}`);
  console.log(
    `n=${n} sched ${sched} warm ${warm}, ${head ? `behind a ${head} ms device head start` : 'no head start'}: host queues the plan in ${med(host).toFixed(3)} ms, device plan ${med(dev).toFixed(3)} ms (medians of ${plans})`,
  );
}
be.dispose();
