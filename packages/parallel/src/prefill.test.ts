import { expandToRows, type HostTensor, type Policy, planPrefill, sparsePrefill, toFloat32 } from '@crisp/core';
import { crisp } from '@crisp/presets';
import { crispGuardedSmall, crispSmall, flexPrefillSmall } from '@crisp/conformance';
import { createReferenceBackend } from '@crisp/reference';
import { scenario } from '@crisp/synth';
import { describe, expect, it } from 'vitest';
import { createLocalGroup } from './local-group.js';
import { shardTensor, unshardTensor, zigzagLayout } from './layout.js';
import { parallelPrefill } from './prefill.js';
import { neededBlocks, ownedBlocks } from './exchange.js';

const dims = { heads: 4, kvHeads: 2, headDim: 32 };

/** A scenario's whole q, k, v and the single-backend plan and output they give. */
async function single(profile: 'llama-like' | 'mixed-threshold', n: number, seed: number, dtype: 'f32' | 'bf16', policy: Policy) {
  const sc = scenario(profile, { n, ...dims, seed, dtype });
  const { q, k, v } = sc.rows(0, n);
  const be = createReferenceBackend();
  const [qd, kd, vd] = [q, k, v].map((t) => be.upload(t));
  const plan = await planPrefill(be, { q: qd, k: kd }, policy, { minSparseLength: 0 });
  const res = await sparsePrefill(be, { q: qd, k: kd, v: vd }, policy, { minSparseLength: 0 });
  const out = await be.download(res.output);
  return { q, k, v, plan, out };
}

async function sharded(P: number, q: HostTensor, k: HostTensor, v: HostTensor, policy: Policy) {
  const layout = zigzagLayout(q.shape[0], P, policy.blockSize ?? 128);
  const comms = createLocalGroup(P);
  const results = await Promise.all(
    comms.map((comm, r) =>
      parallelPrefill(comm, createReferenceBackend(), layout, { q: shardTensor(layout, r, q), k: shardTensor(layout, r, k), v: shardTensor(layout, r, v) }, policy),
    ),
  );
  return { layout, results, output: unshardTensor(layout, results.map((x) => x.output)) };
}

describe('parallelPrefill over ranks in one thread', () => {
  const cases = [
    { P: 2, n: 1500, profile: 'llama-like', dtype: 'f32', policy: crispSmall },
    { P: 3, n: 1337, profile: 'mixed-threshold', dtype: 'bf16', policy: crispGuardedSmall },
    { P: 4, n: 2048, profile: 'llama-like', dtype: 'bf16', policy: flexPrefillSmall },
  ] as const;
  for (const c of cases) {
    it(`P=${c.P}, n=${c.n}, ${c.profile}, ${c.dtype}, ${c.policy.name}: the single backend's plan and output rows`, async () => {
      const s = await single(c.profile, c.n, 11 + c.P, c.dtype, c.policy);
      const p = await sharded(c.P, s.q, s.k, s.v, c.policy);
      for (const { plan } of p.results) {
        // the same routes and mask as one backend made, on every rank
        expect(plan.denseReason).toBeUndefined();
        expect(plan.routing!.routes).toEqual(s.plan.routing!.routes);
        expect(plan.mask).toEqual(s.plan.mask);
        expect(Array.from(plan.density)).toEqual(Array.from(s.plan.density));
        // statistics equal to rounding (sums across ranks), the pooled estimate exactly
        const a = plan.stats!;
        const b = s.plan.stats!;
        expect(Array.from(a.pooledEstimate)).toEqual(Array.from(b.pooledEstimate));
        for (const key of ['cStruct', 'rowEntropy', 'verticalBlocks', 'slashBlocks'] as const) {
          for (let i = 0; i < a[key].length; i++) expect(Math.abs(a[key][i] - b[key][i]), `${key}[${i}]`).toBeLessThan(1e-12);
        }
      }
      // the output rows equal the single backend's bit for bit (same blocks, same row arithmetic)
      expect(p.output.shape).toEqual(s.out.shape);
      expect(Array.from(p.output.data)).toEqual(Array.from(s.out.data));
      expect(toFloat32(p.output).some((x) => x !== 0)).toBe(true);
      // the sparse exchange moves less than a dense ring, and something moved
      const moved = p.results.reduce((t, r) => t + r.traffic.kvBytesReceived, 0);
      expect(moved).toBeGreaterThan(0);
      expect(moved).toBeLessThan(p.results[0].traffic.denseRingBytes);
      expect(p.results.reduce((t, r) => t + r.traffic.kvBytesSent, 0)).toBe(moved);
      // what each rank fetched is exactly what its query blocks read, from the expanded mask
      const rows = expandToRows(s.plan.mask!);
      const Nb = p.layout.numBlocks;
      for (let r = 0; r < c.P; r++) {
        const want = new Uint8Array(dims.kvHeads * Nb);
        for (let h = 0; h < dims.heads; h++) {
          const g = Math.floor(h / (dims.heads / dims.kvHeads));
          for (const I of ownedBlocks(p.layout, r)) for (let e = rows.rowPtr[h * Nb + I]; e < rows.rowPtr[h * Nb + I + 1]; e++) want[g * Nb + rows.cols[e]] = 1;
        }
        expect(Array.from(neededBlocks(s.plan, p.layout, r)), `rank ${r}`).toEqual(Array.from(want));
      }
    }, 60_000);
  }
});

describe('parallelPrefill: dense plans and the exchange', () => {
  it('a layer under the minimum length runs dense on every rank, equal to dense attention', async () => {
    // crisp as shipped: B 128, kMin 1024, so n = 1000 is dense by FlexPrefill's rule
    const s = await single('llama-like', 1000, 3, 'f32', crisp);
    expect(s.plan.denseReason).toBe('min-length');
    const p = await sharded(3, s.q, s.k, s.v, crisp);
    for (const r of p.results) expect(r.plan.denseReason).toBe('min-length');
    expect(Array.from(p.output.data)).toEqual(Array.from(s.out.data));
    // a dense layer moves every earlier block: rank r receives all the blocks before its last that it does not hold
    const total = p.results.reduce((t, r) => t + r.traffic.kvBytesReceived, 0);
    expect(total).toBeGreaterThan(0);
    expect(total).toBeLessThanOrEqual(p.results[0].traffic.denseRingBytes);
  }, 60_000);
});
