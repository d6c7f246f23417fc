// The CUDA backend's host cost (JavaScript and FFI marshalling, no GPU): CRISP prefills at a
// Llama shape through the stand-in driver (src/stand-in-driver.ts), whose calls return at
// once, so each plan's planMs is what the host spends around the real driver's launches and
// copies (on the GPU machine those add ~5-10 us a launch and a round trip a synchronising
// read). The device reads come back as zeros (C_struct 0: every head routes to PE, and the
// device's PE list is empty).
//
//   pnpm -F @crisp/kernels-cuda build && node packages/kernels-cuda/scripts/host-cost.mjs [n] [plans]
//   node --cpu-prof --cpu-prof-dir=/tmp/prof packages/kernels-cuda/scripts/host-cost.mjs
import { sparsePrefill } from '@crisp/core';
import { crisp } from '@crisp/presets';
import { CudaBackend } from '../dist/cuda-backend.js';
import { standInDriver } from '../dist/stand-in-driver.js';

const n = Number(process.argv[2] ?? 131072);
const plans = Number(process.argv[3] ?? 400);
const H = 32;
const Hkv = 8;
const D = 128;

const { libs, log } = standInDriver({ heads: H });
const be = new CudaBackend(libs, { cacheDir: null });
const q = be.allocate('bf16', [n, H, D]);
const k = be.allocate('bf16', [n, Hkv, D]);
const v = be.allocate('bf16', [n, Hkv, D]);
const inputs = { q, k, v };
const policy = crisp;
for (let i = 0; i < 50; i++) (await sparsePrefill(be, inputs, policy, { minSparseLength: 0 })).output.dispose();
log.length = 0;
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
const per = {};
for (const e of log) per[e.kind] = (per[e.kind] ?? 0) + 1 / plans;
console.log(
  `host cost of a CRISP plan (planMs in sparsePrefill), n=${n} H=${H} Hkv=${Hkv} d=${D}, stand-in driver: median ${ms[ms.length >> 1].toFixed(3)} ms, p10 ${ms[Math.floor(plans * 0.1)].toFixed(3)}, p90 ${ms[Math.floor(plans * 0.9)].toFixed(3)}`,
);
console.log(`phases (mean ms): ${JSON.stringify(Object.fromEntries(Object.entries(phase).map(([a, b]) => [a, +b.toFixed(3)])))}`);
console.log(`launches and reads a prefill: ${JSON.stringify(per)}`);
be.dispose();
