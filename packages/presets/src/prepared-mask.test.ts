/**
 * The pipeline's prepared-mask path (backends with `prepareMask`, e.g. CUDA): the plan's
 * density comes from the backend's counts, the PE rows reach result.plan.mask after the
 * attention is launched, runPlan hands the prepared mask to sparseAttention, and
 * sparsePrefill releases it. Checked against the host path on the same reference backend:
 * same density, same mask, bit-identical output.
 */
import {
  type AttentionOptions,
  type Route,
  type Router,
  type Backend,
  type BlockMask,
  expandToRows,
  planPrefill,
  type PreparedMask,
  type PrepareMaskRequest,
  type DevicePlanRequest,
  type ProxyStatsOptions,
  releasePlan,
  runPlan,
  sparsePrefill,
  spreadRowPtr,
  toFloat32,
  selectVsLists,
  type VsLists,
} from '@crisp/core';
import { createReferenceBackend } from '@crisp/reference';
import { cStruct } from '@crisp/router';
import { globalCoverage, noiseFloor } from '@crisp/select';
import { describe, expect, it } from 'vitest';
import { freshSeed, mixedHeads } from './__fixtures__/heads.js';
import { crisp } from './index.js';

/** The reference backend plus a host prepareMask, recording what sparseAttention got. */
function withPrepare(base: Backend) {
  const log = { prepared: 0, ranWithPrepared: 0, peRowsCalls: 0, deviceRequests: 0, outputs: [] as { disposed: boolean }[] };
  const live: PreparedMask[] = [];
  const be: Backend = {
    name: base.name,
    capabilities: base.capabilities,
    sparseCrossover: base.sparseCrossover,
    upload: (t) => base.upload(t),
    allocate: (d, s) => base.allocate(d, s),
    write: (t, o, d) => base.write(t, o, d),
    download: (t) => base.download(t),
    proxyStats: (q, k, o) => base.proxyStats(q, k, o),
    peBlockRows: (q, k, o) => base.peBlockRows(q, k, o),
    expandMask: (m) => base.expandMask(m),
    sparseAttention: (q, k, v, m, o) => base.sparseAttention(q, k, v, m, o),
    denseAttention: (q, k, v, o) => base.denseAttention(q, k, v, o),
    synchronize: () => base.synchronize(),
    dispose: () => base.dispose(),
  };
  (be as { prepareMask: Backend['prepareMask'] }).prepareMask = async (req: PrepareMaskRequest) => {
    log.prepared++;
    const pe = req.pe ? await base.peBlockRows(req.pe.q, req.pe.k, req.pe.opts) : undefined;
    // the pipeline passes a function: a device backend calls it once its PE work is queued
    let vs: VsLists;
    let selected: VsLists | undefined;
    if (typeof req.vs !== 'function' && 'device' in req.vs) {
      // a backend listing deviceSelectors: the rule over the request's statistics, as a
      // device would run it (here with the host selector and ranking helpers)
      log.deviceRequests++;
      const { rule, stats, routes, peK } = req.vs.device;
      vs = selectVsLists(stats, routes, noiseFloor({ alpha: rule.alpha, kMin: rule.kMin }), peK);
      selected = vs;
    } else {
      vs = typeof req.vs === 'function' ? req.vs() : req.vs;
    }
    // expand the union exactly as the device would: VS lists plus the PE heads' rows
    const H = req.heads;
    const Nb = req.numBlocks;
    let rows: BlockMask['rows'];
    if (pe && req.pe) rows = { rowPtr: spreadRowPtr(pe.rowPtr, req.pe.opts.heads, H, Nb), cols: pe.cols };
    const full = expandToRows({ heads: H, numBlocks: Nb, blockSize: req.blockSize, vs, rows });
    const counts = Float64Array.from({ length: H }, (_, h) => full.rowPtr[(h + 1) * Nb] - full.rowPtr[h * Nb]);
    const prepared = {
      backend: base.name,
      heads: H,
      numBlocks: Nb,
      blockSize: req.blockSize,
      blockCounts: counts,
      rows: full,
      released: false,
      release() {
        (this as { released: boolean }).released = true;
      },
    };
    live.push(prepared);
    const peRows = pe
      ? async () => {
          log.peRowsCalls++;
          expect(prepared.released, 'peRows called after release').toBe(false);
          return pe;
        }
      : undefined;
    return { prepared, peRows, ...(selected ? { vs: selected } : {}) };
  };
  (be as { sparseAttention: Backend['sparseAttention'] }).sparseAttention = async (q, k, v, mask, opts: AttentionOptions = {}) => {
    const p = opts.prepared as (PreparedMask & { rows: BlockMask['rows'] }) | undefined;
    if (!p) return base.sparseAttention(q, k, v, mask, opts);
    // like a device backend: run what was prepared (the mask may still lack its PE rows)
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
  };
  return { be, log, live };
}

describe('prepared masks through the pipeline', () => {
  it('gives the host path’s density, mask and output, releases what sparsePrefill prepared', async () => {
    const seed = freshSeed();
    const n = 1536;
    const B = 64;
    const x = mixedHeads({
      n,
      heads: [{ kind: 'sink', strength: 12 }, { kind: 'sink', strength: 10 }, { kind: 'sink', strength: 9 }, { kind: 'diffuse' }],
      seed,
    });
    const msg = `seed ${seed}`;
    // heads 1 and 3 to PE, so both parts of the union are exercised
    const routes: Route[] = ['vs', 'pe', 'vs', 'pe'];
    const router: Router = {
      name: 'alternate',
      route: () => ({ routes, scores: Float64Array.from(routes, (r) => (r === 'vs' ? 1 : 0)), scoreName: 'fixed' }),
    };
    // γ 0.5 so the PE rows leave blocks out on these small inputs
    const policy = { ...crisp, blockSize: B, kMin: 256, router, pe: globalCoverage({ gamma: 0.5, kMin: 256 }) };
    const host = createReferenceBackend();
    const inputs = { q: host.upload(x.q), k: host.upload(x.k), v: host.upload(x.v) };
    const ref = await sparsePrefill(host, inputs, policy, { minSparseLength: 0 });

    const { be, log, live } = withPrepare(host);
    const res = await sparsePrefill(be, inputs, policy, { minSparseLength: 0 });
    expect(log.prepared, msg).toBe(1);
    expect(log.ranWithPrepared, msg).toBe(1);
    expect(log.peRowsCalls, msg).toBe(1);
    expect(live.every((p) => p.released), msg).toBe(true);
    expect(res.plan.prepared, msg).toBeUndefined();
    expect(Array.from(res.plan.density), msg).toEqual(Array.from(ref.plan.density));
    expect(res.plan.overallDensity, msg).toBeCloseTo(ref.plan.overallDensity, 12);
    expect(res.plan.mask, msg).toEqual(ref.plan.mask);
    console.log(`${msg}: density per head ${Array.from(ref.plan.density, (x) => x.toFixed(3))}`);
    // a real selection in both parts: a VS head and a PE head each left blocks out
    expect(Math.max(ref.plan.density[0], ref.plan.density[2]), msg).toBeLessThan(0.97);
    expect(Math.max(ref.plan.density[1], ref.plan.density[3]), msg).toBeLessThan(0.8);
    const a = toFloat32(await host.download(res.output));
    const b = toFloat32(await host.download(ref.output));
    expect(a.some(Number.isNaN), msg).toBe(false);
    expect(Array.from(a), msg).toEqual(Array.from(b));

    // planPrefill: rows on the host at once, prepared kept until releasePlan; runPlan uses it
    const plan = await planPrefill(be, inputs, policy, { minSparseLength: 0 });
    expect(plan.mask, msg).toEqual(ref.plan.mask);
    expect(plan.prepared?.released, msg).toBe(false);
    await runPlan(be, plan, inputs);
    expect(log.ranWithPrepared, msg).toBe(2);
    releasePlan(plan);
    expect(plan.prepared?.released, msg).toBe(true);
    // a released plan still runs, from plan.mask
    const again = await runPlan(be, plan, inputs);
    expect(log.ranWithPrepared, msg).toBe(2);
    expect(Array.from(toFloat32(await host.download(again.output))), msg).toEqual(Array.from(b));
  });

  it('hands the noise floor to a backend that selects on the device, and plans what the host selection plans', async () => {
    const seed = freshSeed();
    const B = 64;
    const x = mixedHeads({
      n: 1536,
      heads: [{ kind: 'sink', strength: 12 }, { kind: 'sink', strength: 10 }, { kind: 'sink', strength: 9 }, { kind: 'diffuse' }],
      seed,
    });
    const msg = `seed ${seed}`;
    const routes: Route[] = ['vs', 'pe', 'vs', 'vs'];
    const router: Router = {
      name: 'alternate',
      route: () => ({ routes, scores: Float64Array.from(routes, (r) => (r === 'vs' ? 1 : 0)), scoreName: 'fixed' }),
    };
    // the selector counts its host calls: the device path must not make any
    const floor = noiseFloor({ alpha: 1, kMin: 256 });
    let hostCalls = 0;
    // (spreading drops the non-enumerable device rule: this wrapper runs the same rule, so it
    // sets it again)
    const counted = {
      ...floor,
      device: floor.device,
      select(i: Parameters<typeof floor.select>[0]) {
        hostCalls++;
        return floor.select(i);
      },
    };
    const policy = { ...crisp, blockSize: B, kMin: 256, router, vs: counted, pe: globalCoverage({ gamma: 0.5, kMin: 256 }) };
    const host = createReferenceBackend();
    const inputs = { q: host.upload(x.q), k: host.upload(x.k), v: host.upload(x.v) };
    const ref = await sparsePrefill(host, inputs, policy, { minSparseLength: 0 });
    expect(hostCalls, msg).toBe(2 * 3);

    const { be, log } = withPrepare(host);
    (be as { deviceSelectors?: readonly string[] }).deviceSelectors = ['noiseFloor'];
    hostCalls = 0;
    const res = await sparsePrefill(be, inputs, policy, { minSparseLength: 0 });
    expect(log.deviceRequests, msg).toBe(1);
    expect(hostCalls, msg).toBe(0);
    expect(res.plan.mask, msg).toEqual(ref.plan.mask);
    expect(Array.from(res.plan.density), msg).toEqual(Array.from(ref.plan.density));
    expect(Array.from(toFloat32(await host.download(res.output))), msg).toEqual(Array.from(toFloat32(await host.download(ref.output))));

    // a rule the backend does not list, or a kMin that is not whole blocks, stays on the host
    // (there the selector raises its own error for the latter)
    (be as { deviceSelectors?: readonly string[] }).deviceSelectors = [];
    await sparsePrefill(be, inputs, policy, { minSparseLength: 0 });
    expect(log.deviceRequests, msg).toBe(1);
    expect(hostCalls, msg).toBe(2 * 3);
    (be as { deviceSelectors?: readonly string[] }).deviceSelectors = ['noiseFloor'];
    const odd = { ...policy, vs: noiseFloor({ alpha: 1, kMin: 100 }) };
    await expect(sparsePrefill(be, inputs, odd, { minSparseLength: 0 }), msg).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
    expect(log.deviceRequests, msg).toBe(1);
  });

  it('plans on the device when the backend routes there too: statistics deferred, one request, the host router checks it', async () => {
    const seed = freshSeed();
    const B = 64;
    const x = mixedHeads({
      n: 1536,
      heads: [{ kind: 'sink', strength: 12 }, { kind: 'diffuse' }, { kind: 'sink', strength: 10 }, { kind: 'diffuse' }],
      seed,
    });
    const msg = `seed ${seed}`;
    const policy = { ...crisp, blockSize: B, kMin: 256, pe: globalCoverage({ gamma: 0.5, kMin: 256 }) };
    const host = createReferenceBackend();
    const inputs = { q: host.upload(x.q), k: host.upload(x.k), v: host.upload(x.v) };
    const ref = await sparsePrefill(host, inputs, policy, { minSparseLength: 0 });
    // both paths of the union: the sink heads go to VS, the diffuse ones to PE
    expect(ref.plan.routing?.routes, msg).toEqual(['vs', 'pe', 'vs', 'pe']);

    const { be, log, live } = withPrepare(host);
    const dev = be as { deviceSelectors?: readonly string[]; deviceRouters?: readonly string[]; planOnDevice?: Backend['planOnDevice'] };
    dev.deviceSelectors = ['noiseFloor'];
    dev.deviceRouters = ['cStruct'];
    const deferred: boolean[] = [];
    (be as { proxyStats: Backend['proxyStats'] }).proxyStats = (q, k, o: ProxyStatsOptions) => {
      deferred.push(o.deferRead === true);
      return host.proxyStats(q, k, o);
    };
    // a device plan as a backend would run it: the rule's routes over C_struct, then the
    // device selection and the PE rows (here through the host prepareMask above)
    let planned = 0;
    let flip = false;
    // how many attention runs had started when the device plan was read
    const reads: number[] = [];
    dev.planOnDevice = async (req: DevicePlanRequest) => {
      planned++;
      const { stats } = req;
      const routes = Array.from(stats.cStruct, (c): Route => (c >= req.route.tauProxy ? 'vs' : 'pe'));
      const heads = routes.flatMap((r, h) => (r === 'pe' ? [h] : []));
      const r = await be.prepareMask!({
        heads: stats.heads,
        numBlocks: stats.numBlocks,
        blockSize: stats.blockSize,
        vs: { device: { rule: req.vs, stats, routes, peK: req.peK } },
        pe: heads.length ? { q: req.pe.q, k: req.pe.k, opts: { blockSize: stats.blockSize, gamma: req.pe.gamma, heads, scale: req.pe.scale } } : undefined,
      });
      if (flip) routes[0] = routes[0] === 'vs' ? 'pe' : 'vs';
      const outcome = { routes, vs: r.vs!, ...(r.peRows ? { peRows: r.peRows } : {}) };
      return {
        prepared: r.prepared,
        read: () => {
          reads.push(log.ranWithPrepared);
          return outcome;
        },
      };
    };
    const res = await sparsePrefill(be, inputs, policy, { minSparseLength: 0 });
    expect(planned, msg).toBe(1);
    expect(deferred, msg).toEqual([true]);
    expect(log.deviceRequests, msg).toBe(1);
    expect(res.plan.routing, msg).toEqual(ref.plan.routing);
    expect(res.plan.mask, msg).toEqual(ref.plan.mask);
    expect(Array.from(res.plan.density), msg).toEqual(Array.from(ref.plan.density));
    expect(live.every((p) => p.released), msg).toBe(true);
    expect(Array.from(toFloat32(await host.download(res.output))), msg).toEqual(Array.from(toFloat32(await host.download(ref.output))));
    // sparsePrefill queued the attention before reading the plan back
    expect(reads, msg).toEqual([1]);

    // a device whose routes differ from the host router's: a BACKEND_ERROR, nothing kept;
    // in sparsePrefill found after the attention ran, whose output is disposed
    flip = true;
    await expect(planPrefill(be, inputs, policy, { minSparseLength: 0 }), msg).rejects.toMatchObject({ code: 'BACKEND_ERROR' });
    expect(live.every((p) => p.released), msg).toBe(true);
    const outs = log.outputs.length;
    await expect(sparsePrefill(be, inputs, policy, { minSparseLength: 0 }), msg).rejects.toMatchObject({ code: 'BACKEND_ERROR' });
    expect(live.every((p) => p.released), msg).toBe(true);
    expect(log.outputs.length, msg).toBe(outs + 1);
    expect(log.outputs.at(-1)?.disposed, msg).toBe(true);
    flip = false;
    // a router whose host route() returns the wrong number of routes is the router's error
    // (INVALID_ARGUMENT, as on the host path), not the backend's
    const short = { ...policy, router: { ...cStruct(), device: cStruct().device, route: (s: Parameters<Router['route']>[0]) => ({ ...cStruct().route(s), routes: [] }) } };
    await expect(planPrefill(be, inputs, short, { minSparseLength: 0 }), msg).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
    expect(live.every((p) => p.released), msg).toBe(true);
    // a router with its own route() (no device rule) routes on the host, statistics read at once
    const own = { ...policy, router: { ...cStruct(), route: (s: Parameters<Router['route']>[0]) => cStruct().route(s) } };
    await planPrefill(be, inputs, own, { minSparseLength: 0 }).then(releasePlan);
    expect(planned, msg).toBe(4);
    expect(deferred.at(-1), msg).toBe(false);
  });

  it('a prepareMask that never calls the request\'s vs() is an INVALID_ARGUMENT, and what it prepared is released', async () => {
    const seed = freshSeed();
    const x = mixedHeads({ n: 1536, heads: [{ kind: 'sink', strength: 12 }, { kind: 'diffuse' }], seed });
    const host = createReferenceBackend();
    const inputs = { q: host.upload(x.q), k: host.upload(x.k), v: host.upload(x.v) };
    const { be, live } = withPrepare(host);
    // an implementation written for lists only: reads req.vs as lists, never calls it
    (be as { prepareMask: Backend['prepareMask'] }).prepareMask = async (req: PrepareMaskRequest) => {
      const prepared = {
        backend: host.name,
        heads: req.heads,
        numBlocks: req.numBlocks,
        blockSize: req.blockSize,
        blockCounts: new Float64Array(req.heads).fill(1),
        released: false,
        release() {
          (this as { released: boolean }).released = true;
        },
      };
      live.push(prepared);
      return { prepared };
    };
    const policy = { ...crisp, blockSize: 64, kMin: 256 };
    await expect(planPrefill(be, inputs, policy, { minSparseLength: 0 }), `seed ${seed}`).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
    expect(live.length).toBe(1);
    expect(live[0].released).toBe(true);
  });
});
