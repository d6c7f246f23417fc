// Where a 128k plan's extra time from an idle device goes (session 16). The same CRISP prefill
// right after the previous prefill's synchronize (the device idle, as crisp-bench times it),
// after one more driver call of the host's, and behind a 3 ms device head start (the device
// busy while the host queues, as inside a model's layer loop). Untraced: the plan's time and
// the host's time in the call's first event record and first launch. Traced (startTrace: device
// start and end of every launch; its events cost every mode the same): each plan kernel's
// device time on the main stream, and the device's wait before the proxy pass (the plan's time
// minus the span from the pass's start to the last plan kernel's end).
//
//   node apps/bench/scripts/bundle.mjs packages/kernels-cuda/scripts/idle-trace.mjs .device/app/idle-trace.mjs
//   (on the GPU machine, from the repository root) node .device/app/idle-trace.mjs [n] [reps] [layouts] [modes]
//   layouts: comma-separated proxyLayout values, each its own backend in this process (e.g.
//   w32,wg); modes: comma-separated mode names (below; default all), e.g. 'idle,head start 3 ms'
import { sparsePrefill } from '@crisp/core';
import { crisp } from '@crisp/presets';
import { CudaBackend } from '../src/cuda-backend.ts';
import { loadCuda } from '../src/ffi.ts';
import { llamaLayer } from './gpu-layer.mjs';

const n = Number(process.argv[2] ?? 131072);
const reps = Number(process.argv[3] ?? 15);
const layouts = process.argv[4] ? process.argv[4].split(',') : [undefined];
const only = process.argv[5] ? process.argv[5].split(',') : undefined;
const libs = loadCuda();
// the host's time in the prefill's first event record (its first mark) and first launch (the pass)
let capture = false;
let firstCalls = {};
for (const name of ['cuEventRecord', 'cuLaunchKernel']) {
  const f = libs.cu[name];
  libs.cu[name] = (...a) => {
    const t = performance.now();
    const r = f(...a);
    if (capture && firstCalls[name] === undefined) firstCalls[name] = performance.now() - t;
    return r;
  };
}
const med = (a) => [...a].sort((x, y) => x - y)[a.length >> 1];
for (const layout of layouts) {
  const be = new CudaBackend(libs, {
    kernelDir: 'packages/kernels-cuda/kernels',
    cacheDir: '/tmp/crisp-cubin',
    ...(layout ? { proxyLayout: layout } : {}),
  });
  const { inputs, out } = llamaLayer(be, n);
  for (let i = 0; i < 20; i++) await sparsePrefill(be, inputs, crisp, { minSparseLength: 0, out });
  // what runs between the previous prefill's synchronize and the traced one: nothing (idle), one
  // driver call of the host's (an unused mark, a context synchronize on the drained device, an
  // empty launch), or a 3 ms spin kernel (a head start)
  const allModes = {
    idle: () => {},
    'idle, a mark first': () => be.mark(),
    'idle, cuCtxSynchronize first': () => libs.cu.cuCtxSynchronize(),
    'idle, an empty launch first': () => be.deviceSleep(0),
    'head start 3 ms': () => be.deviceSleep(3),
  };
  const modes = Object.fromEntries(Object.entries(allModes).filter(([m]) => !only || only.includes(m)));

  const res = {};
  for (const [mode, before] of Object.entries(modes)) {
    const per = new Map();
    const plan = [];
    const wait = [];
    const rec = [];
    const launch = [];
    // untraced: the plan's time and the host's first driver calls
    const untraced = [];
    for (let i = 0; i < reps; i++) {
      await be.synchronize();
      before();
      firstCalls = {};
      capture = true;
      const r = await sparsePrefill(be, inputs, crisp, { minSparseLength: 0, out });
      capture = false;
      rec.push(firstCalls.cuEventRecord);
      launch.push(firstCalls.cuLaunchKernel);
      untraced.push(r.timings.planMs);
    }
    // traced (startTrace makes its events before the call's driver calls, so before `before`)
    for (let i = 0; i < reps; i++) {
      await be.synchronize();
      be.startTrace();
      before();
      const r = await sparsePrefill(be, inputs, crisp, { minSparseLength: 0, out });
      const entries = be.stopTrace();
      // the plan's kernels on the main stream: from the proxy pass to the attention (not the
      // head start's or the empty launch's kernel before it)
      const all = entries.filter((e) => e.startMs !== undefined && (e.stream ?? 'main') === 'main');
      const main = all.slice(all.findIndex((e) => e.name.startsWith('proxy_')));
      const attn = main.findIndex((e) => e.name.startsWith('attn_'));
      const planKernels = main.slice(0, attn < 0 ? main.length : attn);
      planKernels.forEach((e, j) => {
        const key = `${String(j).padStart(2)} ${e.name}`;
        per.set(key, [...(per.get(key) ?? []), e.endMs - e.startMs]);
      });
      const span = planKernels.at(-1).endMs - planKernels[0].startMs;
      plan.push(r.timings.planMs);
      wait.push(r.timings.planMs - span);
    }
    res[mode] = { per, plan: med(plan), wait: med(wait), rec: med(rec), launch: med(launch), untraced: med(untraced) };
  }
  const names = [...Object.values(res)[0].per.keys()];
  console.log(`layout ${be.proxyLayout}: n=${n}, ${reps} traced prefills each, medians (ms): ${Object.keys(modes).join(' | ')}`);
  for (const key of names) {
    const cols = Object.keys(modes).map((m) => {
      const a = res[m].per.get(key);
      return a ? med(a).toFixed(4) : '-';
    });
    console.log(`  ${key.padEnd(44)} ${cols.join(' | ')}`);
  }
  for (const [mode, x] of Object.entries(res)) {
    console.log(`${mode}: untraced plan ${x.untraced.toFixed(3)} ms; traced plan ${x.plan.toFixed(3)} ms, of which the device waits before the pass (plan minus the pass-to-last-kernel span) ${x.wait.toFixed(3)} ms; host: first record ${(x.rec * 1000).toFixed(1)} us, first launch ${(x.launch * 1000).toFixed(1)} us`);
  }
  be.dispose();
}
