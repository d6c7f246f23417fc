// Two builds of the CUDA backend (their host code, and their kernels where both embed them) in
// one process, their prefills alternated from an idle device (the GPU machine): the paired
// difference of their plans (device marks), free of the drift between processes and minutes
// that moves crisp-bench's from-idle plan by ±0.05 ms (session 20: run medians 0.56-0.67 ms on
// the same code within one call). Each build is a bundle exporting CudaBackend (and the first
// one loadCuda, whose driver bindings both use):
//
//   bash apps/bench/scripts/host-ab-pack.sh 7c2feea HEAD   (.device/app/ab-<commit>.mjs each,
//   and this script as .device/app/host-ab-gpu.mjs; apps/bench/scripts/h200-host-ab.sh runs them)
//   (on the GPU machine, from the repository root)
//   node .device/app/host-ab-gpu.mjs .device/app/ab-7c2feea.mjs .device/app/ab-<head>.mjs [n] [pairs]
//
// Each pair runs A then B or B then A (alternating), each prefill after both backends have
// drained the device. Printed: each build's median plan and phases, the median of the paired
// differences B − A, and in how many pairs B was faster.
//
// A build may carry the context's scheduling flags while it waits for the device before its
// prefill, `bundle.mjs#sched=spin` (auto, spin, yield, blocking; set with cuCtxSetFlags, CUDA
// 12.1+, on the shared primary context, then 30 ms of device work waited for before each of
// that build's prefills): the same build twice with two flags is an in-process A/B of the host
// thread's wait (session 16 compared spin and auto in separate processes only, whose levels
// differ by more than what it measured).
import { resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { sparsePrefill } from '@crisp/core';
import { crisp } from '@crisp/presets';
import { buildDriver, buildOptions, llamaLayer } from './gpu-layer.mjs';

const [pa, pb] = process.argv.slice(2, 4);
if (!pa || !pb) {
  console.error('usage: host-ab-gpu.mjs <build A bundle> <build B bundle> [n=131072] [pairs=60]');
  process.exit(2);
}
const n = Number(process.argv[4] ?? 131072);
const pairs = Number(process.argv[5] ?? 60);
const SCHED = { auto: 0, spin: 1, yield: 2, blocking: 4 };
const variant = (arg) => {
  const [path, opt] = arg.split('#');
  if (opt === 'wait=poll') return { path, poll: true };
  const sched = opt?.startsWith('sched=') ? opt.slice(6) : undefined;
  if (opt !== undefined && sched === undefined) throw new Error(`unknown option ${opt} in ${arg} (sched=..., wait=poll)`);
  if (sched !== undefined && !Object.hasOwn(SCHED, sched)) throw new Error(`unknown sched ${sched} in ${arg} (auto, spin, yield, blocking)`);
  return { path, sched };
};
const va = variant(pa);
const vb = variant(pb);
const A = await import(pathToFileURL(resolve(va.path)).href);
const B = await import(pathToFileURL(resolve(vb.path)).href);
// (CRISP_AB_STAND_IN=1: the stand-in driver, to check this script's plumbing without a GPU;
// the bundles then export standInDriver too)
const libs = buildDriver(A);
// (each build its own embedded kernels where it has them: buildOptions)
for (const [name, M, p] of [
  ['A', A, pa],
  ['B', B, pb],
]) {
  console.log(
    `${name} (${p}): ${M.KERNEL_SOURCES ? 'its own embedded kernels' : "this tree's packages/kernels-cuda/kernels"}, ${M.sparsePrefill ? 'its own sparsePrefill and preset' : "this script's sparsePrefill and preset"}`,
  );
}
const builds = [
  { name: 'A', M: A, be: new A.CudaBackend(libs, buildOptions(A)), sched: va.sched, poll: va.poll },
  { name: 'B', M: B, be: new B.CudaBackend(libs, buildOptions(B)), sched: vb.sched, poll: vb.poll },
];
// `#wait=poll` (session 21): that build waits for its 30 ms of device work by polling an event
// from JavaScript (cuEventQuery until it is reached) instead of inside cuStreamSynchronize,
// whose spin may let the VM deschedule the vCPU (the host's JavaScript and first driver calls
// after a wait ran several times slower than warm in every H200 log, with CUDA's spin on)
let eventQuery;
if (va.poll || vb.poll) {
  eventQuery = process.env.CRISP_AB_STAND_IN ? () => 0 : libs.koffi.load('libcuda.so.1').func('int cuEventQuery(void *ev)');
}
// the scheduling flags, when a build names them (the backends made the primary context current)
let setSched;
if (va.sched !== undefined || vb.sched !== undefined) {
  const lib = libs.koffi.load('libcuda.so.1');
  const getFlags = lib.func('int cuCtxGetFlags(_Out_ unsigned int* flags)');
  const setFlags = lib.func('int cuCtxSetFlags(unsigned int flags)');
  setSched = (name) => {
    const cur = [0];
    const r1 = getFlags(cur);
    const r2 = setFlags((cur[0] & ~7) | SCHED[name ?? 'auto']);
    if (r1 !== 0 || r2 !== 0) throw new Error(`cuCtxGetFlags/cuCtxSetFlags failed (${r1}, ${r2})`);
  };
}
for (const b of builds) {
  b.layer = llamaLayer(b.be, n);
  b.plan = [];
  b.stats = [];
  b.after = [];
}
const drain = async () => {
  for (const b of builds) await b.be.synchronize();
};
const once = async (b, keep) => {
  if (setSched) {
    // the wait before the call is what the flags change: 30 ms of device work waited for
    // under this build's flags (as after an attention's synchronize), then the prefill
    setSched(b.sched);
    b.be.deviceSleep(30);
  } else if (eventQuery) {
    b.be.deviceSleep(30);
    if (b.poll) {
      const m = b.be.mark();
      let polls = 0;
      for (;;) {
        const r = eventQuery(m.slot.ev);
        if (r === 0) break;
        if (r !== 600) throw new Error(`cuEventQuery returned ${r}`);
        polls++;
      }
      b.polls = (b.polls ?? 0) + polls;
    }
  }
  await drain();
  const r = await (b.M.sparsePrefill ?? sparsePrefill)(b.be, b.layer.inputs, b.M.crisp ?? crisp, { minSparseLength: 0, out: b.layer.out });
  if (!keep) return;
  b.plan.push(r.timings.planMs);
  b.stats.push(r.plan.phases?.statsMs ?? Number.NaN);
  b.after.push(r.plan.phases?.peRowsMs ?? Number.NaN);
};
// warm-up: the kernels compiled or loaded, the JavaScript of both builds optimised
for (let i = 0; i < 30; i++) for (const b of builds) await once(b, false);
for (let i = 0; i < pairs; i++) {
  const order = i % 2 ? [builds[1], builds[0]] : builds;
  for (const b of order) await once(b, true);
}
const med = (a) => {
  const s = [...a].sort((x, y) => x - y);
  return s.length % 2 ? s[(s.length - 1) >> 1] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};
const f3 = (x) => x.toFixed(3);
for (const b of builds) if (b.poll) console.log(`${b.name}: ${Math.round((b.polls ?? 0) / (30 + pairs))} event queries a wait (mean)`);
for (const b of builds) {
  console.log(`${b.name} (${b.name === 'A' ? pa : pb}): plan median ${f3(med(b.plan))} ms, statistics ${f3(med(b.stats))}, after them ${f3(med(b.after))} (${pairs} prefills)`);
}
const d = builds[1].plan.map((x, i) => x - builds[0].plan[i]);
const dAfter = builds[1].after.map((x, i) => x - builds[0].after[i]);
const dStats = builds[1].stats.map((x, i) => x - builds[0].stats[i]);
console.log(
  `B − A, paired: plan median ${f3(med(d))} ms (statistics ${f3(med(dStats))}, after them ${f3(med(dAfter))}); B faster in ${d.filter((x) => x < 0).length} of ${pairs} pairs`,
);
// by halves: whether the difference holds over the run
const h = pairs >> 1;
console.log(`  first half ${f3(med(d.slice(0, h)))} ms, second half ${f3(med(d.slice(h)))} ms`);
// a 95% interval for the paired median (bootstrap over pairs, a fixed seed: the same data give
// the same interval); session 20's A/A control read −0.001 ms, so slot B's own bias is ~0.002 ms:
// compare both slot orders before calling a difference
let seed = 0x2545f491;
const rand = () => {
  seed ^= seed << 13;
  seed ^= seed >>> 17;
  seed ^= seed << 5;
  return (seed >>> 0) / 2 ** 32;
};
const boots = [];
for (let i = 0; i < 2000; i++) boots.push(med(Array.from(d, () => d[Math.floor(rand() * d.length)])));
boots.sort((x, y) => x - y);
console.log(`  95% interval of the paired median (bootstrap): [${f3(boots[49])}, ${f3(boots[1949])}] ms`);
for (const b of builds) b.be.dispose();
