/**
 * The pipeline's device-plan path (backends with a `planner`, e.g. CUDA), on a planner that
 * runs the same rules as the host over the reference backend: statistics deferred, one plan
 * request, the attention queued on the prepared mask before the plan is read back, the host
 * router's check, density from the planner's counts, and the prepared mask released.
 * Checked against the host path on the same backend: same routing, mask and density,
 * bit-identical output. Policies the planner cannot run go to the host path.
 */
import {
  type AttentionOptions,
  type Backend,
  type BlockMask,
  type DevicePlanRequest,
  type DevicePlanResult,
  deviceRouteTerms,
  expandToRows,
  headSlice,
  jsDistance,
  MAX_PLANNER_MARGIN,
  planPrefill,
  plannerMargin,
  type Policy,
  type PreparedMask,
  type ProxyStatsOptions,
  RESIDUAL_MARGIN,
  releasePlan,
  residualDistance,
  type Route,
  type Router,
  runPlan,
  selectVsLists,
  sparsePrefill,
  spreadRowPtr,
  toFloat32,
  vsHead,
} from '@crisp/core';
import { createReferenceBackend } from '@crisp/reference';
import { anyPe, cStruct, jsd, residualJsd } from '@crisp/router';
import { cumulativeCoverage, globalCoverage, noiseFloor } from '@crisp/select';
import { describe, expect, it } from 'vitest';
import { freshSeed, mixedHeads } from './__fixtures__/heads.js';
import { crisp, crispGuarded, flexPrefill } from './index.js';

type Prepared = PreparedMask & { readonly rows: BlockMask['rows'] };

/** The reference backend plus a planner running the device rules on the host. */
function withPlanner(base: Backend, narrows = true, peVs = true) {
  const log = { planned: 0, ranWithPrepared: 0, deferred: [] as boolean[], peWithVs: [] as boolean[], reads: [] as number[], outputs: [] as { disposed: boolean }[] };
  const live: Prepared[] = [];
  // a head whose device route is turned over (the device disagreeing with the host router there)
  let flip: number | undefined;
  const plan = async (req: DevicePlanRequest): Promise<DevicePlanResult> => {
    log.planned++;
    const { stats } = req;
    const H = stats.heads;
    const Nb = stats.numBlocks;
    const B = stats.blockSize;
    // the rule's two tests, as a device runs them
    const terms = deviceRouteTerms(req.route)!;
    const hostRoutes = Array.from({ length: H }, (_, h): Route => {
      const byC = !(stats.cStruct[h] >= terms.tauProxy);
      const r = terms.residual;
      const res = r ? residualDistance(headSlice(stats.verticalBlocks, h, Nb), headSlice(stats.pooledEstimate, h, Nb)) : undefined;
      const byJsd = terms.jsd !== undefined && jsDistance(headSlice(stats.pooledEstimate, h, Nb), headSlice(stats.verticalBlocks, h, Nb)) < terms.jsd.tau;
      return byC || byJsd || (r && res && res.residual >= r.minResidual && res.distance < r.tau) ? 'pe' : 'vs';
    });
    // the plan follows the device's routes, also where they differ from the rule's
    const routes = hostRoutes.map((r, h): Route => (h === flip ? (r === 'vs' ? 'pe' : 'vs') : r));
    const heads = routes.flatMap((r, h) => (r === 'pe' ? [h] : []));
    // (the coverage rule reads the token scores, which the deferred statistics hold)
    const selector =
      req.vs.kind === 'noiseFloor' ? noiseFloor({ alpha: req.vs.alpha, kMin: req.vs.kMin }) : cumulativeCoverage({ gamma: req.vs.gamma, kMin: req.vs.kMin });
    const peSelector = req.peVs === undefined ? undefined : noiseFloor({ alpha: (req.peVs as { alpha: number }).alpha, kMin: req.peVs.kMin });
    const vs = selectVsLists(stats, routes, selector, req.peK, { withVs: req.peWithVs === true, selector: peSelector, excess: req.peVsExcess, fullAnchor: req.peVsFullAnchor });
    log.peWithVs.push(req.peWithVs === true);
    const pe = heads.length ? await base.peBlockRows(req.pe.q, req.pe.k, { blockSize: B, gamma: req.pe.gamma, heads, scale: req.pe.scale }) : undefined;
    const rows = pe ? { rowPtr: spreadRowPtr(pe.rowPtr, heads, H, Nb), cols: pe.cols } : undefined;
    const full = expandToRows({ heads: H, numBlocks: Nb, blockSize: B, vs, rows });
    const prepared: Prepared = {
      backend: base.name,
      heads: H,
      numBlocks: Nb,
      blockSize: B,
      readBlockCounts: async () => Float64Array.from({ length: H }, (_, h) => full.rowPtr[(h + 1) * Nb] - full.rowPtr[h * Nb]),
      rows: full,
      released: false,
      release() {
        (this as { released: boolean }).released = true;
      },
    };
    live.push(prepared);
    return {
      prepared,
      read: async () => {
        log.reads.push(log.ranWithPrepared);
        return { routes, vs, ...(pe ? { peRows: async () => pe } : {}) };
      },
    };
  };
  const be: Backend = {
    name: base.name,
    capabilities: base.capabilities,
    sparseCrossover: base.sparseCrossover,
    upload: (t) => base.upload(t),
    allocate: (d, s) => base.allocate(d, s),
    write: (t, o, d) => base.write(t, o, d),
    download: (t) => base.download(t),
    proxyStats: (q, k, o: ProxyStatsOptions) => {
      log.deferred.push(o.deferRead === true);
      return base.proxyStats(q, k, o);
    },
    peBlockRows: (q, k, o) => base.peBlockRows(q, k, o),
    expandMask: (m) => base.expandMask(m),
    sparseAttention: async (q, k, v, mask, opts: AttentionOptions = {}) => {
      const p = opts.prepared as Prepared | undefined;
      if (!p) return base.sparseAttention(q, k, v, mask, opts);
      // like a device backend: run what was prepared
      expect(p.released).toBe(false);
      log.ranWithPrepared++;
      const { prepared: _p, ...rest } = opts;
      const r = await base.sparseAttention(q, k, v, { heads: p.heads, numBlocks: p.numBlocks, blockSize: p.blockSize, rows: p.rows }, rest);
      // what becomes of the output (a failed sparsePrefill disposes it)
      const seen = { disposed: false };
      log.outputs.push(seen);
      const dispose = r.output.dispose.bind(r.output);
      Object.defineProperty(r.output, 'dispose', {
        value: () => {
          seen.disposed = true;
          dispose();
        },
      });
      return r;
    },
    denseAttention: (q, k, v, o) => base.denseAttention(q, k, v, o),
    synchronize: () => base.synchronize(),
    dispose: () => base.dispose(),
    planner: { routers: ['cStruct', 'residualJsd', 'jsd', 'anyPe'], selectors: ['noiseFloor', 'cumulativeCoverage'], peWithVs: true, peVsExcess: narrows, peVs, plan },
  };
  return {
    be,
    log,
    live,
    setFlip: (h: number | undefined) => {
      flip = h;
    },
  };
}

function inputsFor(seed: number) {
  const x = mixedHeads({
    n: 1536,
    heads: [{ kind: 'sink', strength: 12 }, { kind: 'diffuse' }, { kind: 'sink', strength: 10 }, { kind: 'diffuse' }],
    seed,
  });
  const host = createReferenceBackend();
  return { host, inputs: { q: host.upload(x.q), k: host.upload(x.k), v: host.upload(x.v) } };
}

// γ 0.5 so the PE rows leave blocks out on these small inputs
const policy = { ...crisp, blockSize: 64, kMin: 256, pe: globalCoverage({ gamma: 0.5, kMin: 256 }) };

/** crispGuarded's rules at this size, the residual router's τ given */
function guarded(tau = 0.1, minResidual = 0.3) {
  return {
    ...crispGuarded,
    blockSize: 64,
    kMin: 256,
    router: anyPe([cStruct({ tauProxy: 0.2, wSink: 128, wLocal: 128 }), residualJsd({ tau, minResidual })]),
    vs: noiseFloor({ alpha: 1, kMin: 256 }),
    pe: globalCoverage({ gamma: 0.5, kMin: 256 }),
  };
}

describe('plans made by a device planner', () => {
  it('give the host plan’s routing, mask, density and output; sparsePrefill queues the attention first and releases the mask', async () => {
    const seed = freshSeed();
    const msg = `seed ${seed}`;
    const { host, inputs } = inputsFor(seed);
    const ref = await sparsePrefill(host, inputs, policy, { minSparseLength: 0 });
    // both paths of the union: the sink heads go to VS, the diffuse ones to PE
    expect(ref.plan.routing?.routes, msg).toEqual(['vs', 'pe', 'vs', 'pe']);
    expect(Math.max(ref.plan.density[0], ref.plan.density[2]), msg).toBeLessThan(0.97);
    expect(Math.max(ref.plan.density[1], ref.plan.density[3]), msg).toBeLessThan(0.8);

    const { be, log, live } = withPlanner(host);
    const res = await sparsePrefill(be, inputs, policy, { minSparseLength: 0 });
    expect(log.planned, msg).toBe(1);
    expect(log.deferred, msg).toEqual([true]);
    // the attention was queued before the plan was read back
    expect(log.reads, msg).toEqual([1]);
    expect(res.plan.routing, msg).toEqual(ref.plan.routing);
    expect(res.plan.mask, msg).toEqual(ref.plan.mask);
    expect(Array.from(res.plan.density), msg).toEqual(Array.from(ref.plan.density));
    expect(res.plan.overallDensity, msg).toBeCloseTo(ref.plan.overallDensity, 12);
    expect(res.plan.prepared, msg).toBeUndefined();
    expect(live.every((p) => p.released), msg).toBe(true);
    const b = toFloat32(await host.download(ref.output));
    const a = toFloat32(await host.download(res.output));
    expect(a.some(Number.isNaN), msg).toBe(false);
    expect(Array.from(a), msg).toEqual(Array.from(b));
  });

  it('are complete when planPrefill resolves; runPlan runs the prepared mask until releasePlan, then plan.mask', async () => {
    const seed = freshSeed();
    const msg = `seed ${seed}`;
    const { host, inputs } = inputsFor(seed);
    const ref = await sparsePrefill(host, inputs, policy, { minSparseLength: 0 });
    const { be, log } = withPlanner(host);
    const plan = await planPrefill(be, inputs, policy, { minSparseLength: 0 });
    expect(log.reads, msg).toEqual([0]);
    expect(plan.routing, msg).toEqual(ref.plan.routing);
    expect(plan.mask, msg).toEqual(ref.plan.mask);
    expect(Array.from(plan.density), msg).toEqual(Array.from(ref.plan.density));
    expect(Number.isFinite(plan.overallDensity), msg).toBe(true);
    expect(plan.prepared?.released, msg).toBe(false);
    const b = Array.from(toFloat32(await host.download(ref.output)));
    const first = await runPlan(be, plan, inputs);
    expect(log.ranWithPrepared, msg).toBe(1);
    expect(Array.from(toFloat32(await host.download(first.output))), msg).toEqual(b);
    releasePlan(plan);
    expect(plan.prepared?.released, msg).toBe(true);
    const again = await runPlan(be, plan, inputs);
    expect(log.ranWithPrepared, msg).toBe(1);
    expect(Array.from(toFloat32(await host.download(again.output))), msg).toEqual(b);
  });

  it('that disagree with the host router are a BACKEND_ERROR; nothing is kept and sparsePrefill disposes its output', async () => {
    const seed = freshSeed();
    const msg = `seed ${seed}`;
    const { host, inputs } = inputsFor(seed);
    const { be, log, live, setFlip } = withPlanner(host);
    setFlip(0);
    await expect(planPrefill(be, inputs, policy, { minSparseLength: 0 }), msg).rejects.toMatchObject({ code: 'BACKEND_ERROR' });
    expect(live.every((p) => p.released), msg).toBe(true);
    await expect(sparsePrefill(be, inputs, policy, { minSparseLength: 0 }), msg).rejects.toMatchObject({ code: 'BACKEND_ERROR' });
    expect(live.every((p) => p.released), msg).toBe(true);
    expect(log.outputs.length, msg).toBe(1);
    // a router of one's own that claims cStruct's device rule but routes otherwise: the message
    // points at the router's `device` field before the backend
    setFlip(undefined);
    const base = cStruct();
    const claims: Router = { name: 'mine', device: base.device, route: (st) => ({ ...base.route(st), routes: base.route(st).routes.map((r) => (r === 'vs' ? 'pe' : 'vs')) }) };
    await expect(planPrefill(be, inputs, { ...policy, router: claims }, { minSparseLength: 0 }), msg).rejects.toThrow(
      /router mine routes .*a router's `device` rule must be the rule its route\(\) computes/,
    );
    expect(log.outputs[0].disposed, msg).toBe(true);
    setFlip(undefined);
    // a router whose host route() returns the wrong number of routes is the router's error
    // (INVALID_ARGUMENT, as on the host path), not the backend's
    const short = { ...policy, router: { ...cStruct(), device: cStruct().device, route: (s: Parameters<Router['route']>[0]) => ({ ...cStruct().route(s), routes: [] }) } };
    await expect(planPrefill(be, inputs, short, { minSparseLength: 0 }), msg).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
    expect(live.every((p) => p.released), msg).toBe(true);
  });

  it('run crispGuarded (anyPe of cStruct and residualJsd, PE heads keeping the noise floor lists): the host plan, made by the planner', async () => {
    const seed = freshSeed();
    const msg = `seed ${seed}`;
    const { host, inputs } = inputsFor(seed);
    // a τ that sends a sink head to PE by its residual alone, so all three kinds of head occur
    const stats = await host.proxyStats(inputs.q, inputs.k, { blockSize: 64, wSink: 128, wLocal: 128 });
    const d0 = residualDistance(headSlice(stats.verticalBlocks, 0, stats.numBlocks), headSlice(stats.pooledEstimate, 0, stats.numBlocks));
    const p = guarded(Math.min(0.8, d0.distance * 1.5), 0);
    const ref = await sparsePrefill(host, inputs, p, { minSparseLength: 0 });
    // head 0 passes C_struct and goes to PE by its residual; the diffuse heads by C_struct
    expect(stats.cStruct[0], msg).toBeGreaterThanOrEqual(0.2);
    expect([0, 1, 3].map((h) => ref.plan.routing?.routes[h]), msg).toEqual(['pe', 'pe', 'pe']);
    const { be, log, live } = withPlanner(host);
    const res = await sparsePrefill(be, inputs, p, { minSparseLength: 0 });
    expect(log.planned, msg).toBe(1);
    expect(log.peWithVs, msg).toEqual([true]);
    expect(res.plan.routing, msg).toEqual(ref.plan.routing);
    expect(res.plan.mask, msg).toEqual(ref.plan.mask);
    expect(Array.from(res.plan.density), msg).toEqual(Array.from(ref.plan.density));
    expect(live.every((x) => x.released), msg).toBe(true);
    expect(Array.from(toFloat32(await host.download(res.output))), msg).toEqual(Array.from(toFloat32(await host.download(ref.output))));
    // the PE heads' lists hold the noise floor's: a plan without peWithVs selects fewer blocks
    // there; crispGuarded narrows them (peVsExcess), so it keeps at most the full lists
    const plainPolicy = { ...p, peWithVs: false, peVsExcess: undefined, peVsFullAnchor: undefined };
    const plain = await sparsePrefill(host, inputs, plainPolicy, { minSparseLength: 0 });
    const full = await sparsePrefill(host, inputs, { ...plainPolicy, peWithVs: true }, { minSparseLength: 0 });
    for (const h of [0, 1, 3]) {
      expect(ref.plan.density[h], `${msg}, head ${h}`).toBeGreaterThanOrEqual(plain.plan.density[h]);
      expect(ref.plan.density[h], `${msg}, head ${h}`).toBeLessThanOrEqual(full.plan.density[h]);
    }
    expect(full.plan.mask?.vs?.verticalPtr[1], msg).toBeGreaterThan(plain.plan.mask?.vs?.verticalPtr[1] ?? 0);
    // a planner that does not narrow leaves crispGuarded's plan to the host, with the same result
    const other = withPlanner(host, false);
    const hosted = await sparsePrefill(other.be, inputs, p, { minSparseLength: 0 });
    expect(other.log.planned, msg).toBe(0);
    expect(hosted.plan.mask, msg).toEqual(ref.plan.mask);
    // and one that does makes the full-list plan too (no narrowing asked)
    const fullByPlanner = await sparsePrefill(be, inputs, { ...plainPolicy, peWithVs: true }, { minSparseLength: 0 });
    expect(fullByPlanner.plan.mask, msg).toEqual(full.plan.mask);
  });

  it('run PE heads\' lists at their own α (Policy.peVs): the host plan, made by the planner; other planners and rules leave it to the host', async () => {
    const seed = freshSeed();
    const msg = `seed ${seed}`;
    const { host, inputs } = inputsFor(seed);
    const base = guarded(0.1, 0.3);
    // VS heads at α 2, the PE heads' lists at α 0.5 (narrowed by κ as crispGuarded does)
    const split = { ...base, name: 'split', vs: noiseFloor({ alpha: 2, kMin: 256 }), peVs: noiseFloor({ alpha: 0.5, kMin: 256 }) };
    const ref = await sparsePrefill(host, inputs, split, { minSparseLength: 0 });
    expect(ref.plan.routing?.routes.includes('vs'), msg).toBe(true);
    expect(ref.plan.routing?.routes.includes('pe'), msg).toBe(true);
    // the split is a third plan: VS heads as with α 2 for both, PE heads as with α 0.5 for both
    const at2 = await sparsePrefill(host, inputs, { ...base, vs: noiseFloor({ alpha: 2, kMin: 256 }) }, { minSparseLength: 0 });
    const atHalf = await sparsePrefill(host, inputs, { ...base, vs: noiseFloor({ alpha: 0.5, kMin: 256 }) }, { minSparseLength: 0 });
    const routes = ref.plan.routing!.routes;
    for (let h = 0; h < routes.length; h++) {
      const same = routes[h] === 'vs' ? at2 : atHalf;
      expect(Array.from(vsHead(ref.plan.mask!.vs!, h).vertical), `${msg}, head ${h}`).toEqual(Array.from(vsHead(same.plan.mask!.vs!, h).vertical));
      expect(Array.from(vsHead(ref.plan.mask!.vs!, h).slash), `${msg}, head ${h}`).toEqual(Array.from(vsHead(same.plan.mask!.vs!, h).slash));
    }
    expect(ref.plan.mask, msg).not.toEqual(at2.plan.mask);
    expect(ref.plan.mask, msg).not.toEqual(atHalf.plan.mask);
    const { be, log } = withPlanner(host);
    const res = await sparsePrefill(be, inputs, split, { minSparseLength: 0 });
    expect(log.planned, msg).toBe(1);
    expect(res.plan.hostReason, msg).toBeUndefined();
    expect(res.plan.mask, msg).toEqual(ref.plan.mask);
    expect(Array.from(toFloat32(await host.download(res.output))), msg).toEqual(Array.from(toFloat32(await host.download(ref.output))));
    // a planner without peVs, a peVs of another kMin or rule, or one with no device form: the host plans it
    const cases: Array<[Backend, Policy, RegExp]> = [
      [withPlanner(host, true, false).be, split, /does not run a peVs selector/],
      [be, { ...split, peVs: noiseFloor({ alpha: 0.5, kMin: 512 }) }, /same kMin, not noiseFloor \(kMin 512\) beside noiseFloor \(kMin 256\)/],
      [be, { ...split, peVs: cumulativeCoverage({ gamma: 0.9, kMin: 256 }) }, /not cumulativeCoverage/],
      [be, { ...split, peVs: { name: 'mine', select: split.peVs.select } }, /peVs selector mine has no device form/],
    ];
    for (const [b, pol, why] of cases) {
      const plan = await planPrefill(b, inputs, pol, { minSparseLength: 0 });
      expect(plan.hostReason, msg).toMatch(why);
      const want = await planPrefill(host, inputs, pol, { minSparseLength: 0 });
      expect(plan.mask, msg).toEqual(want.mask);
      releasePlan(plan);
    }
  });

  it('refuse a peVs without peWithVs, or one that is not a selector, before any work', async () => {
    const { host, inputs } = inputsFor(3);
    const split = { ...guarded(), name: 'split', peVs: noiseFloor({ alpha: 0.5, kMin: 256 }) };
    await expect(planPrefill(host, inputs, { ...split, peWithVs: false, peVsExcess: undefined, peVsFullAnchor: undefined }, { minSparseLength: 0 })).rejects.toMatchObject({
      code: 'INVALID_ARGUMENT',
      message: expect.stringMatching(/peVs selects the VS lists PE heads keep, so it needs peWithVs: true/),
    });
    for (const bad of [0.5, 'noiseFloor', null, { name: 'x' }]) {
      await expect(planPrefill(host, inputs, { ...split, peVs: bad as never }, { minSparseLength: 0 }), String(bad)).rejects.toMatchObject({
        code: 'INVALID_ARGUMENT',
        message: expect.stringMatching(/peVs must be a VS selector/),
      });
    }
    await expect(planPrefill(host, inputs, { ...split, peVs: noiseFloor({ alpha: 0.5, kMin: 200 }) }, { minSparseLength: 0 })).rejects.toMatchObject({
      code: 'INVALID_ARGUMENT',
      message: expect.stringMatching(/kMin = 200 tokens, not a multiple of the block size 64/),
    });
  });

  it('may route a head the other way where its residual distance is within RESIDUAL_MARGIN of τ, and nowhere else', async () => {
    const seed = freshSeed();
    const msg = `seed ${seed}`;
    const { host, inputs } = inputsFor(seed);
    const stats = await host.proxyStats(inputs.q, inputs.k, { blockSize: 64, wSink: 128, wLocal: 128 });
    const Nb = stats.numBlocks;
    // head 0 (a sink head: cStruct says VS) with τ a hair above its distance: the host routes it PE
    expect(stats.cStruct[0], msg).toBeGreaterThanOrEqual(0.2);
    const d = residualDistance(headSlice(stats.verticalBlocks, 0, Nb), headSlice(stats.pooledEstimate, 0, Nb)).distance;
    const { be, setFlip, live } = withPlanner(host);
    setFlip(0);
    const near = guarded(d + 1e-12, 0);
    const plan = await planPrefill(be, inputs, near, { minSparseLength: 0 });
    const hostPlan = await planPrefill(host, inputs, near, { minSparseLength: 0 });
    expect(hostPlan.routing?.routes[0], msg).toBe('pe');
    // the device's route stands (its mask was built from it); the host's scores are kept
    expect(plan.routing?.routes, msg).toEqual(hostPlan.routing!.routes.map((r, h) => (h === 0 ? 'vs' : r)));
    expect(Array.from(plan.routing!.scores), msg).toEqual(Array.from(hostPlan.routing!.scores));
    releasePlan(plan);
    // τ well away from the distance: the same disagreement is the backend's fault
    await expect(planPrefill(be, inputs, guarded(d * 1.1, 0), { minSparseLength: 0 }), msg).rejects.toMatchObject({ code: 'BACKEND_ERROR' });
    expect(live.every((x) => x.released), msg).toBe(true);
  });

  it('refuse a planner whose declared margin is unusable, before any work; an undeclared one is RESIDUAL_MARGIN', async () => {
    const seed = freshSeed();
    const { host, inputs } = inputsFor(seed);
    expect(plannerMargin(undefined)).toBe(RESIDUAL_MARGIN);
    expect(plannerMargin({})).toBe(RESIDUAL_MARGIN);
    expect(plannerMargin({ margin: 1e-4 })).toBe(1e-4);
    for (const margin of [0.05, MAX_PLANNER_MARGIN, 1e-12, -1e-4, Number.NaN, '1e-4' as unknown as number]) {
      const { be, log } = withPlanner(host);
      const bad: Backend = { ...be, planner: { ...be.planner!, margin } };
      await expect(planPrefill(bad, inputs, guarded(), { minSparseLength: 0 }), `seed ${seed}, margin ${String(margin)}`).rejects.toMatchObject({
        code: 'INVALID_ARGUMENT',
        message: expect.stringContaining('DevicePlanner.margin'),
      });
      expect(log.planned + log.deferred.length, `margin ${String(margin)}`).toBe(0);
    }
  });

  it('run flexPrefill (jsd and cumulative coverage over the token scores): the host plan, made by the planner', async () => {
    const seed = freshSeed();
    const msg = `seed ${seed}`;
    const { host, inputs } = inputsFor(seed);
    const flex = { ...flexPrefill, blockSize: 64, kMin: 256, router: jsd({ tau: 0.1 }), vs: cumulativeCoverage({ gamma: 0.95, kMin: 256 }), pe: globalCoverage({ gamma: 0.5, kMin: 256 }) };
    const ref = await sparsePrefill(host, inputs, flex, { minSparseLength: 0 });
    const { be, log } = withPlanner(host);
    const res = await sparsePrefill(be, inputs, flex, { minSparseLength: 0 });
    expect(log.planned, msg).toBe(1);
    expect(log.deferred, msg).toEqual([true]);
    expect(res.plan.routing, msg).toEqual(ref.plan.routing);
    expect(res.plan.mask, msg).toEqual(ref.plan.mask);
    expect(Array.from(toFloat32(await host.download(res.output))), msg).toEqual(Array.from(toFloat32(await host.download(ref.output))));
    // γ above 0.99 has no device form (the device's count is exact up to 0.99): the host plans it
    const high = { ...flex, vs: cumulativeCoverage({ gamma: 0.995, kMin: 256 }) };
    const p = await planPrefill(be, inputs, high, { minSparseLength: 0 });
    expect(log.planned, msg).toBe(1);
    expect(p.mask, msg).toEqual((await planPrefill(host, inputs, high, { minSparseLength: 0 })).mask);
  });

  it('are not asked for where the planner cannot run the policy: those plans are made on the host, statistics read at once', async () => {
    const seed = freshSeed();
    const msg = `seed ${seed}`;
    const { host, inputs } = inputsFor(seed);
    const { be, log } = withPlanner(host);
    const ref = await planPrefill(host, inputs, policy, { minSparseLength: 0 });
    // a router with its own route() (no device rule)
    const own = { ...policy, router: { ...cStruct(), route: (s: Parameters<Router['route']>[0]) => cStruct().route(s) } };
    const p1 = await planPrefill(be, inputs, own, { minSparseLength: 0 });
    expect(p1.mask, msg).toEqual(ref.mask);
    expect(p1.prepared, msg).toBeUndefined();
    // each host plan says why the planner did not take it; a backend with no planner has nothing to say
    expect(p1.hostReason, msg).toBe('router cStruct has no device form (Router.device; one with its own route() has none)');
    expect(ref.hostReason, msg).toBeUndefined();
    const floor = noiseFloor({ alpha: 1, kMin: 256 });
    const mine = { ...policy, vs: { name: 'mine', select: floor.select } };
    expect((await planPrefill(be, inputs, mine, { minSparseLength: 0 })).hostReason, msg).toMatch(/^selector mine has no device form/);
    const guard = await planPrefill(be, inputs, { ...policy, recallTarget: 0.9 }, { minSparseLength: 0 });
    expect(guard.hostReason, msg).toBe('the policy has a recall guard (recallTarget), which runs on the host');
    // a selector rule the planner does not list
    (be.planner as { selectors: readonly string[] }).selectors = [];
    const p2 = await planPrefill(be, inputs, policy, { minSparseLength: 0 });
    expect(p2.mask, msg).toEqual(ref.mask);
    expect(p2.hostReason, msg).toBe("the backend's planner runs the selectors none, not noiseFloor (selector noiseFloor(alpha=1))");
    (be.planner as { selectors: readonly string[] }).selectors = ['noiseFloor'];
    // a kMin that is not whole blocks: refused before any statistics are computed
    const odd = { ...policy, vs: noiseFloor({ alpha: 1, kMin: 100 }) };
    await expect(planPrefill(be, inputs, odd, { minSparseLength: 0 }), msg).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
    expect(log.planned, msg).toBe(0);
    expect(log.deferred, msg).toEqual([false, false, false, false]);
    // and the planner's plan for the same policy, for comparison: made there, so no reason
    const onDevice = await planPrefill(be, inputs, policy, { minSparseLength: 0 });
    expect(onDevice.prepared, msg).toBeDefined();
    expect(onDevice.hostReason, msg).toBeUndefined();
    releasePlan(onDevice);
    expect(log.planned, msg).toBe(1);
    expect(log.deferred.at(-1), msg).toBe(true);
  });
});
