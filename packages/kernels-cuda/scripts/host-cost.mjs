// The CUDA backend's host cost (JavaScript and FFI marshalling, no GPU): CRISP prefills at a
// Llama shape through a stand-in driver whose calls return at once, so what is timed is
// what the host spends around the real driver's launches and copies (planMs of each) (on the GPU machine
// those add ~5-10 us a launch and a round trip a synchronising read). The plan's device
// reads come back as zeros (C_struct 0: every head routes to PE with an empty head list).
//
//   pnpm -F @crisp/kernels-cuda build && node packages/kernels-cuda/scripts/host-cost.mjs [n] [plans]
//   node --cpu-prof --cpu-prof-dir=/tmp/prof packages/kernels-cuda/scripts/host-cost.mjs
import { createRequire } from 'node:module';
import { sparsePrefill } from '@crisp/core';
import { crisp } from '@crisp/presets';
import { CudaBackend } from '../dist/cuda-backend.js';

const require = createRequire(import.meta.url);
const koffi = require('koffi');
const n = Number(process.argv[2] ?? 131072);
const plans = Number(process.argv[3] ?? 400);
const H = 32;
const Hkv = 8;
const D = 128;

let next = 1 << 20;
const calls = new Map();
/** out-parameter: a[0] = x, success */
const set = (a, x) => {
  a[0] = x;
  return 0;
};
const ATTRS = { 75: 9, 76: 0, 16: 132 };
const cu = new Proxy(
  {
    cuDeviceGetCount: (c) => set(c, 1),
    cuDeviceGetAttribute: (v, a) => set(v, ATTRS[a] ?? 0),
    cuDeviceGetName: (buf) => {
      buf.set(new TextEncoder().encode('stand-in H200\0'));
      return 0;
    },
    cuDriverGetVersion: (v) => set(v, 12080),
    cuDevicePrimaryCtxRetain: (c) => set(c, {}),
    cuStreamCreate: (s) => set(s, {}),
    cuEventCreate: (e) => set(e, {}),
    cuMemGetInfo: (f, t) => {
      t[0] = 1.4e11;
      return set(f, 1e11);
    },
    cuMemAlloc: (out, size) => {
      set(out, next);
      next += Math.ceil(Number(size) / 256) * 256 + 256;
      return 0;
    },
    cuModuleLoadData: (m) => set(m, {}),
    cuModuleGetFunction: (f) => set(f, {}),
    // expand's summary [H + 1 row pointers][bad-row flag]: no bad row
    cuMemcpyDtoH: (out) => {
      if (out.length === H + 2) out[H + 1] = 0x7fffffff;
      return 0;
    },
  },
  {
    get(target, name) {
      const f = target[name] ?? (() => 0);
      return (...a) => {
        calls.set(name, (calls.get(name) ?? 0) + 1);
        return f(...a);
      };
    },
  },
);
const nvrtc = new Proxy(
  {
    nvrtcVersion: (a, b) => {
      b[0] = 8;
      return set(a, 12);
    },
    nvrtcCreateProgram: (p) => set(p, {}),
    nvrtcGetCUBINSize: (s) => set(s, 16),
  },
  { get: (t, name) => t[name] ?? (() => 0) },
);
const be = new CudaBackend({ koffi, cu, nvrtc }, { cacheDir: null });
const q = be.allocate('bf16', [n, H, D]);
const k = be.allocate('bf16', [n, Hkv, D]);
const v = be.allocate('bf16', [n, Hkv, D]);
const inputs = { q, k, v };
const policy = crisp;
for (let i = 0; i < 50; i++) (await sparsePrefill(be, inputs, policy, { minSparseLength: 0 })).output.dispose();
calls.clear();
const ms = [];
const phase = { statsMs: 0, selectMs: 0, peRowsMs: 0, maskMs: 0 };
for (let i = 0; i < plans; i++) {
  const r = await sparsePrefill(be, inputs, policy, { minSparseLength: 0 });
  const p = r.plan;
  ms.push(p.planMs);
  for (const key of Object.keys(phase)) phase[key] += p.phases[key] / plans;
  r.output.dispose();
}
ms.sort((a, b) => a - b);
const per = Object.fromEntries([...calls].map(([k2, c]) => [k2, c / plans]));
console.log(
  `host cost of a CRISP plan (planMs in sparsePrefill), n=${n} H=${H} Hkv=${Hkv} d=${D}, stand-in driver: median ${ms[ms.length >> 1].toFixed(3)} ms, p10 ${ms[Math.floor(plans * 0.1)].toFixed(3)}, p90 ${ms[Math.floor(plans * 0.9)].toFixed(3)}`,
);
console.log(`phases (mean ms): ${JSON.stringify(Object.fromEntries(Object.entries(phase).map(([a, b]) => [a, +b.toFixed(3)])))}`);
console.log(`driver calls a plan: ${JSON.stringify(per)}`);
be.dispose();
