/**
 * The paper's claims on heads built from crafted Q/K, through the reference backend and the
 * real pipeline (proxyStats -> router -> selector): Figure 1's two failure modes of γ
 * coverage and the noise floor's fix, and routing agreement between C_struct and JSD.
 * (The O(n) claim up to 512k runs on score vectors in @crisp/select: the reference stops
 * at 64k tokens.)
 */
import { type Policy, planPrefill, vsHead } from '@crisp/core';
import { createReferenceBackend } from '@crisp/reference';
import { cStruct, entropy, jsd, routingAgreement } from '@crisp/router';
import { cumulativeCoverage, noiseFloor } from '@crisp/select';
import { describe, expect, it } from 'vitest';
import { cliffHead, freshSeed, type HeadKind, mixedHeads } from './__fixtures__/heads.js';
import { crisp, flexPrefill } from './index.js';

const B = 128;
const SIGNAL = [5, 12, 20, 27, 33, 41, 50, 58];

/** Vertical key blocks the plan selected for head 0. */
async function verticalOf(policy: Policy, head: ReturnType<typeof cliffHead>): Promise<Int32Array> {
  const be = createReferenceBackend();
  const plan = await planPrefill(be, { q: be.upload(head.q), k: be.upload(head.k) }, policy, { scale: 1 });
  expect(plan.routing?.routes).toEqual(['vs']);
  return vsHead(plan.mask!.vs!, 0).vertical;
}

function backgroundOf(kept: Int32Array, Nb: number): number[] {
  return Array.from(kept).filter((J) => J !== 0 && J !== Nb - 1 && !SIGNAL.includes(J));
}

// CRISP's and FlexPrefill's VS selectors behind the same router, so only selection differs.
const withKMin = (kMin: number) => ({
  gamma: { ...flexPrefill, name: 'gamma', router: cStruct(), vs: cumulativeCoverage({ gamma: 0.95, kMin }), kMin },
  floor: { ...crisp, name: 'floor', vs: noiseFloor({ alpha: 1, kMin }), kMin },
});

describe('Figure 1 on crafted Q/K through the reference backend', () => {
  it('sink 0.93 with 8 signal blocks: γ = 0.95 keeps none of the 8; the noise floor keeps all 8', async () => {
    const seed = freshSeed();
    const n = 8192;
    const Nb = n / B;
    const head = cliffHead({ n, blockSize: B, sink: 0.93, local: 0.03, signal: 0.03, signalBlocks: SIGNAL, jitter: 0.1, seed });
    const be = createReferenceBackend();
    const stats = await be.proxyStats(be.upload(head.q), be.upload(head.k), { blockSize: B, wSink: B, wLocal: B, scale: 1 });
    const msg = `seed ${seed}`;
    expect(stats.verticalBlocks[0], msg).toBeCloseTo(0.93, 3);

    // k_min = one block: the coverage rule alone decides. It stops inside the anchors.
    const one = withKMin(B);
    const gamma = await verticalOf(one.gamma, head);
    const floor = await verticalOf(one.floor, head);
    expect(SIGNAL.filter((J) => gamma.includes(J)), msg).toEqual([]);
    expect(Array.from(gamma), msg).toEqual([0]);
    expect(Array.from(floor), msg).toEqual([0, ...SIGNAL, Nb - 1]);

    // The presets' k_min = 1024 (8 blocks) only pads γ up to 8 blocks, two of them anchors:
    // it still loses 2 of the 8 signal blocks, while the noise floor keeps all 8.
    const def = withKMin(1024);
    const gammaDefault = await verticalOf(def.gamma, head);
    expect(gammaDefault.length, msg).toBe(8);
    expect(SIGNAL.filter((J) => gammaDefault.includes(J)).length, msg).toBe(6);
    expect(Array.from(await verticalOf(def.floor, head)), msg).toEqual([0, ...SIGNAL, Nb - 1]);
  });

  it('sink 0.91: γ = 0.95 adds 10 or more near-zero blocks; the noise floor adds none', async () => {
    const seed = freshSeed();
    const n = 16384;
    const Nb = n / B;
    const head = cliffHead({ n, blockSize: B, sink: 0.91, local: 0.013, signal: 0.02, signalBlocks: SIGNAL, jitter: 0.1, seed });
    const { gamma, floor } = withKMin(1024);
    const g = await verticalOf(gamma, head);
    const f = await verticalOf(floor, head);
    const noise = backgroundOf(g, Nb);
    console.log(`Figure 1b (seed ${seed}): γ keeps ${noise.length} background blocks, the noise floor ${backgroundOf(f, Nb).length}`);
    expect(noise.length, `seed ${seed}`).toBeGreaterThanOrEqual(10);
    expect(SIGNAL.every((J) => g.includes(J)), `seed ${seed}`).toBe(true);
    expect(Array.from(f), `seed ${seed}`).toEqual([0, ...SIGNAL, Nb - 1]);
  });
});

describe('routing agreement on constructed heads', () => {
  const kinds: Array<{ kind: HeadKind; strength?: number; clear: boolean }> = [
    { kind: 'sink', strength: 10, clear: true },
    { kind: 'sink', strength: 11, clear: true },
    { kind: 'sink', strength: 12, clear: true },
    { kind: 'diffuse', clear: true },
    { kind: 'diffuse', clear: true },
    { kind: 'diffuse', clear: true },
    { kind: 'sink', strength: 6, clear: false },
    { kind: 'local', strength: 15, clear: false },
  ];

  it('clear-cut heads (strong sink; diffuse) route the same under C_struct and JSD', async () => {
    const seed = freshSeed();
    const x = mixedHeads({ n: 4096, heads: kinds, seed });
    const be = createReferenceBackend();
    const stats = await be.proxyStats(be.upload(x.q), be.upload(x.k), { blockSize: B, wSink: B, wLocal: B });
    const c = cStruct().route(stats);
    const j = jsd().route(stats);
    const e = entropy().route(stats);
    const msg = `seed ${seed}: C_struct ${Array.from(c.scores, (s) => s.toFixed(3))}, D ${Array.from(j.scores, (s) => s.toFixed(3))}`;
    const clear = kinds.map((k, h) => (k.clear ? h : -1)).filter((h) => h >= 0);
    const expected = clear.map((h) => (kinds[h].kind === 'sink' ? 'vs' : 'pe'));
    expect(clear.map((h) => c.routes[h]), msg).toEqual(expected);
    expect(clear.map((h) => j.routes[h]), msg).toEqual(expected);
    expect(clear.map((h) => e.routes[h]), msg).toEqual(expected);
    expect(routingAgreement(clear.map((h) => c.routes[h]), clear.map((h) => j.routes[h]))).toBe(1);
    // A pure local (slash) head: its mass sits in the local window, so C_struct says VS; the
    // pooled estimate sees the same last-block mass as p_v, so JSD is small and says PE.
    // JSD compares vertical (key-block) distributions only: it cannot see slash structure.
    const local = kinds.findIndex((k) => k.kind === 'local');
    expect([c.routes[local], j.routes[local]], msg).toEqual(['vs', 'pe']);
    const all = routingAgreement(c, j);
    console.log(`routing agreement C_struct vs JSD on ${kinds.length} constructed heads: ${all} (${msg})`);
    expect(all).toBeLessThan(1);
  });
});
