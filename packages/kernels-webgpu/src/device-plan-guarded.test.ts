/**
 * crispGuarded's rules in the WebGPU device planner (plan/planner.ts): the residual test of
 * residualJsd beside cStruct (kernels/route-residual.ts), PE heads keeping the noise floor's
 * lists, narrowed to p_v > κ ā outside a band of C_struct (kernels/select.ts). Through core's
 * pipeline the plan takes the device path and equals the host plan of the same rules on the
 * same backend; the device's residual distances are within 1e-5 of core's f64 ones, far inside
 * the planner's margin. Small shapes (SwiftShader in CI).
 */
import {
  type DeviceTensor,
  headSlice,
  hostTensor,
  mulberry32,
  type Policy,
  planPrefill,
  releasePlan,
  residualDistance,
  sparsePrefill,
  toFloat32,
} from '@crisp/core';
import { crispGuarded, flexPrefill } from '@crisp/presets';
import { anyPe, cStruct, jsd, residualJsd } from '@crisp/router';
import { cumulativeCoverage, globalCoverage, noiseFloor } from '@crisp/select';
import { describe, expect, it } from 'vitest';
import { WEBGPU_PLAN_MARGIN } from './kernels/route-residual.js';
import { code, settledLiveBuffers, sharedBackend } from './test-support.js';

const { backend, reason } = await sharedBackend();

const D = 64;
const B = 64;

/**
 * q [n, H, D], k and v [n, Hkv, D]: noise plus, per head, a sink (the first keys), a few
 * needle keys and a content-driven part (a direction a random third of the keys share), each
 * with its own weight, so C_struct, the residual mass and its distance spread over the heads.
 */
function inputs(seed: number, n: number, H: number, Hkv: number) {
  const r = mulberry32(seed);
  const noise = (len: number, amp: number) => Float32Array.from({ length: len }, () => (r() * 2 - 1) * amp);
  const q = noise(n * H * D, 0.5);
  const k = noise(n * Hkv * D, 0.5);
  const v = noise(n * Hkv * D, 1);
  const w = Array.from({ length: H }, () => [1 + 6 * r(), 12 * r(), 1 + 6 * r()]);
  for (let i = 0; i < n; i++) {
    for (let h = 0; h < H; h++) {
      q[(i * H + h) * D] += w[h][0];
      q[(i * H + h) * D + 1] += w[h][1];
      q[(i * H + h) * D + 2] += w[h][2];
    }
  }
  for (let j = 0; j < n; j++) {
    for (let g = 0; g < Hkv; g++) {
      if (j < 16) k[(j * Hkv + g) * D] += 2;
      if (j % 311 === 7) k[(j * Hkv + g) * D + 1] += 4;
      if (r() < 0.33) k[(j * Hkv + g) * D + 2] += 1;
    }
  }
  return { q: hostTensor('f32', [n, H, D], q), k: hostTensor('f32', [n, Hkv, D], k), v: hostTensor('f32', [n, Hkv, D], v) };
}

/** crispGuarded's rules at these shapes' scale, with the thresholds given. */
function guarded(tauProxy: number, tau: number, band: { from: number; below: number }): Policy {
  return Object.freeze({
    ...crispGuarded,
    name: 'crispGuarded-small',
    blockSize: B,
    kMin: 128,
    router: anyPe([cStruct({ tauProxy, wSink: B, wLocal: B }), residualJsd({ tau, minResidual: 0.3 })]),
    vs: noiseFloor({ alpha: 1.5, kMin: 128 }),
    peVs: noiseFloor({ alpha: 1, kMin: 128 }),
    pe: globalCoverage({ gamma: 0.6, kMin: 128 }),
    peVsExcess: 1,
    peVsFullAnchor: band,
  });
}

/** A threshold between the two sorted values around the middle of `xs`, at least `gap` from both. */
function between(xs: number[], gap: number): number {
  const s = [...new Set(xs)].sort((a, b) => a - b);
  for (let m = Math.floor(s.length / 2); m >= 1; m--) if (s[m] - s[m - 1] > 2 * gap) return (s[m] + s[m - 1]) / 2;
  throw new Error(`no gap of ${2 * gap} among ${s.join(', ')}`);
}

describe.skipIf(!backend)(`crispGuarded's rules in the WebGPU device planner${backend ? '' : `: ${reason}`}`, () => {
  const be = backend!;

  it('lists the distance tests, anyPe, cumulative coverage and the PE heads\' lists beside crisp\'s rules', () => {
    expect(be.planner.routers).toEqual(['cStruct', 'residualJsd', 'jsd', 'anyPe']);
    expect(be.planner.selectors).toEqual(['noiseFloor', 'cumulativeCoverage']);
    expect([be.planner.peWithVs, be.planner.peVs, be.planner.peVsExcess]).toEqual([true, true, true]);
    expect(be.planner.margin).toBe(WEBGPU_PLAN_MARGIN);
  });

  // (one shape: the conformance suite's devicePlanGuarded cases compare the same plans at its
  // small shapes, GQA 4 and 8 included; this one sets the thresholds from the statistics so
  // that every kind of head occurs, and runs the attention on both plans)
  for (const [n, H, Hkv, seed] of [[1800, 12, 4, 3]] as const) {
    it(`plans on the device what the host plans with the same rules, n=${n}, H=${H}, Hkv=${Hkv}`, async () => {
      const x = inputs(seed, n, H, Hkv);
      const t = { q: be.upload(x.q), k: be.upload(x.k), v: be.upload(x.v) };
      const outs: DeviceTensor[] = [];
      try {
        // thresholds from the statistics: τ_proxy between the middle C_struct values, the
        // residual τ between the middle distances of the heads it keeps on VS (with residual
        // mass), each at least 1e-3 from every head's value, and the band of full lists
        // below the second smallest C_struct
        const st = await be.proxyStats(t.q, t.k, { blockSize: B, wSink: B, wLocal: B });
        const Nb = st.numBlocks;
        const cs = Array.from(st.cStruct);
        const tauProxy = between(cs, 1e-3);
        const ds = cs.flatMap((c, h) => {
          const r = residualDistance(headSlice(st.verticalBlocks, h, Nb), headSlice(st.pooledEstimate, h, Nb));
          return c >= tauProxy && r.residual >= 0.3 ? [r.distance] : [];
        });
        const tau = between(ds, 1e-3);
        const sorted = [...cs].sort((a, b) => a - b);
        const policy = guarded(tauProxy, tau, { from: 0, below: (sorted[0] + sorted[1]) / 2 });
        const onHost: Policy = Object.freeze({ ...policy, name: 'guarded-host', router: { ...policy.router! } });

        const host = await planPrefill(be, t, onHost, { minSparseLength: 0 });
        const dev = await planPrefill(be, t, policy, { minSparseLength: 0 });
        expect(host.prepared).toBeUndefined();
        expect(dev.hostReason).toBeUndefined();
        expect(dev.prepared?.released).toBe(false);
        // every kind of head: PE by C_struct, PE by the residual test alone, VS; narrowed and full PE lists
        const routes = host.routing!.routes;
        expect(dev.routing!.routes).toEqual(routes);
        const byResidual = routes.filter((r, h) => r === 'pe' && cs[h] >= tauProxy).length;
        expect(byResidual).toBeGreaterThan(0);
        expect(routes.filter((r, h) => r === 'pe' && cs[h] < tauProxy).length).toBeGreaterThan(0);
        expect(routes.filter((r) => r === 'vs').length).toBeGreaterThan(0);
        for (const key of ['verticalPtr', 'vertical', 'slashPtr', 'slash'] as const) {
          expect(Array.from(dev.mask!.vs![key]), key).toEqual(Array.from(host.mask!.vs![key]));
        }
        expect(Array.from(dev.mask!.rows!.rowPtr)).toEqual(Array.from(host.mask!.rows!.rowPtr));
        expect(Array.from(dev.mask!.rows!.cols)).toEqual(Array.from(host.mask!.rows!.cols));
        expect(Array.from(dev.density)).toEqual(Array.from(host.density));
        expect(Array.from(dev.proxyRecall!)).toEqual(Array.from(host.proxyRecall!));
        // the narrowing took blocks off: the full lists keep more
        const full = await planPrefill(be, t, { ...onHost, peVsExcess: undefined, peVsFullAnchor: undefined }, { minSparseLength: 0 });
        expect(full.mask!.vs!.vertical.length).toBeGreaterThan(host.mask!.vs!.vertical.length);

        // sparsePrefill on the device plan: the same output bits as on the host plan
        const a = await sparsePrefill(be, t, onHost, { minSparseLength: 0 });
        const b = await sparsePrefill(be, t, policy, { minSparseLength: 0 });
        outs.push(a.output, b.output);
        expect(b.plan.hostReason).toBeUndefined();
        expect(b.plan.mask).toEqual(host.mask);
        expect(toFloat32(await be.download(b.output))).toEqual(toFloat32(await be.download(a.output)));
      } finally {
        for (const d of [...outs, t.q, t.k, t.v]) d.dispose();
      }
    });
  }

  it('computes the residual distances within 1e-5 of the f64 ones and the residual mass test exactly', async () => {
    const x = inputs(3, 2600, 16, 4);
    const t = { q: be.upload(x.q), k: be.upload(x.k) };
    try {
      const stats = await be.proxyStats(t.q, t.k, { blockSize: B, wSink: B, wLocal: B, deferRead: true });
      const sel = await be.deviceVsPlan(stats, {
        tauProxy: Number.NEGATIVE_INFINITY,
        vs: { kind: 'noiseFloor', alpha: 1, kMin: 128 },
        peK: 2,
        residual: { tau: 0.5, minResidual: 0.3 },
      });
      const got = (await sel.residual())!;
      sel.release();
      await stats.settle!();
      const Nb = stats.numBlocks;
      let worst = 0;
      let tested = 0;
      for (let h = 0; h < 16; h++) {
        const host = residualDistance(headSlice(stats.verticalBlocks, h, Nb), headSlice(stats.pooledEstimate, h, Nb));
        const pe = host.residual >= 0.3 && host.residual > 0 && host.distance < 0.5;
        expect(got[h * 4], `head ${h}`).toBe(pe ? 1 : 0);
        expect(Math.abs(got[h * 4 + 1] - host.residual), `head ${h} residual`).toBeLessThan(1e-6);
        if (host.residual >= 0.3) {
          worst = Math.max(worst, Math.abs(got[h * 4 + 2] - host.distance));
          tested++;
        }
      }
      expect(tested).toBeGreaterThanOrEqual(8);
      expect(worst).toBeLessThan(1e-5);
    } finally {
      t.q.dispose();
      t.k.dispose();
    }
  });

  it('reports NaN and Inf inputs as NON_FINITE on the guarded and coverage device paths, keeps nothing and plans the next input', async () => {
    const [n, H, Hkv] = [400, 4, 2];
    const x = inputs(5, n, H, Hkv);
    const flex: Policy = Object.freeze({
      ...flexPrefill,
      name: 'flexPrefill-small',
      blockSize: B,
      kMin: 128,
      router: jsd({ tau: 0.1 }),
      vs: cumulativeCoverage({ gamma: 0.9, kMin: 128 }),
      pe: globalCoverage({ gamma: 0.6, kMin: 128 }),
    });
    const policies = [guarded(0.2, 0.2, { from: 0.05, below: 0.2 }), flex];
    // a value of q's last row (a proxy row), or of a key row every proxy row sees
    const spoiled = (which: 'q' | 'k', value: number) => {
      const t = which === 'q' ? x.q : x.k;
      const vals = toFloat32(t).slice();
      const row = t.shape[1] * t.shape[2];
      vals[which === 'q' ? vals.length - row + 3 : 5 * row + 1] = value;
      return hostTensor('f32', t.shape, vals);
    };
    const clean = { q: be.upload(x.q), k: be.upload(x.k), v: be.upload(x.v) };
    try {
      for (const [which, value] of [
        ['q', Number.NaN],
        ['k', Number.NaN],
        ['k', Number.POSITIVE_INFINITY],
      ] as const) {
        const bad = be.upload(spoiled(which, value));
        const t = which === 'q' ? { ...clean, q: bad } : { ...clean, k: bad };
        const before = await settledLiveBuffers(be);
        try {
          for (const policy of policies) {
            const what = `${policy.name}, ${value} in ${which}`;
            expect(await code(sparsePrefill(be, t, policy, { minSparseLength: 0 })), what).toBe('NON_FINITE');
            expect(await code(planPrefill(be, t, policy, { minSparseLength: 0 })), what).toBe('NON_FINITE');
          }
          await be.synchronize();
          expect(be.gpu.liveBuffers.buffers, `${value} in ${which}`).toBe(before);
        } finally {
          bad.dispose();
        }
      }
      // the backend plans the clean input on the device afterwards, as the host does
      for (const policy of policies) {
        const onHost: Policy = Object.freeze({ ...policy, name: `${policy.name}-host`, router: { ...policy.router! } });
        const dev = await planPrefill(be, clean, policy, { minSparseLength: 0 });
        const host = await planPrefill(be, clean, onHost, { minSparseLength: 0 });
        expect(dev.hostReason, policy.name).toBeUndefined();
        expect(dev.mask, policy.name).toEqual(host.mask);
        releasePlan(dev);
      }
    } finally {
      for (const d of [clean.q, clean.k, clean.v]) d.dispose();
    }
  });
});
