// What a driver call costs right after the GPU went idle (session 15's question; session 13 saw
// the first event record and the first launch of a prefill from an idle device take 57-117 us
// each, 5-18 us with the device busy). For each case, 40 times: the device drained, the host
// busy for `idle` ms (the GPU idle meanwhile), then a mark (cuEventRecord), `gap` ms of host work,
// an empty launch, a mark. Prints the host time of the first record and of the launch, and the
// device time between the two marks (which the launch's own delay is part of).
//
// `long`: the device first busy for 30 ms (a spin kernel) and the host in the synchronize
// meanwhile, as after a 128k prefill's attention; the call's JavaScript is stood in for by a
// fixed piece of work (`js us`, timed) between the mark and the launch. [sched]: the primary
// context's scheduling flags (CU_CTX_SCHED_*: 0 auto, 1 spin, 4 blocking sync).
//
//   node apps/bench/scripts/bundle.mjs packages/kernels-cuda/scripts/idle-wake.mjs .device/app/idle-wake.mjs
//   (on the GPU machine, from the repository root) node .device/app/idle-wake.mjs [short|long] [sched]
import { CudaBackend } from '../src/cuda-backend.ts';
import { loadCuda } from '../src/ffi.ts';

const mode = process.argv[2] ?? 'short';
const sched = Number(process.argv[3] ?? 0);
const libs = loadCuda();
if (sched) {
  libs.cu.cuInit(0);
  const setFlags = libs.koffi.load('libcuda.so.1').func('int cuDevicePrimaryCtxSetFlags_v2(int dev, unsigned int flags)');
  console.log(`cuDevicePrimaryCtxSetFlags(0, ${sched}) -> ${setFlags(0, sched)}`);
}
// (the flags set above, or the driver's own with sched 0)
const be = new CudaBackend(libs, { kernelDir: 'packages/kernels-cuda/kernels', cacheDir: '/tmp/crisp-cubin', schedule: 'auto' });
const spinHost = (ms) => {
  const t = performance.now();
  while (performance.now() - t < ms);
};
const med = (a) => [...a].sort((x, y) => x - y)[a.length >> 1];
const us = (ms) => (ms * 1000).toFixed(1);

be.deviceSleep(0);
await be.synchronize();
// One timed call: a mark, `between` (host work), an empty launch, a mark, then a synchronize:
// the host time of the record, of `between` and of the launch, and the device time between
// the two marks.
const once = async (between) => {
  const t0 = performance.now();
  const m0 = be.mark();
  const t1 = performance.now();
  between();
  const t2 = performance.now();
  be.deviceSleep(0);
  const t3 = performance.now();
  const m1 = be.mark();
  await be.synchronize();
  return { rec: t1 - t0, js: t2 - t1, launch: t3 - t2, dev: m1.msSince(m0) };
};
const medianOf = (runs, key) => us(med(runs.map((r) => r[key])));
const run = async (idle, gap, busy) => {
  const runs = [];
  for (let i = 0; i < 40; i++) {
    await be.synchronize();
    if (busy) be.deviceSleep(busy);
    spinHost(idle);
    runs.push(await once(() => spinHost(gap)));
  }
  console.log(
    `idle ${idle} ms, gap ${gap} ms${busy ? `, device busy ${busy} ms` : ''}: record ${medianOf(runs, 'rec')} us, launch ${medianOf(runs, 'launch')} us, device between the marks ${medianOf(runs, 'dev')} us (medians of 40)`,
  );
};
// a fixed piece of JavaScript (map and object work, ~10-20 us warm)
const work = () => {
  const m = new Map();
  for (let i = 0; i < 200; i++) m.set(`k${i}`, { i, v: [i, i + 1] });
  let s = 0;
  for (const [, o] of m) s += o.v[1];
  return s;
};
const long = async (label) => {
  const runs = [];
  for (let i = 0; i < 40; i++) {
    be.deviceSleep(30);
    await be.synchronize();
    runs.push(await once(work));
  }
  console.log(
    `${label}: record ${medianOf(runs, 'rec')} us, js ${medianOf(runs, 'js')} us, launch ${medianOf(runs, 'launch')} us, device between the marks ${medianOf(runs, 'dev')} us (medians of 40)`,
  );
};
if (mode === 'long') {
  await long(`sched ${sched}, after a 30 ms device spin and its synchronize`);
  // the same with the work and the launch warm: the device busy 3 ms, no synchronize before
  const js = [];
  for (let i = 0; i < 40; i++) {
    be.deviceSleep(3);
    const t = performance.now();
    work();
    js.push(performance.now() - t);
    await be.synchronize();
  }
  console.log(`sched ${sched}, the same JavaScript with no synchronize before it: ${us(med(js))} us`);
} else {
  for (const idle of [0, 0.05, 0.2, 1, 5]) await run(idle, 0.05, 0);
  for (const gap of [0, 0.005, 0.01, 0.02, 0.1, 0.2]) await run(1, gap, 0);
  // the device busy through the call (a head start): the baseline
  await run(1, 0.05, 3);
}
be.dispose();
