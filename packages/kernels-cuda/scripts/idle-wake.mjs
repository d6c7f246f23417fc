// What a driver call costs right after the GPU went idle (session 15's question; session 13 saw
// the first event record and the first launch of a prefill from an idle device take 57-117 us
// each, 5-18 us with the device busy). For each case, 40 times: the device drained, the host
// busy for `idle` ms (the GPU idle meanwhile), then a mark (cuEventRecord), `gap` ms of host work,
// an empty launch, a mark. Prints the host time of the first record and of the launch, and the
// device time between the two marks (which the launch's own delay is part of).
//
//   node apps/bench/scripts/bundle.mjs packages/kernels-cuda/scripts/idle-wake.mjs .device/app/idle-wake.mjs
//   (on the GPU machine, from the repository root) node .device/app/idle-wake.mjs
import { CudaBackend } from '../dist/cuda-backend.js';
import { loadCuda } from '../dist/ffi.js';

const libs = loadCuda();
const be = new CudaBackend(libs, { kernelDir: 'packages/kernels-cuda/kernels', cacheDir: '/tmp/crisp-cubin' });
const spinHost = (ms) => {
  const t = performance.now();
  while (performance.now() - t < ms);
};
const med = (a) => [...a].sort((x, y) => x - y)[a.length >> 1];
const us = (ms) => (ms * 1000).toFixed(1);

be.deviceSleep(0);
await be.synchronize();
const run = async (idle, gap, busy) => {
  const rec = [];
  const launch = [];
  const dev = [];
  for (let i = 0; i < 40; i++) {
    await be.synchronize();
    if (busy) be.deviceSleep(busy);
    spinHost(idle);
    const t0 = performance.now();
    const m0 = be.mark();
    const t1 = performance.now();
    spinHost(gap);
    const t2 = performance.now();
    be.deviceSleep(0);
    const t3 = performance.now();
    const m1 = be.mark();
    await be.synchronize();
    rec.push(t1 - t0);
    launch.push(t3 - t2);
    dev.push(m1.msSince(m0));
  }
  console.log(
    `idle ${idle} ms, gap ${gap} ms${busy ? `, device busy ${busy} ms` : ''}: record ${us(med(rec))} us, launch ${us(med(launch))} us, device between the marks ${us(med(dev))} us (medians of 40)`,
  );
};
for (const idle of [0, 0.05, 0.2, 1, 5]) await run(idle, 0.05, 0);
for (const gap of [0, 0.005, 0.01, 0.02, 0.1, 0.2]) await run(1, gap, 0);
// the device busy through the call (a head start): the baseline
await run(1, 0.05, 3);
be.dispose();
