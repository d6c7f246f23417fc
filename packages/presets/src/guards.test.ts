/**
 * The per-head check (PrefillPlan.proxyRecall) against brute force, the alternative path's
 * recall, the guards (Policy.recallTarget, Policy.peWithVs, Policy.peVsExcess) and the anyPe router, on the
 * reference backend.
 */
import { alternativeRecall, type HostTensor, type Policy, type PrefillPlan, planPrefill, type ProxyStats, vsHead } from '@crisp/core';
import { createReferenceBackend, massRecall } from '@crisp/reference';
import { anyPe, cStruct, fixed, jsd } from '@crisp/router';
import { globalCoverage, noiseFloor, topK } from '@crisp/select';
import { describe, expect, it } from 'vitest';
import { freshSeed, type HeadKind, mixedHeads } from './__fixtures__/heads.js';
import { crisp, crispGuarded, flexPrefill } from './index.js';

const n = 2048;
const B = 64;
const kinds: Array<{ kind: HeadKind; strength?: number }> = [
  { kind: 'sink', strength: 9 },
  { kind: 'local', strength: 12 },
  { kind: 'diffuse' },
  { kind: 'sink', strength: 4 },
];
const H = kinds.length;
const lastRows = Array.from({ length: B }, (_, i) => n - B + i);

function at64(p: Policy): Policy {
  return { ...p, blockSize: B, kMin: 256, pe: globalCoverage({ gamma: 0.95, kMin: 256 }), vs: p.vs?.name.startsWith('noiseFloor') ? noiseFloor({ kMin: 256 }) : p.vs };
}

async function planOn(x: { q: HostTensor; k: HostTensor; v: HostTensor }, policy: Policy) {
  const be = createReferenceBackend();
  const inputs = { q: be.upload(x.q), k: be.upload(x.k), v: be.upload(x.v) };
  return planPrefill(be, inputs, policy, { minSparseLength: 0 });
}

describe('PrefillPlan.proxyRecall', () => {
  it.each(['crisp', 'crispGuarded', 'flexPrefill'] as const)('equals the exact mass of the last query block inside its mask row (%s)', async (name) => {
    const seed = freshSeed();
    const x = mixedHeads({ n, heads: kinds, seed });
    const base = { crisp, crispGuarded, flexPrefill }[name];
    const policy = name === 'flexPrefill' ? { ...base, blockSize: B, kMin: 256, pe: globalCoverage({ gamma: 0.95, kMin: 256 }), vs: topK({ k: 4 }) } : at64(base);
    const plan = await planOn(x, policy);
    const exact = massRecall(x.q, x.k, plan.mask!, { rows: lastRows }).perHead;
    expect(plan.proxyRecall, `seed ${seed}`).toBeDefined();
    for (let h = 0; h < H; h++) expect(plan.proxyRecall![h], `seed ${seed} head ${h}`).toBeCloseTo(exact[h], 9);
    // some head lost mass, so the check is not trivially 1
    expect(Math.min(...plan.proxyRecall!), `seed ${seed}`).toBeLessThan(0.999);
  });

  it('reports the other path: the VS selector for PE heads, the pooled estimate for VS heads (NaN without it)', async () => {
    const seed = freshSeed();
    const x = mixedHeads({ n, heads: kinds, seed });
    // every head PE: the alternative is the VS selector's lists, exactly
    const peP = at64({ ...crisp, name: 'allPe', router: fixed('pe') });
    const allPe = await planOn(x, peP);
    const allVs = await planOn(x, at64({ ...crisp, name: 'allVs', router: fixed('vs') }));
    const altPe = alternativeRecall(allPe, peP);
    for (let h = 0; h < H; h++) {
      expect(altPe[h], `seed ${seed} head ${h}`).toBeCloseTo(allVs.proxyRecall![h], 12);
    }
    // cStruct does not read the pooled estimate: no estimate for VS heads
    const cP = at64(crisp);
    const c = await planOn(x, cP);
    const altC = alternativeRecall(c, cP);
    for (let h = 0; h < H; h++) {
      if (c.routing!.routes[h] === 'vs') expect(Number.isNaN(altC[h])).toBe(true);
    }
    // a router that reads it (jsd): the estimate is a share of the mass
    const jP = at64({ ...crisp, name: 'jsdVs', router: anyPe([fixed('vs'), jsd()]) });
    const j = await planOn(x, jP);
    const altJ = alternativeRecall(j, jP);
    for (let h = 0; h < H; h++) {
      if (j.routing!.routes[h] === 'vs') {
        expect(altJ[h]).toBeGreaterThan(0);
        expect(altJ[h]).toBeLessThanOrEqual(1);
      }
    }
    // only with the plan's own sparse policy
    expect(() => alternativeRecall(j, cP)).toThrow(/the sparse policy the plan was made with/);
  });
});

describe('the recall guard (Policy.recallTarget)', () => {
  it('tops every head up to the target with vertical blocks, keeps the unguarded blocks, and counts them', async () => {
    const seed = freshSeed();
    const x = mixedHeads({ n, heads: kinds, seed });
    // a deliberately poor selector: the 4 best blocks only, and PE for the diffuse heads
    const poor: Policy = { name: 'poor', blockSize: B, kMin: 256, router: cStruct(), vs: topK({ k: 4 }), pe: globalCoverage({ gamma: 0.5, kMin: 256 }) };
    const before = await planOn(x, poor);
    const target = 0.97;
    const after = await planOn(x, { ...poor, name: 'poorGuarded', recallTarget: target });
    const exact = massRecall(x.q, x.k, after.mask!, { rows: lastRows }).perHead;
    const msg = `seed ${seed}`;
    expect(after.guardAdded, msg).toBeDefined();
    let guarded = 0;
    for (let h = 0; h < H; h++) {
      expect(after.proxyRecall![h], `${msg} head ${h}`).toBeCloseTo(exact[h], 9);
      expect(after.proxyRecall![h], `${msg} head ${h}`).toBeGreaterThanOrEqual(Math.min(target, 1) - 1e-12);
      const was = vsHead(before.mask!.vs!, h).vertical;
      const now = vsHead(after.mask!.vs!, h).vertical;
      for (const J of was) expect(now.includes(J), `${msg} head ${h} block ${J}`).toBe(true);
      expect(now.length - was.length, `${msg} head ${h}`).toBe(after.guardAdded![h]);
      if (before.proxyRecall![h] >= target) expect(after.guardAdded![h]).toBe(0);
      else {
        expect(after.guardAdded![h]).toBeGreaterThan(0);
        guarded++;
      }
      expect(after.density[h]).toBeGreaterThanOrEqual(before.density[h]);
    }
    expect(guarded, `${msg}: the poor selector left some head below ${target}`).toBeGreaterThan(0);
    expect(before.guardAdded).toBeUndefined();
  });

  it('is refused outside (0, 1]', async () => {
    const x = mixedHeads({ n, heads: kinds, seed: 3 });
    for (const bad of [0, -0.5, 1.5, Number.NaN, '0.9']) {
      await expect(planOn(x, at64({ ...crisp, name: 'bad', recallTarget: bad as number }))).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
    }
  });
});

describe('PE heads with the VS lists too (Policy.peWithVs)', () => {
  /** Fresh mixed heads planned by crisp, by crisp with peWithVs, and with every head VS. */
  async function peWithVsPlans() {
    const seed = freshSeed();
    const x = mixedHeads({ n, heads: kinds, seed });
    const plain = await planOn(x, at64(crisp));
    const both = await planOn(x, at64({ ...crisp, name: 'both', peWithVs: true }));
    const allVs = await planOn(x, at64({ ...crisp, name: 'allVs', router: fixed('vs') }));
    return { seed, x, plain, both, allVs };
  }

  /** The sorted, duplicate-free union of two block lists (brute force). */
  const union = (a: ArrayLike<number>, c: ArrayLike<number>) => [...new Set([...Array.from(a), ...Array.from(c)])].sort((u, w) => u - w);

  /** Head h keeps the same vertical and slash lists in both plans. */
  function expectSameVsLists(got: PrefillPlan, want: PrefillPlan, h: number, label: string): void {
    const g = vsHead(got.mask!.vs!, h);
    const w = vsHead(want.mask!.vs!, h);
    expect(Array.from(g.vertical), label).toEqual(Array.from(w.vertical));
    expect(Array.from(g.slash), label).toEqual(Array.from(w.slash));
  }

  it('keeps both the PE rows and the VS selector lists on PE heads, and changes nothing on VS heads', async () => {
    const { seed, plain, both, allVs } = await peWithVsPlans();
    const msg = `seed ${seed}`;
    expect(both.routing!.routes, msg).toEqual(plain.routing!.routes);
    expect(plain.routing!.routes.includes('pe'), msg).toBe(true);
    for (let h = 0; h < H; h++) {
      if (plain.routing!.routes[h] === 'vs') {
        expectSameVsLists(both, plain, h, `${msg} head ${h}`);
        continue;
      }
      const p = vsHead(plain.mask!.vs!, h);
      const b = vsHead(both.mask!.vs!, h);
      const sel = vsHead(allVs.mask!.vs!, h);
      expect(Array.from(b.vertical), `${msg} head ${h}`).toEqual(union(p.vertical, sel.vertical));
      expect(Array.from(b.slash), `${msg} head ${h}`).toEqual(union(p.slash, sel.slash));
      expect(both.density[h], `${msg} head ${h}`).toBeGreaterThanOrEqual(plain.density[h]);
      // the proxy rows keep at least what either path alone keeps
      expect(both.proxyRecall![h] + 1e-12, `${msg} head ${h}`).toBeGreaterThanOrEqual(Math.max(plain.proxyRecall![h], allVs.proxyRecall![h]));
    }
    // the PE rows are the same rows
    expect(Array.from(both.mask!.rows!.cols), msg).toEqual(Array.from(plain.mask!.rows!.cols));
  });

  it('with peVsExcess κ: PE heads keep only the vertical blocks the pooled estimate under-reads by κ, and no extra slash list', async () => {
    const { seed, x, plain, both, allVs } = await peWithVsPlans();
    const kappa = 2;
    const lean = await planOn(x, at64({ ...crisp, name: 'lean', peWithVs: true, peVsExcess: kappa }));
    const msg = `seed ${seed}`;
    expect(lean.routing!.routes, msg).toEqual(plain.routing!.routes);
    const Nb = lean.numBlocks;
    const st = lean.stats!;
    let narrowed = 0;
    for (let h = 0; h < H; h++) {
      if (plain.routing!.routes[h] === 'vs') {
        expectSameVsLists(lean, plain, h, `${msg} head ${h}`);
        continue;
      }
      const p = vsHead(plain.mask!.vs!, h);
      const l = vsHead(lean.mask!.vs!, h);
      // brute force from the statistics: the selector's vertical blocks J with p_v[J] > κ ā[J]
      const pv = st.verticalBlocks.subarray(h * Nb, (h + 1) * Nb);
      const pa = st.pooledEstimate.subarray(h * Nb, (h + 1) * Nb);
      const under = Array.from(vsHead(allVs.mask!.vs!, h).vertical).filter((J) => pv[J] > kappa * pa[J]);
      expect(Array.from(l.vertical), `${msg} head ${h}`).toEqual(union(p.vertical, under));
      expect(Array.from(l.slash), `${msg} head ${h}`).toEqual(Array.from(p.slash));
      expect(lean.density[h], `${msg} head ${h}`).toBeGreaterThanOrEqual(plain.density[h]);
      expect(lean.density[h], `${msg} head ${h}`).toBeLessThanOrEqual(both.density[h]);
      if (lean.density[h] < both.density[h]) narrowed++;
    }
    // the diffuse head, which the pooled map serves, keeps fewer blocks than with every VS list
    expect(narrowed, msg).toBeGreaterThan(0);
    expect(Array.from(lean.mask!.rows!.cols), msg).toEqual(Array.from(plain.mask!.rows!.cols));
  });

  it('with peVsFullAnchor: PE heads whose C_struct lies in the band keep the full lists, the others are narrowed', async () => {
    const { seed, x, plain, both } = await peWithVsPlans();
    const msg = `seed ${seed}`;
    const lean = await planOn(x, at64({ ...crisp, name: 'lean', peWithVs: true, peVsExcess: 2 }));
    const st = lean.stats!;
    const pe = plain.routing!.routes.flatMap((r, h) => (r === 'pe' ? [h] : []));
    // a band around the C_struct of one PE head that the narrowing changes (and no other's)
    const h0 = pe.find((h) => lean.density[h] < both.density[h])!;
    expect(h0, msg).toBeDefined();
    const others = pe.filter((h) => h !== h0 && st.cStruct[h] !== st.cStruct[h0]);
    expect(others.length, msg).toBeGreaterThan(0);
    const band = { from: st.cStruct[h0], below: Math.min(1, st.cStruct[h0] + 1e-9) };
    const banded = await planOn(x, at64({ ...crisp, name: 'banded', peWithVs: true, peVsExcess: 2, peVsFullAnchor: band }));
    expectSameVsLists(banded, both, h0, `${msg} head ${h0} (in the band)`);
    for (const h of others) expectSameVsLists(banded, lean, h, `${msg} head ${h} (outside it)`);
    for (let h = 0; h < H; h++) if (plain.routing!.routes[h] === 'vs') expectSameVsLists(banded, plain, h, `${msg} head ${h}`);
    // [from, below): a head at `below` is outside
    const above = await planOn(x, at64({ ...crisp, name: 'above', peWithVs: true, peVsExcess: 2, peVsFullAnchor: { from: 0, below: st.cStruct[h0] } }));
    expectSameVsLists(above, lean, h0, `${msg} head ${h0} (at below)`);
  });

  it('peVsFullAnchor is checked: 0 <= from < below <= 1, and only beside peVsExcess', async () => {
    const x = mixedHeads({ n: 512, heads: kinds, seed: 3 });
    for (const bad of [{ from: 0.2, below: 0.1 }, { from: 0.1, below: 0.1 }, { from: -0.1, below: 0.2 }, { from: 0, below: 1.5 }, { from: 0 }, 0.1, null]) {
      await expect(planOn(x, at64({ ...crisp, name: 'bad', peWithVs: true, peVsExcess: 2, peVsFullAnchor: bad as never })), JSON.stringify(bad)).rejects.toMatchObject({
        code: 'INVALID_ARGUMENT',
        message: expect.stringMatching(/peVsFullAnchor must be \{ from, below \} with 0 <= from < below <= 1/),
      });
    }
    await expect(planOn(x, at64({ ...crisp, name: 'alone', peWithVs: true, peVsFullAnchor: { from: 0.05, below: 0.2 } }))).rejects.toMatchObject({
      code: 'INVALID_ARGUMENT',
      message: expect.stringMatching(/peVsFullAnchor exempts heads from peVsExcess's narrowing, so it needs peVsExcess/),
    });
  });

  it('peVsExcess is checked: a finite number above 0, and only beside peWithVs', async () => {
    const x = mixedHeads({ n: 512, heads: kinds, seed: 3 });
    for (const bad of [0, -1, Number.NaN, Number.POSITIVE_INFINITY, '2']) {
      await expect(planOn(x, at64({ ...crisp, name: 'bad', peWithVs: true, peVsExcess: bad as number })), String(bad)).rejects.toMatchObject({
        code: 'INVALID_ARGUMENT',
        message: expect.stringMatching(/peVsExcess must be a finite number above 0/),
      });
    }
    await expect(planOn(x, at64({ ...crisp, name: 'alone', peVsExcess: 2 }))).rejects.toMatchObject({
      code: 'INVALID_ARGUMENT',
      message: expect.stringMatching(/peVsExcess narrows the VS lists PE heads keep, so it needs peWithVs: true/),
    });
  });
});

describe('anyPe', () => {
  const stats = (c: number[], pv: number[][], pooled: number[][]): ProxyStats => {
    const Nb = pv[0].length;
    return {
      n: Nb * 128,
      heads: c.length,
      blockSize: 128,
      numBlocks: Nb,
      proxyRows: 128,
      cStruct: Float64Array.from(c),
      verticalBlocks: Float64Array.from(pv.flat()),
      slashBlocks: Float64Array.from(pv.flat()),
      pooledEstimate: Float64Array.from(pooled.flat()),
      rowEntropy: new Float64Array(c.length),
    };
  };

  it('routes PE when either router does, with the first router scores', () => {
    const r = anyPe([cStruct({ tauProxy: 0.2 }), jsd({ tau: 0.1 })]);
    // head 0: strong sink, pooled far from p_v (VS by both); head 1: weak sink (cStruct PE);
    // head 2: strong sink but the pooled estimate equals p_v (jsd PE)
    const pv = [0.7, 0.1, 0.1, 0.1];
    const s = stats([0.8, 0.1, 0.8], [pv, pv, pv], [[0.05, 0.05, 0.1, 0.8], [0.05, 0.05, 0.1, 0.8], pv]);
    const d = r.route(s);
    expect(d.routes).toEqual(['vs', 'pe', 'pe']);
    expect(Array.from(d.scores)).toEqual([0.8, 0.1, 0.8]);
    expect(d.scoreName).toBe('C_struct');
    expect(d.threshold).toBe(0.2);
    expect(r.needs).toEqual({ wSink: 128, wLocal: 128, optionalStats: ['pooledEstimate'] });
    // both parts have device forms: so has the union (C_struct < 0.2, or the distance over every block < 0.1)
    expect(r.device).toEqual({ kind: 'anyPe', rules: [{ kind: 'cStruct', tauProxy: 0.2 }, { kind: 'jsd', tau: 0.1 }] });
  });

  it('merges needs and refuses routers that disagree on a window or too few routers', () => {
    expect(() => anyPe([cStruct({ wSink: 64 }), cStruct({ wSink: 128 })])).toThrow(/wSink/);
    expect(() => anyPe([cStruct()])).toThrow(/at least two/);
    // a router that declares nothing needs every statistic
    const mine = { name: 'mine', route: (s: ProxyStats) => fixed('vs').route(s) };
    expect(anyPe([mine, cStruct()]).needs?.optionalStats).toBeUndefined();
    expect(anyPe([fixed('vs'), cStruct()]).needs?.optionalStats).toEqual([]);
  });
});
