/**
 * The device selection (ops/device-select.ts, kernels/select.ts) against the host rules:
 * the f64 threshold bit for bit on edge and random inputs, then on proxyStats' statistics
 * the same routes, the same VS lists, the same expanded block counts, and attention on the
 * device-expanded mask bit-identical to attention on the host's mask. Small shapes
 * (SwiftShader in CI).
 */
import { type BlockMask, type Route, hostTensor, mulberry32, numBlocks, selectVsLists, selectedBlockCounts, toFloat32 } from '@crisp/core';
import { noiseFloor } from '@crisp/select';
import { describe, expect, it } from 'vitest';
import { thresholdProbeProgram } from './kernels/select.js';
import { tauKey } from './ops/device-select.js';
import { Usage } from './runtime/gpu-context.js';
import { seededValues, sharedBackend } from './test-support.js';

const { backend, reason } = await sharedBackend();

/** The host's threshold, as @crisp/select computes it. */
function hostThreshold(a: number, b: number, alpha: number, Nb: number): number {
  return alpha * (Math.max(1 - a - b, 0) / (Nb - 2));
}

function f32Bits(x: number): number {
  return new Uint32Array(Float32Array.of(x).buffer)[0];
}

describe.skipIf(!backend)(`device VS selection (WebGPU)${backend ? '' : `: ${reason}`}`, () => {
  const be = backend!;

  it('computes the noise floor threshold in f64 bit for bit', async () => {
    const r = mulberry32(7);
    const f = (x: number) => Math.fround(x);
    const cases: [number, number, number, number][] = [
      [0.5, 0.25, 1, 10],
      [0, 0, 1, 3],
      [1, 0, 1, 5],
      [0.75, 0.5, 1, 7],
      [f(1 - 2 ** -24), f(2 ** -30), 1.25, 1000],
      [f(2 ** -140), f(2 ** -149), 1e-300, 33],
      [f(1e-30), 0, 1e300, 3],
      [f(0.3), f(0.3), 1e308, 4],
      [f(0.1), f(0.2), 0.7, 65535],
      [f(0.999), f(0.0009), 3, 2 ** 20 + 7],
      [f(-0.25), f(0.5), 1, 12],
    ];
    for (let i = 0; i < 2000; i++) {
      const a = f(r() ** (1 + 8 * r()));
      const b = f(r() * (1 - a) * (r() < 0.1 ? 1 : r()));
      const alpha = r() < 0.2 ? 1 : r() < 0.5 ? 0.5 + r() : 2 ** (60 * r() - 30);
      cases.push([a, b, alpha, 3 + Math.floor(r() * (r() < 0.5 ? 100 : 60000))]);
    }
    const inputs = new Uint32Array(cases.length * 5);
    cases.forEach(([a, b, alpha, Nb], i) => {
      const d = new Uint32Array(Float64Array.of(alpha).buffer);
      inputs.set([f32Bits(a), f32Bits(b), d[1], d[0], Nb], i * 5);
    });
    const g = be.gpu;
    const pipe = await g.pipeline(thresholdProbeProgram());
    const inB = g.u32Buffer(inputs, 'probe.in');
    const outB = g.createBuffer(cases.length * 8, Usage.STORAGE | Usage.COPY_SRC, 'probe.out');
    const enc = g.device.createCommandEncoder();
    g.dispatch(enc, pipe, [inB, outB], [Math.ceil(cases.length / 64)]);
    g.submit(enc, [inB]);
    const got = new Uint32Array(await g.read(outB, 0, cases.length * 8));
    g.retire(outB);
    const bad: string[] = [];
    cases.forEach(([a, b, alpha, Nb], i) => {
      const want = new Uint32Array(Float64Array.of(hostThreshold(a, b, alpha, Nb)).buffer);
      if (got[2 * i] !== want[1] || got[2 * i + 1] !== want[0]) {
        const d = new Float64Array(new Uint32Array([got[2 * i + 1], got[2 * i]]).buffer)[0];
        bad.push(`a=${a} b=${b} alpha=${alpha} Nb=${Nb}: got ${d}, expected ${hostThreshold(a, b, alpha, Nb)}`);
      }
    });
    expect(bad.slice(0, 5)).toEqual([]);
  });

  it('keys τ to the smallest f32 at or above it', () => {
    const key = (x: number) => {
      const b = f32Bits(x);
      return (b & 0x7fffffff) === 0 ? 0x80000000 : b >>> 31 ? ~b >>> 0 : (b | 0x80000000) >>> 0;
    };
    const r = mulberry32(3);
    for (let i = 0; i < 5000; i++) {
      const tau = (r() - 0.3) * 2 ** (40 * r() - 20);
      const c = Math.fround(tau + (r() - 0.5) * Math.abs(tau) * 2 ** -22);
      expect(key(c) >= tauKey(tau)).toBe(c >= tau);
    }
    expect(tauKey(1e300)).toBe(key(Number.POSITIVE_INFINITY));
    expect(tauKey(-0)).toBe(key(0));
  });

  for (const [n, H, B, seed] of [
    [1100, 4, 64, 11],
  ] as const) {
    it(`gives the host's routes, lists, block counts and attention bits at n=${n}, H=${H}, B=${B}`, async () => {
      const D = 64;
      const q = be.upload(hostTensor('f32', [n, H, D], seededValues(seed, n * H * D)));
      const k = be.upload(hostTensor('f32', [n, H, D], seededValues(seed + 1, n * H * D)));
      const v = be.upload(hostTensor('f32', [n, H, D], seededValues(seed + 2, n * H * D)));
      const Nb = numBlocks(n, B);
      try {
        const stats = await be.proxyStats(q, k, { blockSize: B, wSink: B, wLocal: B });
        const sorted = [...stats.cStruct].sort((a, b) => a - b);
        const tauProxy = (sorted[Math.floor(H / 2) - 1] + sorted[Math.floor(H / 2)]) / 2;
        const routes = Array.from(stats.cStruct, (c): Route => (c >= tauProxy ? 'vs' : 'pe'));
        expect(new Set(routes).size).toBe(2);
        for (const alpha of [1, 1e6]) {
          const rule = { kind: 'noiseFloor' as const, alpha, kMin: 2 * B };
          const plan = await be.deviceVsPlan(stats, { tauProxy, vs: rule, peK: 2 });
          try {
            const got = await plan.read();
            expect(got.routes).toEqual(routes);
            const want = selectVsLists(stats, routes, noiseFloor({ alpha, kMin: 2 * B }), 2);
            for (const key of ['verticalPtr', 'vertical', 'slashPtr', 'slash'] as const) expect(Array.from(got.vs[key])).toEqual(Array.from(want[key]));
            const mask: BlockMask = { heads: H, numBlocks: Nb, blockSize: B, vs: want };
            expect(Array.from(await plan.blockCounts())).toEqual(Array.from(selectedBlockCounts(mask)));
            const onDevice = await plan.attention(q, k, v);
            const onHost = await be.sparseAttention(q, k, v, mask);
            expect(toFloat32(await be.download(onDevice.output))).toEqual(toFloat32(await be.download(onHost.output)));
            onDevice.output.dispose();
            onHost.output.dispose();
          } finally {
            plan.release();
          }
        }
      } finally {
        for (const t of [q, k, v]) t.dispose();
      }
    });
  }
});
