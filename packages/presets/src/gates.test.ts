import { isCrispError, planPrefill, type ProxyStats, vsHead } from '@crisp/core';
import { createReferenceBackend } from '@crisp/reference';
import { fixed } from '@crisp/router';
import { describe, expect, it } from 'vitest';
import { freshSeed, mixedHeads } from './__fixtures__/heads.js';
import { crisp } from './index.js';

// The pipeline's gates and the PE heads' FlexPrefill minimum, through the reference backend.
describe('pipeline gates and PE minimum blocks', () => {
  const seed = freshSeed();

  it('goes dense at n <= max(2B, kMin rounded up to B) and sparse one token later', async () => {
    const be = createReferenceBackend();
    const policy = { ...crisp, blockSize: 64, kMin: 256 };
    for (const [n, reason] of [
      [256, 'min-length'],
      [257, undefined],
    ] as const) {
      const x = mixedHeads({ n, heads: [{ kind: 'sink', strength: 10 }], seed });
      const q = be.upload(x.q);
      const k = be.upload(x.k);
      const plan = await planPrefill(be, { q, k }, policy, { minSparseLength: 0 });
      expect(plan.denseReason, `n=${n} seed ${seed}`).toBe(reason);
      expect(plan.mask === undefined).toBe(reason !== undefined);
      // phases split planMs for sparse plans only: four non-negative parts, within the total
      expect(plan.phases === undefined).toBe(reason !== undefined);
      if (plan.phases) {
        const parts = [plan.phases.statsMs, plan.phases.selectMs, plan.phases.peRowsMs, plan.phases.maskMs];
        for (const x of parts) expect(x).toBeGreaterThanOrEqual(0);
        expect(parts.reduce((a, b) => a + b, 0)).toBeLessThanOrEqual(plan.planMs + 1e-9);
      }
    }
  });

  it("asks the backend's per-call gate (sparseCrossoverFor: dtype, head dim) before sparseCrossover, and checks what it returns", async () => {
    const asked: [string, number][] = [];
    let answer = 5000;
    const be = Object.assign(createReferenceBackend({ sparseCrossover: 0 }), {
      sparseCrossoverFor: (dtype: string, headDim: number) => {
        asked.push([dtype, headDim]);
        return answer;
      },
    });
    const x = mixedHeads({ n: 4096, heads: [{ kind: 'sink', strength: 10 }], seed });
    const t = { q: be.upload(x.q), k: be.upload(x.k) };
    expect((await planPrefill(be, t, crisp)).denseReason).toBe('length-gate');
    expect(asked).toEqual([[x.q.dtype, x.q.shape[2]]]);
    answer = 4096;
    expect((await planPrefill(be, t, crisp)).denseReason).toBeUndefined();
    // the caller's minSparseLength still wins, and the backend is not asked
    expect((await planPrefill(be, t, crisp, { minSparseLength: 8192 })).denseReason).toBe('length-gate');
    expect(asked).toHaveLength(2);
    answer = Number.NaN;
    const e = await planPrefill(be, t, crisp).catch((err: unknown) => err);
    expect(isCrispError(e) && e.code).toBe('INVALID_ARGUMENT');
    expect(String((e as Error).message)).toContain('sparseCrossoverFor');
  });

  it('gives PE heads the kMin/B best vertical and slash blocks with block 0 forced in (the sink column, the diagonal)', async () => {
    const be = createReferenceBackend();
    const n = 1024;
    const B = 64;
    const x = mixedHeads({ n, heads: [{ kind: 'diffuse' }, { kind: 'sink', strength: 10 }], seed });
    const q = be.upload(x.q);
    const k = be.upload(x.k);
    const policy = { ...crisp, blockSize: B, kMin: 256, router: fixed('pe'), pe: { ...crisp.pe!, kMin: 256 } };
    const plan = await planPrefill(be, { q, k }, policy, { minSparseLength: 0 });
    const Nb = n / B;
    for (let h = 0; h < 2; h++) {
      const { vertical, slash } = vsHead(plan.mask!.vs!, h);
      // the kMin / B best of each direction with block 0 (the sink column, the diagonal) forced
      // in, as FlexPrefill's PE heads: one more block where 0 does not rank among them
      const best = (p: Float64Array) => Array.from(p.keys()).sort((a, c) => p[c] - p[a] || a - c).slice(0, 256 / B);
      const want = (p: Float64Array) => [...new Set([0, ...best(p)])].sort((a, c) => a - c);
      expect(Array.from(vertical), `head ${h} seed ${seed}`).toEqual(want(plan.stats!.verticalBlocks.subarray(h * Nb, (h + 1) * Nb)));
      expect(Array.from(slash), `head ${h} seed ${seed}`).toEqual(want(plan.stats!.slashBlocks.subarray(h * Nb, (h + 1) * Nb)));
      expect(Math.max(...vertical, ...slash)).toBeLessThan(Nb);
    }
  });

  it('rejects a PE selector without kMin and a non-finite length gate', async () => {
    const be = createReferenceBackend();
    const x = mixedHeads({ n: 512, heads: [{ kind: 'sink', strength: 10 }], seed });
    const q = be.upload(x.q);
    const k = be.upload(x.k);
    const code = async (p: Promise<unknown>) => p.then(
      () => 'resolved',
      (e) => (isCrispError(e) ? e.code : String(e)),
    );
    const noKMin = { ...crisp, blockSize: 64, kMin: 128, pe: { name: 'pe', gamma: 0.9 } as never };
    expect(await code(planPrefill(be, { q, k }, noKMin, { minSparseLength: 0 }))).toBe('INVALID_ARGUMENT');
    expect(await code(planPrefill(be, { q, k }, { ...crisp, blockSize: 64, kMin: 128 }, { minSparseLength: Number.NaN }))).toBe(
      'INVALID_ARGUMENT',
    );
  });
});

describe("the router's declared optional statistics", () => {
  it('reach the backend as proxyStats options, and a malformed declaration is a typed error before any work', async () => {
    const be = createReferenceBackend();
    const x = mixedHeads({ n: 2048, heads: [{ kind: 'sink', strength: 10 }], seed: freshSeed() });
    const q = be.upload(x.q);
    const k = be.upload(x.k);
    const seen: unknown[] = [];
    const proxyStats = be.proxyStats.bind(be);
    be.proxyStats = (qq, kk, opts) => {
      seen.push(opts.optionalStats);
      return proxyStats(qq, kk, opts);
    };
    await planPrefill(be, { q, k }, crisp, { minSparseLength: 0 });
    // crisp's C_struct router reads neither; a router that does not say gets all of them
    const { needs: _n, ...undeclared } = crisp.router!;
    await planPrefill(be, { q, k }, { ...crisp, router: { ...undeclared, route: (s) => crisp.router!.route(s) } }, { minSparseLength: 0 });
    expect(seen).toEqual([[], undefined]);
    const bad = { ...crisp, router: { ...undeclared, route: (s: ProxyStats) => crisp.router!.route(s), needs: { optionalStats: ['entropy'] } } };
    const err = await planPrefill(be, { q, k }, bad as unknown as typeof crisp, { minSparseLength: 0 }).catch((e) => e);
    expect(isCrispError(err) && err.code).toBe('INVALID_ARGUMENT');
    expect(seen).toHaveLength(2);
  });
});

describe("a policy's derived plan inputs (validated and derived once for a frozen policy)", () => {
  it('checks a mutable policy on every call, a frozen one once, and passes a scale given per call', async () => {
    const be = createReferenceBackend();
    const x = mixedHeads({ n: 1024, heads: [{ kind: 'sink', strength: 10 }], seed: freshSeed() });
    const q = be.upload(x.q);
    const k = be.upload(x.k);
    const seen: { scale?: number; wSink: number }[] = [];
    const proxyStats = be.proxyStats.bind(be);
    be.proxyStats = (qq, kk, opts) => {
      seen.push({ scale: opts.scale, wSink: opts.wSink });
      return proxyStats(qq, kk, opts);
    };
    const code = (p: Promise<unknown>) => p.then(
      () => 'resolved',
      (e) => (isCrispError(e) ? e.code : String(e)),
    );
    // a mutable policy changed between calls: the second call sees the change
    const mutable: { -readonly [K in keyof typeof crisp]: (typeof crisp)[K] } = { ...crisp, blockSize: 64, kMin: 256 };
    expect(await code(planPrefill(be, { q, k }, mutable, { minSparseLength: 0 }))).toBe('resolved');
    mutable.kMin = 0;
    expect(await code(planPrefill(be, { q, k }, mutable, { minSparseLength: 0 }))).toBe('INVALID_ARGUMENT');
    mutable.kMin = 256;
    mutable.wSink = 64;
    // (the router declares wSink 128: a policy that contradicts it is rejected, call after call)
    expect(await code(planPrefill(be, { q, k }, mutable, { minSparseLength: 0 }))).toBe('INVALID_ARGUMENT');
    expect(await code(planPrefill(be, { q, k }, mutable, { minSparseLength: 0 }))).toBe('INVALID_ARGUMENT');
    // a frozen one, twice, then with a scale of its own: the same windows, the scale as given
    const frozen = Object.freeze({ ...crisp, blockSize: 64, kMin: 256 });
    await planPrefill(be, { q, k }, frozen, { minSparseLength: 0 });
    await planPrefill(be, { q, k }, frozen, { minSparseLength: 0 });
    await planPrefill(be, { q, k }, frozen, { minSparseLength: 0, scale: 0.05 });
    await planPrefill(be, { q, k }, frozen, { minSparseLength: 0 });
    expect(seen).toEqual([
      { scale: undefined, wSink: 128 },
      { scale: undefined, wSink: 128 },
      { scale: undefined, wSink: 128 },
      { scale: 0.05, wSink: 128 },
      { scale: undefined, wSink: 128 },
    ]);
    // a frozen policy whose windows conflict is rejected on every call, not only the first
    const conflicting = Object.freeze({ ...crisp, blockSize: 64, kMin: 256, wSink: 64 });
    expect(await code(planPrefill(be, { q, k }, conflicting, { minSparseLength: 0 }))).toBe('INVALID_ARGUMENT');
    expect(await code(planPrefill(be, { q, k }, conflicting, { minSparseLength: 0 }))).toBe('INVALID_ARGUMENT');
  });
});
