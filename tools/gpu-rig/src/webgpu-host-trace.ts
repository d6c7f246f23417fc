/**
 * Where the host's time goes while the WebGPU backend queues a prefill: every Dawn call a
 * `sparsePrefill` makes (buffer and bind group creation, writes, passes, submits, error scopes,
 * maps) timed on the host clock, with how long the asynchronous ones took to resolve, and when
 * each submit, scope pop and error-scope settle happened within the call.
 *
 *   node .device/app/webgpu-host-trace.mjs            (N=8192 REPS=10 WARM=40 WAIT=auto|spin|yield)
 *
 * The layer: the Llama shape (H 32, Hkv 8, d 128), f16, seeded uniform noise in q, k and v, the
 * `crisp` preset with the length gate off; WARM prefills first (so the JavaScript runs
 * JIT-optimised and every pipeline is built), then REPS traced ones. Wrapping each call costs
 * a little host time of its own: read the counts and the shares, and the wall time from
 * crisp-bench.
 */
import { type DeviceTensor, hostTensor, mulberry32, sparsePrefill } from '@crisp/core';
import { createNodeWebGpuBackend, type DawnWait } from '@crisp/kernels-webgpu/node';
import { crisp } from '@crisp/presets';

const n = Number(process.env.N ?? 8192);
const reps = Number(process.env.REPS ?? 10);
const warm = Number(process.env.WARM ?? 40);
const wait = (process.env.WAIT ?? 'auto') as DawnWait;
const H = 32;
const Hkv = 8;
const D = 128;

/** Seeded uniform values in [-amp, amp) (core's mulberry32: the values only need to be noise). */
function noise(len: number, seed: number, amp: number): Float32Array {
  const r = mulberry32(seed);
  return Float32Array.from({ length: len }, () => (r() * 2 - 1) * amp);
}

type Fn = (...a: unknown[]) => unknown;
const totals = new Map<string, { calls: number; ms: number }>();
const timeline: string[] = [];
let t0 = 0;
const add = (name: string, ms: number) => {
  const s = totals.get(name) ?? { calls: 0, ms: 0 };
  s.calls++;
  s.ms += ms;
  totals.set(name, s);
};

/** Times `obj[name]` on the host clock; with `resolves`, also until its promise settles. */
function wrap(obj: object, name: string, label: string, resolves = false): void {
  const o = obj as Record<string, Fn>;
  const f = o[name];
  o[name] = function (this: unknown, ...a: unknown[]) {
    const s = performance.now();
    const r = f.apply(this, a);
    add(label, performance.now() - s);
    if (label === 'queue.submit' || label === 'popErrorScope') timeline.push(`${(s - t0).toFixed(2)} ${label}`);
    if (resolves && r instanceof Promise) {
      r.then(
        () => add(`${label}, until resolved`, performance.now() - s),
        () => undefined,
      );
    }
    return r;
  };
}

const b = await createNodeWebGpuBackend({ dawnWait: wait });
const upload = (shape: number[], seed: number, amp: number): DeviceTensor =>
  b.upload(hostTensor('f16', shape, noise(shape.reduce((x, y) => x * y), seed, amp)));
const inputs = { q: upload([n, H, D], 1, 2), k: upload([n, Hkv, D], 2, 2), v: upload([n, Hkv, D], 3, 1) };
const out = b.allocate('f16', [n, H, D]);
const run = () => sparsePrefill(b, inputs, crisp, { minSparseLength: 0, out });
for (let i = 0; i < warm; i++) await run();
await b.synchronize();

const dev = b.gpu.device;
for (const [name, resolves] of [
  ['createBuffer', false],
  ['createBindGroup', false],
  ['createCommandEncoder', false],
  ['pushErrorScope', false],
  ['popErrorScope', true],
] as const) {
  wrap(dev, name, name, resolves);
}
wrap(dev.queue, 'submit', 'queue.submit');
wrap(dev.queue, 'writeBuffer', 'queue.writeBuffer');
wrap(dev.queue, 'onSubmittedWorkDone', 'queue.onSubmittedWorkDone', true);
// the prototypes of buffers, encoders and passes, from one of each
const sample = dev.createBuffer({ size: 16, usage: 1 | 8 /* MAP_READ | COPY_DST */ });
const bufferProto = Object.getPrototypeOf(sample) as object;
sample.destroy();
const enc = dev.createCommandEncoder();
const pass = enc.beginComputePass();
const passProto = Object.getPrototypeOf(pass) as object;
pass.end();
const encoderProto = Object.getPrototypeOf(enc) as object;
wrap(bufferProto, 'mapAsync', 'buffer.mapAsync', true);
wrap(bufferProto, 'destroy', 'buffer.destroy');
for (const m of ['beginComputePass', 'finish', 'copyBufferToBuffer', 'clearBuffer']) wrap(encoderProto, m, `encoder.${m}`);
for (const m of ['setPipeline', 'setBindGroup', 'dispatchWorkgroups', 'end']) wrap(passProto, m, `pass.${m}`);
const ctx = Object.getPrototypeOf(b.gpu) as { settle: (...a: unknown[]) => Promise<void> };
const settle = ctx.settle;
ctx.settle = async function (this: unknown, ...a: unknown[]) {
  const s = performance.now();
  timeline.push(`${(s - t0).toFixed(2)} settle`);
  try {
    return await settle.apply(this, a);
  } finally {
    add('await settle (error scopes)', performance.now() - s);
  }
};

let untilResolved = 0;
let withSync = 0;
for (let i = 0; i < reps; i++) {
  timeline.length = 0;
  t0 = performance.now();
  await run();
  const t1 = performance.now();
  await b.synchronize();
  untilResolved += t1 - t0;
  withSync += performance.now() - t0;
}
console.log(`webgpu host trace: n=${n}, H ${H}, Hkv ${Hkv}, d ${D}, f16, crisp, Dawn waits ${wait}, ${reps} traced prefills after ${warm}`);
console.log(`per prefill: ${(untilResolved / reps).toFixed(2)} ms until sparsePrefill resolved, ${(withSync / reps).toFixed(2)} ms with synchronize()`);
console.log('per prefill, by call (host clock; "until resolved": from the call to its promise settling):');
for (const [name, s] of [...totals].sort((x, y) => y[1].ms - x[1].ms)) {
  console.log(`  ${name}: ${(s.calls / reps).toFixed(1)} calls, ${(s.ms / reps).toFixed(3)} ms (${((1000 * s.ms) / s.calls).toFixed(1)} us each)`);
}
console.log(`the last prefill's submits, scope pops and settles (ms from its start): ${timeline.join(' | ')}`);
b.dispose();
