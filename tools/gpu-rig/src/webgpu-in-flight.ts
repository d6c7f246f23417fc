/**
 * WebGPU prefills one at a time against several in flight: is the time `crisp` loses to dense
 * attention at short lengths the host's queueing (which overlaps the GPU's work once layers
 * are queued back to back) or the GPU's?
 *
 *   node .device/app/webgpu-in-flight.mjs   (SIZES=8192,16384 LAYERS=8 REPS=7 WARM=200)
 *
 * The layer: crisp-bench's llama fill (apps/bench/src/llama-fill.ts, seed 7), the Llama shape
 * (H 32, Hkv 8, d 128), f16, on the backend's default attention kernel. Per size and preset
 * (`dense`, `crisp`, length gate off): `one`, the median wall time of one awaited prefill;
 * `inFlight`, the median over REPS of LAYERS prefills started together and awaited together,
 * divided by LAYERS (each writes its own output; the GPU runs them in queue order, the host
 * queueing the next while the GPU works). One JSON line per size, then a summary.
 */
import { type DeviceTensor, type Policy, sparsePrefill } from '@crisp/core';
import { createNodeWebGpuBackend } from '@crisp/kernels-webgpu/node';
import { crisp, dense } from '@crisp/presets';
import { uploadLlamaFill } from '../../../apps/bench/src/llama-fill.js';

const sizes = (process.env.SIZES ?? '8192,16384').split(',').map(Number);
const layers = Number(process.env.LAYERS ?? 8);
const reps = Number(process.env.REPS ?? 7);
const warm = Number(process.env.WARM ?? 200);
const [H, Hkv, D] = [32, 8, 128];

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const b = await createNodeWebGpuBackend();
console.log(JSON.stringify({ backend: b.name, kernel: b.attentionKernel, layers, reps, warm }));

const rows: Record<string, unknown>[] = [];
for (const n of sizes) {
  const inputs = await uploadLlamaFill(b, n, H, Hkv, D, 'f16', 7);
  const outs: DeviceTensor[] = Array.from({ length: layers }, () => b.allocate('f16', [n, H, D]));
  const row: Record<string, unknown> = { n };
  for (const [name, policy] of [
    ['dense', dense],
    ['crisp', crisp],
  ] as [string, Policy][]) {
    const run = (i: number) => sparsePrefill(b, inputs, policy, { minSparseLength: 0, out: outs[i] });
    for (let i = 0; i < warm; i++) await run(0);
    await b.synchronize();
    const one: number[] = [];
    for (let r = 0; r < 3 * reps; r++) {
      const t0 = performance.now();
      await run(0);
      one.push(performance.now() - t0);
    }
    const inFlight: number[] = [];
    for (let r = 0; r < reps; r++) {
      await b.synchronize();
      const t0 = performance.now();
      await Promise.all(Array.from({ length: layers }, (_, i) => run(i)));
      inFlight.push((performance.now() - t0) / layers);
    }
    const density = (await run(0)).plan.overallDensity;
    row[name] = { oneMs: median(one), inFlightMs: median(inFlight), inFlightRange: [Math.min(...inFlight), Math.max(...inFlight)], density };
  }
  for (const t of [inputs.q, inputs.k, inputs.v, ...outs]) t.dispose();
  console.log(JSON.stringify(row));
  rows.push(row);
}
for (const r of rows) {
  const d = r.dense as { oneMs: number; inFlightMs: number };
  const c = r.crisp as { oneMs: number; inFlightMs: number };
  console.log(`n=${r.n}: one at a time dense ${d.oneMs.toFixed(2)} crisp ${c.oneMs.toFixed(2)} ms (${(d.oneMs / c.oneMs).toFixed(2)}x); ${layers} in flight, per layer dense ${d.inFlightMs.toFixed(2)} crisp ${c.inFlightMs.toFixed(2)} ms (${(d.inFlightMs / c.inFlightMs).toFixed(2)}x)`);
}
b.dispose();
