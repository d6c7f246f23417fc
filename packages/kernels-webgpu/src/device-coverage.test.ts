/**
 * FlexPrefill's cumulative coverage on the device (kernels/coverage.ts, in the selection
 * program): on token scores made to break a sloppy count (one token holding nearly all the
 * mass, long runs of equal values, prefixes summing to γ exactly, scores below and at 2^-29,
 * heavy tails), the device's lists are the host selector's exactly, for several γ and n on
 * both sides of the host's 4,096-token fast path. Small shapes (SwiftShader in CI).
 */
import {
  type DeviceTensor,
  headSlice,
  hostTensor,
  jsDistance,
  mulberry32,
  numBlocks,
  type Policy,
  planPrefill,
  type ProxyStats,
  type Route,
  selectVsLists,
  sparsePrefill,
  toFloat32,
} from '@crisp/core';
import { flexPrefill } from '@crisp/presets';
import { jsd } from '@crisp/router';
import { coverageTokenCount, cumulativeCoverage, globalCoverage } from '@crisp/select';
import { describe, expect, it } from 'vitest';
import { coverageLimit, coverageProbeProgram } from './kernels/coverage.js';
import { Usage } from './runtime/gpu-context.js';
import { seededValues, sharedBackend } from './test-support.js';

const { backend, reason } = await sharedBackend();

const B = 64;

/** One head's token scores (f32, summing to about 1) of a kind `kind`. */
function tokens(kind: number, n: number, r: () => number): Float32Array {
  const a = new Float32Array(n);
  switch (kind % 6) {
    case 0: // a sink holding nearly all the mass
      a.fill(0.04 / (n - 1));
      a[0] = 0.96;
      break;
    case 1: // every score equal
      a.fill(1 / n);
      break;
    case 2: // powers of two: the running sum meets γ = 0.5, 0.75, 0.875 exactly
      for (let i = 0; i < n; i++) a[i] = i < 20 ? 2 ** -(i + 1) : 2 ** -21 / (n - 20);
      break;
    case 3: // scores around 2^-29 besides a few large ones
      for (let i = 0; i < n; i++) a[i] = i < 8 ? 0.12 : i % 3 === 0 ? 2 ** -29 : 2 ** -30;
      break;
    case 4: // a heavy tail with runs of equal values
      for (let i = 0; i < n; i++) a[i] = Math.fround(1 / (1 + Math.floor(i / 7)) ** 1.3);
      break;
    default: // random, heavy-tailed
      for (let i = 0; i < n; i++) a[i] = r() ** 6;
  }
  if (kind % 6 === 4 || kind % 6 === 5) {
    let s = 0;
    for (const x of a) s += x;
    for (let i = 0; i < n; i++) a[i] = Math.fround(a[i] / s);
  }
  // shuffled (a fixed permutation), so runs of equal digits do not follow the index
  for (let i = n - 1; i > 0; i--) {
    const j = Math.floor(r() * (i + 1));
    [a[i], a[j]] = [a[j], a[i]];
  }
  return a;
}

/** Host statistics with those token scores and block scores their block sums (f32). */
function statsOf(n: number, H: number, seed: number): ProxyStats {
  const r = mulberry32(seed);
  const Nb = numBlocks(n, B);
  const verticalTokens = new Float32Array(H * n);
  const slashTokens = new Float32Array(H * n);
  const verticalBlocks = new Float64Array(H * Nb);
  const slashBlocks = new Float64Array(H * Nb);
  for (let h = 0; h < H; h++) {
    verticalTokens.set(tokens(h, n, r), h * n);
    slashTokens.set(tokens(h + 3, n, r), h * n);
    for (let J = 0; J < Nb; J++) {
      let v = 0;
      let s = 0;
      for (let j = J * B; j < Math.min(n, J * B + B); j++) {
        v += verticalTokens[h * n + j];
        s += slashTokens[h * n + j];
      }
      verticalBlocks[h * Nb + J] = Math.fround(v);
      slashBlocks[h * Nb + J] = Math.fround(s);
    }
  }
  return {
    n,
    heads: H,
    blockSize: B,
    numBlocks: Nb,
    proxyRows: B,
    cStruct: Float64Array.from({ length: H }, (_, h) => Math.fround(0.1 + 0.1 * h)),
    rowEntropy: new Float64Array(H),
    verticalBlocks,
    slashBlocks,
    pooledEstimate: new Float64Array(H * Nb).fill(1 / Nb),
    verticalTokens,
    slashTokens,
  };
}

describe.skipIf(!backend)(`cumulative coverage on the WebGPU device${backend ? '' : `: ${reason}`}`, () => {
  const be = backend!;

  it('counts the tokens exactly as the host definition does (f64 running sum over the sorted scores)', async () => {
    const g = be.gpu;
    const pipe = await g.pipeline(coverageProbeProgram());
    const bad: string[] = [];
    for (const [n, H, seed] of [
      [700, 6, 4],
      [5000, 6, 5],
    ] as const) {
      const stats = statsOf(n, H, seed);
      // head 0's vertical scores: 1/2, 1/4, 1/8, then 100 of 2^-29 and the rest 2^-31, so at
      // γ = 7/8 + 37 · 2^-29 the sum crosses at the 38th score of the smallest exact unit
      const edge = stats.verticalTokens!.subarray(0, n);
      edge.fill(2 ** -31);
      edge.set([0.5, 0.25, 0.125]);
      edge.fill(2 ** -29, 3, 103);
      const tv = g.createBuffer(H * n * 4, Usage.STORAGE | Usage.COPY_DST, 'probe.tokV');
      const ts = g.createBuffer(H * n * 4, Usage.STORAGE | Usage.COPY_DST, 'probe.tokS');
      g.writeBuffer(tv, 0, stats.verticalTokens!);
      g.writeBuffer(ts, 0, stats.slashTokens!);
      for (const gamma of [0.5, 0.75, 0.875, 0.875 + 37 * 2 ** -29, 0.9, 0.95, 0.99]) {
        const [gHi, gLo] = coverageLimit(gamma);
        const u = g.uniform([n, gHi, gLo, H]);
        const out = g.createBuffer(2 * H * 4, Usage.STORAGE | Usage.COPY_SRC, 'probe.out');
        const enc = g.device.createCommandEncoder();
        g.dispatch(enc, pipe, [u, tv, ts, out], [2, H]);
        g.submit(enc, [u]);
        const got = new Uint32Array(await g.read(out, 0, 2 * H * 4));
        g.retire(out);
        for (let dir = 0; dir < 2; dir++) {
          const tok = dir === 0 ? stats.verticalTokens! : stats.slashTokens!;
          for (let h = 0; h < H; h++) {
            const want = coverageTokenCount(tok.subarray(h * n, (h + 1) * n), gamma);
            if (got[dir * H + h] !== want) bad.push(`n ${n} γ ${gamma} dir ${dir} head ${h}: ${got[dir * H + h]}, expected ${want}`);
          }
        }
      }
      g.retire(tv, ts);
    }
    expect(bad).toEqual([]);
  });

  for (const [n, H, seed] of [
    [3000, 6, 1],
    [9000, 6, 2],
  ] as const) {
    it(`selects the host's lists, n=${n}`, async () => {
      const stats = statsOf(n, H, seed);
      // heads 0-2 PE (C_struct 0.1-0.3 under τ 0.35), the rest VS
      const tauProxy = 0.35;
      const routes = Array.from(stats.cStruct, (c): Route => (c >= tauProxy ? 'vs' : 'pe'));
      for (const gamma of [0.5, 0.75, 0.9, 0.95, 0.99]) {
        for (const withVs of [false, true]) {
          const plan = await be.deviceVsPlan(stats, { tauProxy, vs: { kind: 'cumulativeCoverage', gamma, kMin: B }, peK: 2, peWithVs: withVs });
          try {
            const got = await plan.read();
            expect(got.routes).toEqual(routes);
            const want = selectVsLists(stats, routes, cumulativeCoverage({ gamma, kMin: B }), 2, { withVs });
            for (const key of ['verticalPtr', 'vertical', 'slashPtr', 'slash'] as const) {
              expect(Array.from(got.vs[key]), `γ ${gamma}, PE lists ${withVs}: ${key}`).toEqual(Array.from(want[key]));
            }
          } finally {
            plan.release();
          }
        }
      }
    });
  }

  it('plans flexPrefill on the device as the host plans the same rules (jsd routes, coverage lists, PE rows, output bits)', async () => {
    const [n, H, Hkv, D] = [1500, 8, 2, 64];
    const q = seededValues(31, n * H * D);
    const k = seededValues(32, n * Hkv * D);
    // a sink and a middle stripe some heads follow, so the JS distances spread
    for (let i = 0; i < n; i++) for (let h = 0; h < H; h++) q[(i * H + h) * D + (h % 3)] += 2 + h;
    for (let j = 0; j < n; j++) {
      for (let g = 0; g < Hkv; g++) {
        if (j < 16) k[(j * Hkv + g) * D] += 2;
        if (j > 600 && j < 700) k[(j * Hkv + g) * D + 1] += 1.5;
      }
    }
    const t = {
      q: be.upload(hostTensor('f32', [n, H, D], q)),
      k: be.upload(hostTensor('f32', [n, Hkv, D], k)),
      v: be.upload(hostTensor('f32', [n, Hkv, D], seededValues(33, n * Hkv * D))),
    };
    const outs: DeviceTensor[] = [];
    try {
      // τ between the middle JS distances (at least 1e-3 from each), so both routes occur
      const st = await be.proxyStats(t.q, t.k, { blockSize: B, wSink: B, wLocal: B });
      const Nb = st.numBlocks;
      const ds = Array.from({ length: H }, (_, h) => jsDistance(headSlice(st.pooledEstimate, h, Nb), headSlice(st.verticalBlocks, h, Nb))).sort((a, b) => a - b);
      const m = ds.findIndex((d, i) => i >= H / 2 && d - ds[i - 1] > 2e-3);
      expect(m).toBeGreaterThan(0);
      const policy: Policy = Object.freeze({
        ...flexPrefill,
        name: 'flexPrefill-small',
        blockSize: B,
        kMin: 128,
        router: jsd({ tau: (ds[m] + ds[m - 1]) / 2 }),
        vs: cumulativeCoverage({ gamma: 0.9, kMin: 128 }),
        pe: globalCoverage({ gamma: 0.6, kMin: 128 }),
      });
      const onHost: Policy = Object.freeze({ ...policy, name: 'flex-host', router: { ...policy.router! } });
      const host = await planPrefill(be, t, onHost, { minSparseLength: 0 });
      const dev = await planPrefill(be, t, policy, { minSparseLength: 0 });
      expect(host.prepared).toBeUndefined();
      expect(dev.hostReason).toBeUndefined();
      expect(new Set(host.routing!.routes)).toEqual(new Set(['vs', 'pe']));
      expect(dev.routing!.routes).toEqual(host.routing!.routes);
      expect(dev.mask).toEqual(host.mask);
      expect(Array.from(dev.density)).toEqual(Array.from(host.density));
      const a = await sparsePrefill(be, t, onHost, { minSparseLength: 0 });
      const b = await sparsePrefill(be, t, policy, { minSparseLength: 0 });
      outs.push(a.output, b.output);
      expect(b.plan.hostReason).toBeUndefined();
      expect(toFloat32(await be.download(b.output))).toEqual(toFloat32(await be.download(a.output)));
      // the device plan's token scores stayed on the device (tokenScores 'device'): its
      // statistics hold none, where the host plan's, which its selector read, hold them
      expect(dev.stats!.verticalTokens).toBeUndefined();
      expect(dev.stats!.slashTokens).toBeUndefined();
      expect(host.stats!.verticalTokens?.length).toBe(H * n);
      // and a settled 'device' request reads none back: the bytes read are the statistics'
      const g = be.gpu;
      const read = g.read;
      let bytes = 0;
      g.read = (buf, offset, size) => {
        bytes += size;
        return read.call(g, buf, offset, size);
      };
      try {
        for (const tokenScores of ['device', true] as const) {
          bytes = 0;
          const st2 = await be.proxyStats(t.q, t.k, { blockSize: B, wSink: B, wLocal: B, tokenScores, deferRead: true });
          await st2.settle!();
          expect(st2.cStruct.length).toBe(H);
          if (tokenScores === 'device') {
            expect(st2.verticalTokens).toBeUndefined();
            expect(bytes).toBeLessThan(H * n * 4);
          } else {
            expect(st2.verticalTokens?.length).toBe(H * n);
            expect(bytes).toBeGreaterThan(2 * H * n * 4);
          }
        }
      } finally {
        g.read = read;
      }
    } finally {
      for (const d of [...outs, t.q, t.k, t.v]) d.dispose();
    }
  });

  it('refuses statistics without token scores, and peVsExcess beside coverage, with typed errors', async () => {
    const stats = { ...statsOf(300, 2, 3), verticalTokens: undefined, slashTokens: undefined };
    const rule = { kind: 'cumulativeCoverage' as const, gamma: 0.9, kMin: B };
    await expect(be.deviceVsPlan(stats, { tauProxy: 0, vs: rule, peK: 2 })).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
    await expect(be.deviceVsPlan(statsOf(300, 2, 3), { tauProxy: 0, vs: rule, peK: 2, peWithVs: true, excess: 2 })).rejects.toMatchObject({
      code: 'INVALID_ARGUMENT',
    });
  });
});
