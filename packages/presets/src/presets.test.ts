import { type Backend, densePolicy, isCrispError, planPrefill, type ProxyStatsOptions } from '@crisp/core';
import { createReferenceBackend } from '@crisp/reference';
import { cStruct } from '@crisp/router';
import { describe, expect, it } from 'vitest';
import { freshSeed, mixedHeads } from './__fixtures__/heads.js';
import { crisp, crispFast, crispGuarded, dense, flexPrefill, presets } from './index.js';

describe('presets', () => {
  it('hold the paper parameters', () => {
    expect(crisp.router).toMatchObject({ name: 'cStruct', tauProxy: 0.2, wSink: 128, wLocal: 128 });
    expect(crisp.vs).toMatchObject({ alpha: 1.0, kMin: 1024 });
    expect(crisp.pe).toMatchObject({ gamma: 0.95, kMin: 1024 });
    expect(crispFast.vs).toMatchObject({ alpha: 1.25, kMin: 1024 });
    expect(crispFast.router).toMatchObject({ tauProxy: 0.2 });
    expect(flexPrefill.router).toMatchObject({ name: 'jsd', tau: 0.1 });
    expect(flexPrefill.vs).toMatchObject({ gamma: 0.95, kMin: 1024, needs: { tokenScores: true } });
    expect(flexPrefill.pe).toMatchObject({ gamma: 0.95 });
    expect(crispGuarded.router?.name).toBe('anyPe(cStruct, residualJsd)');
    expect((crispGuarded.router as unknown as { routers: unknown[] }).routers).toMatchObject([{ tauProxy: 0.2 }, { tau: 0.2, minResidual: 0.3 }]);
    expect(crispGuarded.vs).toMatchObject({ alpha: 1.0, kMin: 1024 });
    expect(crispGuarded.pe).toMatchObject({ gamma: 0.95, kMin: 1024 });
    expect(crispGuarded.peWithVs).toBe(true);
    expect(crispGuarded.recallTarget).toBeUndefined();
    expect(crisp.peWithVs).toBeUndefined();
    expect(dense).toBe(densePolicy);
    expect(Object.keys(presets).sort()).toEqual(['crisp', 'crispFast', 'crispGuarded', 'dense', 'flexPrefill']);
    for (const [name, p] of Object.entries(presets)) expect(p.name).toBe(name);
    expect(Object.isFrozen(crisp)).toBe(true);
  });
});

/** A reference backend that records the options proxyStats was called with. */
function recording(): { be: Backend; calls: ProxyStatsOptions[] } {
  const be = createReferenceBackend();
  const calls: ProxyStatsOptions[] = [];
  const original = be.proxyStats.bind(be);
  (be as { proxyStats: Backend['proxyStats'] }).proxyStats = (q, k, o) => {
    calls.push(o);
    return original(q, k, o);
  };
  return { be, calls };
}

describe("the pipeline takes C_struct's windows from the router (core's StatsNeeds.wSink / wLocal)", () => {
  const seed = freshSeed();
  const x = mixedHeads({ n: 1024, heads: [{ kind: 'sink', strength: 10 }, { kind: 'diffuse' }], seed });

  it('uses the router’s windows, and C_struct changes with them', async () => {
    const { be, calls } = recording();
    const inputs = { q: be.upload(x.q), k: be.upload(x.k) };
    const opts = { minSparseLength: 0 };
    const small = { ...crisp, kMin: 256, blockSize: 64, router: cStruct({ wSink: 16, wLocal: 32 }) };
    const wide = { ...small, router: cStruct({ wSink: 256, wLocal: 256 }) };
    const a = await planPrefill(be, inputs, small, opts);
    const b = await planPrefill(be, inputs, wide, opts);
    expect(calls.map((c) => [c.wSink, c.wLocal])).toEqual([
      [16, 32],
      [256, 256],
    ]);
    // More anchor tokens, more anchor mass, on the diffuse head especially (seed in the name).
    expect(b.stats!.cStruct[1], `seed ${seed}`).toBeGreaterThan(a.stats!.cStruct[1]);
    // A router without windows falls back to the policy's.
    const plain = { ...small, router: { name: 'plain', route: small.router.route }, wSink: 48, wLocal: 80 };
    await planPrefill(be, inputs, plain, opts);
    expect([calls[2].wSink, calls[2].wLocal]).toEqual([48, 80]);
  });

  it('rejects a policy whose windows contradict its router', async () => {
    const { be } = recording();
    const inputs = { q: be.upload(x.q), k: be.upload(x.k) };
    const bad = { ...crisp, kMin: 256, blockSize: 64, wSink: 64 };
    await expect(planPrefill(be, inputs, bad, { minSparseLength: 0 })).rejects.toSatisfy(
      (e: unknown) => isCrispError(e, 'INVALID_ARGUMENT') && /wSink/.test((e as Error).message),
    );
    // Agreeing values are fine.
    const ok = await planPrefill(be, inputs, { ...crisp, kMin: 256, blockSize: 64, wSink: 128 }, { minSparseLength: 0 });
    expect(ok.routing?.routes.length).toBe(2);
  });
});
