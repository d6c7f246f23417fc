/**
 * The WebGPU device planner (plan/planner.ts) through core's pipeline: with crisp's rules
 * (cStruct router, noise floor) planPrefill and sparsePrefill take the device path, and the
 * plan equals the host plan of the same rules on the same backend (routes, VS lists, PE rows,
 * density, per-head check), the outputs are bit-identical and close to the float64
 * reference, and sparsePrefill queues the attention before anything is read back. Shapes:
 * n not a multiple of B, GQA, chunked prefill (q the last m of n). Small shapes
 * (SwiftShader in CI).
 */
import {
  type DeviceTensor,
  hostTensor,
  mulberry32,
  type Policy,
  planPrefill,
  releasePlan,
  runPlan,
  sparsePrefill,
  toFloat32,
} from '@crisp/core';
import { crisp } from '@crisp/presets';
import { createReferenceBackend } from '@crisp/reference';
import { globalCoverage, noiseFloor } from '@crisp/select';
import { describe, expect, it } from 'vitest';
import { createWebGpuBackend, type WebGpuBackend } from './backend.js';
import { PLAN_READ } from './plan/prepared-mask.js';
import { code, settledLiveBuffers, sharedBackend } from './test-support.js';

const { backend, reason } = await sharedBackend();

const D = 64;
const B = 64;

// crisp's router and selector rules at a scale these shapes can have (kMin 128 tokens);
// γ 0.6 so the PE rows leave blocks out
const onDevice: Policy = Object.freeze({
  ...crisp,
  blockSize: B,
  kMin: 128,
  vs: noiseFloor({ alpha: 1, kMin: 128 }),
  pe: globalCoverage({ gamma: 0.6, kMin: 128 }),
});
// the same rules without their device forms (a spread router has none): the host plan
const onHost: Policy = Object.freeze({ ...onDevice, name: 'crisp-host', router: { ...onDevice.router! }, vs: { ...onDevice.vs! } });

/**
 * q [m, H, D], k and v [n, Hkv, D]: noise, plus a direction u at the first keys (the sink)
 * that the even heads' queries follow, and a direction w at keys in the middle that the odd
 * heads' queries follow. Even heads then put their mass in the sink window (C_struct high:
 * VS), odd heads outside both windows (C_struct low: PE).
 */
function inputs(seed: number, n: number, m: number, H: number, Hkv: number, flatHeads: readonly number[] = []) {
  const r = mulberry32(seed);
  const noise = (len: number, amp: number) => Float32Array.from({ length: len }, () => (r() * 2 - 1) * amp);
  const q = noise(m * H * D, 0.5);
  const k = noise(n * Hkv * D, 0.5);
  const v = noise(n * Hkv * D, 1);
  for (let i = 0; i < m; i++) {
    for (let h = 0; h < H; h++) q[(i * H + h) * D + (h % 2 === 0 ? 0 : 1)] += 8;
  }
  // heads whose queries are zero: every score equal, so each pooled row is uniform (PE heads
  // whose maps are all ties)
  for (const h of flatHeads) for (let i = 0; i < m; i++) q.fill(0, (i * H + h) * D, (i * H + h + 1) * D);
  for (let j = 0; j < n; j++) {
    for (let g = 0; g < Hkv; g++) {
      if (j < 8) k[(j * Hkv + g) * D] += 3;
      if (j > n / 3 && j < n / 3 + 150) k[(j * Hkv + g) * D + 1] += 2;
    }
  }
  return { q: hostTensor('f32', [m, H, D], q), k: hostTensor('f32', [n, Hkv, D], k), v: hostTensor('f32', [n, Hkv, D], v) };
}

describe.skipIf(!backend)(`the WebGPU device planner${backend ? '' : `: ${reason}`}`, () => {
  const be = backend!;

  for (const [n, m, H, Hkv, seed, flat] of [
    [600, 600, 4, 2, 5, []],
    [520, 150, 2, 2, 9, []],
    [1400, 1400, 4, 2, 13, [1, 2]],
  ] as const) {
    it(`plans on the device what the host plans, n=${n}, m=${m}, H=${H}, Hkv=${Hkv}${flat.length ? `, heads ${flat} all ties` : ''}`, async () => {
      const x = inputs(seed, n, m, H, Hkv, flat);
      const t = { q: be.upload(x.q), k: be.upload(x.k), v: be.upload(x.v) };
      const outs: DeviceTensor[] = [];
      try {
        const host = await planPrefill(be, t, onHost, { minSparseLength: 0 });
        const dev = await planPrefill(be, t, onDevice, { minSparseLength: 0 });
        expect(host.prepared).toBeUndefined();
        // the device path was taken: its mask is held on the device
        expect(dev.prepared?.released).toBe(false);
        expect(new Set(host.routing!.routes)).toEqual(new Set(['vs', 'pe']));
        expect(dev.routing!.routes).toEqual(host.routing!.routes);
        for (const key of ['verticalPtr', 'vertical', 'slashPtr', 'slash'] as const) {
          expect(Array.from(dev.mask!.vs![key]), key).toEqual(Array.from(host.mask!.vs![key]));
        }
        expect(Array.from(dev.mask!.rows!.rowPtr)).toEqual(Array.from(host.mask!.rows!.rowPtr));
        expect(Array.from(dev.mask!.rows!.cols)).toEqual(Array.from(host.mask!.rows!.cols));
        expect(Array.from(dev.density)).toEqual(Array.from(host.density));
        expect(dev.overallDensity).toBe(host.overallDensity);
        expect(dev.overallDensity).toBeLessThan(0.9);
        expect(Array.from(dev.proxyRecall!)).toEqual(Array.from(host.proxyRecall!));

        // the same kernel over the same blocks: the same bits, on the prepared mask and after its release
        const a = await runPlan(be, host, t, { returnLse: true });
        const b = await runPlan(be, dev, t);
        outs.push(a.output, a.lse!, b.output);
        const want = toFloat32(await be.download(a.output));
        expect(toFloat32(await be.download(b.output))).toEqual(want);
        releasePlan(dev);
        expect(dev.prepared?.released).toBe(true);

        // sparsePrefill on the device cut (the default) reads nothing before its one attention
        // run; with peCut 'host' (the same device) the routes and the PE heads' maps are read
        // back and cut first, each read held back 40 ms here: those reads count in planMs.
        const pe = host.routing!.routes.filter((r) => r === 'pe').length;
        // (seeded: PE heads in every case, the all-ties heads among them)
        expect(pe).toBeGreaterThan(0);
        for (const h of flat) expect(host.routing!.routes[h]).toBe('pe');
        const hold = 40;
        const traced = async (b: WebGpuBackend, inp: typeof t) => {
          const log: string[] = [];
          const g = b.gpu;
          const { read, dispatch } = g;
          g.read = async (...args) => {
            log.push('read');
            await new Promise((r) => setTimeout(r, hold));
            return read.apply(g, args);
          };
          g.dispatch = (enc, pipe, ...rest) => {
            if (pipe.label === 'attentionFma') log.push('attention');
            return dispatch.call(g, enc, pipe, ...rest);
          };
          try {
            const res = await sparsePrefill(b, inp, onDevice, { minSparseLength: 0, returnLse: true });
            const first = log.indexOf('attention');
            expect(log.filter((e) => e === 'attention').length).toBe(1);
            return { res, readsBefore: log.slice(0, first).filter((e) => e === 'read').length };
          } finally {
            g.read = read;
            g.dispatch = dispatch;
          }
        };
        const onHostCut = await createWebGpuBackend({ device: be.gpu.device, peCut: 'host' });
        let res: Awaited<ReturnType<typeof sparsePrefill>>;
        try {
          const inp = { q: onHostCut.upload(x.q), k: onHostCut.upload(x.k), v: onHostCut.upload(x.v) };
          const viaHost = await traced(onHostCut, inp);
          expect(viaHost.readsBefore).toBeGreaterThanOrEqual(2);
          expect(viaHost.res.timings.planMs).toBeGreaterThanOrEqual(viaHost.readsBefore * hold - 1);
          expect(viaHost.res.plan.planMs).toBe(viaHost.res.timings.planMs);
          expect(viaHost.res.plan.phases!.peRowsMs).toBeGreaterThanOrEqual(viaHost.readsBefore * hold - 1);
          expect(viaHost.res.plan.mask).toEqual(host.mask);
          expect(toFloat32(await onHostCut.download(viaHost.res.output))).toEqual(want);
          const viaDevice = await traced(be, t);
          outs.push(viaDevice.res.output, viaDevice.res.lse!);
          expect(viaDevice.readsBefore).toBe(0);
          res = viaDevice.res;
        } finally {
          onHostCut.dispose();
        }
        expect(res.plan.prepared).toBeUndefined();
        expect(res.plan.mask).toEqual(host.mask);
        expect(toFloat32(await be.download(res.output))).toEqual(want);
        expect(toFloat32(await be.download(res.lse!))).toEqual(toFloat32(await be.download(a.lse!)));

        // and close to the float64 reference on the host plan's mask
        const ref = createReferenceBackend();
        const r = await ref.sparseAttention(ref.upload(x.q), ref.upload(x.k), ref.upload(x.v), host.mask!);
        const exact = toFloat32(await ref.download(r.output));
        let err = 0;
        for (let i = 0; i < exact.length; i++) err = Math.max(err, Math.abs(exact[i] - want[i]));
        expect(err).toBeLessThan(1e-4);
        ref.dispose();
      } finally {
        for (const d of [...outs, t.q, t.k, t.v]) d.dispose();
      }
    });
  }

  it('cuts the PE maps on the device exactly as the host does at any gamma (plans only, no attention)', async () => {
    // more heads and blocks than the cases above, a flat head among them, γ from a loose cut to
    // within 1e-7 of 1, where the floors of the fixed-point mass decide whether every block is
    // kept (either way the device and the host must agree)
    const x = inputs(21, 1600, 1600, 6, 2, [3]);
    const t = { q: be.upload(x.q), k: be.upload(x.k), v: be.upload(x.v) };
    try {
      for (const gamma of [0.3, 0.9, 0.9999999]) {
        const pe = globalCoverage({ gamma, kMin: 128 });
        const dev = await planPrefill(be, t, { ...onDevice, pe }, { minSparseLength: 0 });
        const host = await planPrefill(be, t, { ...onHost, pe }, { minSparseLength: 0 });
        expect(dev.prepared, `γ ${gamma}`).toBeDefined();
        expect(dev.routing!.routes.filter((r) => r === 'pe').length, `γ ${gamma}`).toBeGreaterThanOrEqual(2);
        expect(Array.from(dev.mask!.rows!.rowPtr), `γ ${gamma}`).toEqual(Array.from(host.mask!.rows!.rowPtr));
        expect(Array.from(dev.mask!.rows!.cols), `γ ${gamma}`).toEqual(Array.from(host.mask!.rows!.cols));
        expect(Array.from(dev.density), `γ ${gamma}`).toEqual(Array.from(host.density));
        releasePlan(dev);
      }
    } finally {
      for (const d of [t.q, t.k, t.v]) d.dispose();
    }
  });

  it('reads the device plan back in one trip (statistics, lists, PE rows, counts), in two where the PE columns are read once counted', async () => {
    const x = inputs(13, 1400, 1400, 4, 2, [1, 2]);
    const t = { q: be.upload(x.q), k: be.upload(x.k), v: be.upload(x.v) };
    const cap = PLAN_READ.wholeColsMaxBytes;
    try {
      const host = await planPrefill(be, t, onHost, { minSparseLength: 0 });
      expect(host.routing!.routes.filter((r) => r === 'pe').length).toBeGreaterThan(0);
      for (const [wholeColsMaxBytes, trips] of [
        [cap, 1],
        [0, 2],
      ] as const) {
        PLAN_READ.wholeColsMaxBytes = wholeColsMaxBytes;
        await be.synchronize();
        const before = be.gpu.readTrips;
        // the closing synchronize: the plan's reads were queued behind the attention, so once
        // they are back the queue is idle and it waits for nothing
        const skipped = be.gpu.idleWaitsSkipped;
        const res = await sparsePrefill(be, t, onDevice, { minSparseLength: 0 });
        expect(be.gpu.ownsDevice).toBe(true);
        expect(be.gpu.readTrips - before, `columns read whole up to ${wholeColsMaxBytes} bytes`).toBe(trips);
        expect(be.gpu.idleWaitsSkipped - skipped).toBe(1);
        // what came back in those trips is the host's plan
        expect(res.plan.routing!.routes).toEqual(host.routing!.routes);
        expect(res.plan.mask).toEqual(host.mask);
        expect(Array.from(res.plan.density)).toEqual(Array.from(host.density));
        expect(Array.from(res.plan.proxyRecall!)).toEqual(Array.from(host.proxyRecall!));
        res.output.dispose();
      }
    } finally {
      PLAN_READ.wholeColsMaxBytes = cap;
      for (const d of [t.q, t.k, t.v]) d.dispose();
    }
  });

  it('reports NaN inputs as NON_FINITE on the device path and keeps nothing', async () => {
    const x = inputs(3, 300, 300, 2, 2);
    (x.k.data as Float32Array)[5 * 2 * D] = Number.NaN;
    const t = { q: be.upload(x.q), k: be.upload(x.k), v: be.upload(x.v) };
    const before = await settledLiveBuffers(be);
    try {
      expect(await code(sparsePrefill(be, t, onDevice, { minSparseLength: 0 }))).toBe('NON_FINITE');
      expect(await code(planPrefill(be, t, onDevice, { minSparseLength: 0 }))).toBe('NON_FINITE');
      await be.synchronize();
      expect(be.gpu.liveBuffers.buffers).toBe(before);
    } finally {
      for (const d of [t.q, t.k, t.v]) d.dispose();
    }
  });
});
