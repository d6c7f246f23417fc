/**
 * The device plan's host path on CPU machines, through the stand-in driver (no GPU; the
 * kernels' arithmetic is checked by the conformance suite on the H200): the plan is one
 * queue that reads nothing back, sparsePrefill launches the attention before the plan is
 * read, bad requests are typed errors, and a device whose routes disagree with the host
 * router's fails the plan and releases what it held.
 */
import { type DeviceTensor, type ProxyStats, type VsSelector, planPrefill, releasePlan, sparsePrefill } from '@crisp/core';
import { crisp, crispGuarded } from '@crisp/presets';
import { noiseFloor } from '@crisp/select';
import { createReferenceBackend } from '@crisp/reference';
import { describe, expect, it, vi } from 'vitest';
import { CudaBackend, type CudaTensor, PDL_KERNELS } from './index.js';
import { devicePlanPrefix, standInDriver } from './stand-in-driver.js';

const H = 8;
const Hkv = 2;
const D = 128;
const n = 8192;

function setup(onRead?: NonNullable<Parameters<typeof standInDriver>[0]>['onRead'], programmaticLaunch?: boolean, decodeArgs = 0) {
  const s = standInDriver({ heads: H, onRead, decodeArgs });
  const be = new CudaBackend(s.libs, { cacheDir: null, ...(programmaticLaunch === undefined ? {} : { programmaticLaunch }) });
  const inputs = { q: be.allocate('bf16', [n, H, D]), k: be.allocate('bf16', [n, Hkv, D]), v: be.allocate('bf16', [n, Hkv, D]) };
  return { ...s, be, inputs };
}

/** A device plan of crisp's rules (cStruct 0.2, noise floor α 1, kMin 1024, peK 8, γ 0.95) over `stats`. */
function planRequest(stats: ProxyStats, q: DeviceTensor, k: DeviceTensor) {
  return {
    stats,
    route: { kind: 'cStruct' as const, tauProxy: 0.2 },
    vs: { kind: 'noiseFloor' as const, alpha: 1, kMin: 1024 },
    peK: 8,
    pe: { q, k, gamma: 0.95 },
  };
}

describe('the device planner (stand-in driver)', () => {
  it('lists the router and selector rules it runs on the device', () => {
    // FlexPrefill's rules by default (flexPrefillOnDevice)
    const { be } = setup();
    expect(be.planner.routers).toEqual(['cStruct', 'residualJsd', 'jsd', 'anyPe']);
    expect(be.planner.selectors).toEqual(['noiseFloor', 'cumulativeCoverage']);
    expect(be.planner.peWithVs).toBe(true);
    be.dispose();
    // and without them when the option is off (flexPrefill then plans on the host)
    const s = standInDriver({ heads: H });
    const host = new CudaBackend(s.libs, { cacheDir: null, flexPrefillOnDevice: false });
    expect(host.planner.routers).toEqual(['cStruct', 'residualJsd', 'anyPe']);
    expect(host.planner.selectors).toEqual(['noiseFloor']);
    host.dispose();
    expect(() => new CudaBackend(s.libs, { cacheDir: null, flexPrefillOnDevice: 'yes' as unknown as boolean })).toThrow(/flexPrefillOnDevice must be true or false/);
  });

  it("runs flexPrefill's rules on the device: the distance over every block before the routes, the coverage over the token scores proxyStats kept there", async () => {
    const s = standInDriver({ heads: H, decodeArgs: 15 });
    const be = new CudaBackend(s.libs, { cacheDir: null, flexPrefillOnDevice: true });
    const inputs = { q: be.allocate('bf16', [n, H, D]), k: be.allocate('bf16', [n, Hkv, D]), v: be.allocate('bf16', [n, Hkv, D]) };
    const opts = { blockSize: 128, wSink: 128, wLocal: 128, tokenScores: true, optionalStats: ['pooledEstimate' as const] };
    // without deferRead the token scores come back at once; with it they stay on the device
    await be.proxyStats(inputs.q, inputs.k, opts);
    expect(s.log.filter((e) => (e.kind === 'read' || e.kind === 'copyRead') && e.bytes === H * n * 4)).toHaveLength(2);
    s.log.length = 0;
    const stats = await be.proxyStats(inputs.q, inputs.k, { ...opts, deferRead: true });
    const req = { stats, route: { kind: 'jsd' as const, tau: 0.1 }, vs: { kind: 'cumulativeCoverage' as const, gamma: 0.95, kMin: 1024 }, peK: 8, pe: { q: inputs.q, k: inputs.k, gamma: 0.95 } };
    const res = await be.planner.plan(req);
    await res.read();
    const launches = s.log.filter((e) => e.kind === 'launch');
    const names = launches.map((e) => e.name as string);
    expect(names).not.toContain('vs_select');
    expect(names.indexOf('route_residual')).toBeLessThan(names.indexOf('route_cstruct'));
    // (the stand-in driver is compute capability 9.0: the cluster form)
    expect(names).not.toContain('coverage_select');
    expect(names.indexOf('route_cstruct')).toBeLessThan(names.indexOf('coverage_select_c8'));
    // route_residual over every block (full = 1); route_cstruct with no C_struct test (−inf) and its verdicts
    expect(launches.find((e) => e.name === 'route_residual')!.args![7][0]).toBe(1);
    // coverage_select_c8: grid (2, H, 8); n, B, T = floor(γ 2^52) as a u64, kBlocks, peK, peWithVs 0
    const cov = launches.find((e) => e.name === 'coverage_select_c8')!;
    expect(cov.shape).toEqual([2, H, 8, 256, 1, 1, Math.ceil(n / 128 / 32) * 4]);
    expect(cov.args![7][0]).toBe(n);
    expect(cov.args![8][0]).toBe(128);
    const T = Math.floor(0.95 * 2 ** 52);
    expect(cov.args![9][0] + cov.args![9][1] * 2 ** 32).toBe(T);
    expect(cov.args![10][0]).toBe(1024 / 128);
    expect(cov.args![11][0]).toBe(8);
    expect(cov.args![14][0]).toBe(0);
    // the token scores were not read back, and the rule's pointers are the kept ones (no upload of H·n floats)
    expect(s.log.filter((e) => (e.kind === 'read' || e.kind === 'copyRead') && e.bytes === H * n * 4)).toHaveLength(0);
    expect(cov.args![2][0] + cov.args![2][1] * 2 ** 32).not.toBe(0);
    // reading the statistics' token scores brings them back then
    expect(stats.verticalTokens).toHaveLength(H * n);
    res.prepared.release();
    be.dispose();
  });

  it('runs crispGuarded on the device with peVsExcessOnDevice: the residual test before the routes on the main stream, the noise floor for PE heads too, narrowed', async () => {
    const s = standInDriver({ heads: H, decodeArgs: 17 });
    const be = new CudaBackend(s.libs, { cacheDir: null, peVsExcessOnDevice: true });
    const inputs = { q: be.allocate('bf16', [n, H, D]), k: be.allocate('bf16', [n, Hkv, D]), v: be.allocate('bf16', [n, Hkv, D]) };
    releasePlan(await planPrefill(be, inputs, crispGuarded, { minSparseLength: 0 }));
    s.log.length = 0;
    be.startTrace();
    const plan = await planPrefill(be, inputs, crispGuarded, { minSparseLength: 0 });
    const launches = s.log.filter((e) => e.kind === 'launch');
    const names = launches.map((e) => e.name as string);
    expect(plan.prepared).toBeDefined();
    // (the zeros' C_struct routes every head to PE, on both sides)
    expect(plan.routing?.routes).toEqual(Array(H).fill('pe'));
    expect(names.filter((x) => x === 'route_residual')).toHaveLength(1);
    expect(names.filter((x) => x === 'route_cstruct')).toHaveLength(1);
    expect(names.indexOf('route_residual')).toBeLessThan(names.indexOf('route_cstruct'));
    expect(names.indexOf('route_cstruct')).toBeLessThan(names.indexOf('vs_select'));
    const residual = launches.find((e) => e.name === 'route_residual')!;
    expect(residual.args![2][0]).toBe(H);
    expect(residual.args![3][0]).toBe(n / 128);
    // route_cstruct: mode 3 (routes and the copy), with the residual verdicts' pointer
    const route = launches.find((e) => e.name === 'route_cstruct')!;
    expect(route.args![5][0]).toBe(3);
    expect(route.args![6][0]).not.toBe(0);
    // vs_select: peWithVs, then the narrowing: ā and C_struct where the statistics are kept,
    // κ and the band of C_struct that keeps the full lists (crispGuarded's)
    const sel = launches.find((e) => e.name === 'vs_select')!.args!;
    expect(sel[11][0]).toBe(1);
    const ptr = (a: readonly number[]) => a[0] + a[1] * 2 ** 32;
    const f64 = (a: readonly number[]) => new Float64Array(Uint32Array.from([a[0], a[1]]).buffer)[0];
    // α of the VS heads' floor, then of the PE heads' lists (Policy.peVs, else the same)
    const alphaOf = (x: VsSelector | undefined) => (x?.device as { readonly alpha?: number } | undefined)?.alpha;
    expect([f64(sel[5]), f64(sel[6])]).toEqual([alphaOf(crispGuarded.vs), alphaOf(crispGuarded.peVs ?? crispGuarded.vs)]);
    expect(ptr(sel[12])).not.toBe(0);
    // C_struct follows the kept buffer's non-finite count; p_v follows C_struct and the entropies
    expect(ptr(sel[0]) - ptr(sel[13])).toBe(2 * H * 8);
    expect(ptr(sel[12]) - ptr(sel[0])).toBe(2 * H * (n / 128) * 8);
    expect([f64(sel[14]), f64(sel[15]), f64(sel[16])]).toEqual([crispGuarded.peVsExcess, crispGuarded.peVsFullAnchor!.from, crispGuarded.peVsFullAnchor!.below]);
    const streams = be.stopTrace().filter((e) => e.name === 'route_residual' || e.name === 'route_cstruct').map((e) => e.stream);
    expect(streams).toEqual(['main', 'main']);
    // crisp's plan: no residual test, peWithVs 0
    s.log.length = 0;
    releasePlan(plan);
    releasePlan(await planPrefill(be, inputs, crisp, { minSparseLength: 0 }));
    const plain = s.log.filter((e) => e.kind === 'launch');
    expect(plain.some((e) => e.name === 'route_residual')).toBe(false);
    expect(plain.find((e) => e.name === 'vs_select')!.args![11][0]).toBe(0);
    expect(plain.find((e) => e.name === 'vs_select')!.args![14]).toEqual([0, 0]);
    be.dispose();
  });

  it('runs a peVs noise floor on the device as vs_select\'s second α (crispGuarded with its VS heads at α 2)', async () => {
    const s = standInDriver({ heads: H, decodeArgs: 17 });
    const be = new CudaBackend(s.libs, { cacheDir: null });
    expect(be.planner.peVs).toBe(true);
    const inputs = { q: be.allocate('bf16', [n, H, D]), k: be.allocate('bf16', [n, Hkv, D]), v: be.allocate('bf16', [n, Hkv, D]) };
    const denser = { ...crispGuarded, name: 'denser', vs: noiseFloor({ alpha: 2, kMin: 1024 }), peVs: crispGuarded.vs };
    s.log.length = 0;
    const plan = await planPrefill(be, inputs, denser, { minSparseLength: 0 });
    expect(plan.hostReason).toBeUndefined();
    expect(plan.prepared).toBeDefined();
    const sel = s.log.find((e) => e.kind === 'launch' && e.name === 'vs_select')!.args!;
    const f64 = (a: readonly number[]) => new Float64Array(Uint32Array.from([a[0], a[1]]).buffer)[0];
    expect([f64(sel[5]), f64(sel[6])]).toEqual([2, 1]);
    releasePlan(plan);
    // a peVs of another kMin is not the device's: the plan is made on the host, saying why
    const other = await planPrefill(be, inputs, { ...denser, peVs: noiseFloor({ alpha: 1, kMin: 2048 }) }, { minSparseLength: 0 });
    expect(other.prepared).toBeUndefined();
    expect(other.hostReason).toMatch(/peVs runs on the device only as a noise floor beside a noise floor with the same kMin/);
    releasePlan(other);
    be.dispose();
  });

  it('makes crispGuarded\'s plan on the host with peVsExcessOnDevice: false, with the same routes and lists', async () => {
    const s = standInDriver({ heads: H });
    expect(new CudaBackend(s.libs, { cacheDir: null }).planner.peVsExcess, 'the default').toBe(true);
    const be = new CudaBackend(s.libs, { cacheDir: null, peVsExcessOnDevice: false });
    expect(be.planner.peVsExcess).toBe(false);
    const inputs = { q: be.allocate('bf16', [n, H, D]), k: be.allocate('bf16', [n, Hkv, D]), v: be.allocate('bf16', [n, Hkv, D]) };
    s.log.length = 0;
    const plan = await planPrefill(be, inputs, crispGuarded, { minSparseLength: 0 });
    const names = s.log.filter((e) => e.kind === 'launch').map((e) => e.name as string);
    expect(plan.prepared).toBeUndefined();
    expect(names).not.toContain('vs_select');
    expect(names).not.toContain('route_residual');
    // the same plan a device planner would make is the host rule's: every head PE on the zeros
    expect(plan.routing?.routes).toEqual(Array(H).fill('pe'));
    releasePlan(plan);
    be.dispose();
  });

  it('queues statistics, routing, selection and the VS heads\' rows, then the PE heads\' after one read behind an event', async () => {
    const { be, inputs, log } = setup();
    releasePlan(await planPrefill(be, inputs, crisp, { minSparseLength: 0 })); // checks q, k once
    log.length = 0;
    const plan = await planPrefill(be, inputs, crisp, { minSparseLength: 0 });
    const launches = log.filter((e) => e.kind === 'launch').map((e) => e.name as string);
    const at = (name: string) => launches.findIndex((x) => x.startsWith(name));
    const lastAt = (name: string) => launches.findLastIndex((x) => x.startsWith(name));
    for (const [a, b] of [
      // crisp's router reads C_struct alone: the lean pass, and the PE heads' key block means
      // from block_means (on the second stream in sparsePrefill)
      ['proxy_wg_pass1l', 'route_cstruct'],
      ['block_means', 'pe_q_means'],
      ['route_cstruct', 'vs_select'],
      ['vs_select', 'expand_count'],
      ['expand_count', 'expand_write'],
      ['expand_write', 'pe_q_means'],
      ['pe_write', 'expand_count'],
    ] as const) {
      expect(at(a), `${a} in ${launches.join(',')}`).toBeGreaterThanOrEqual(0);
      expect(at(a), `${a} before ${b}`).toBeLessThan(b === 'expand_count' && a === 'pe_write' ? lastAt(b) : at(b));
    }
    // each expansion's scan (with its summary) between counting and writing its rows
    expect(launches.slice(at('expand_count'), at('expand_write'))).toContain('exclusive_scan_tiles');
    expect(launches.slice(lastAt('expand_count'), lastAt('expand_write'))).toContain('exclusive_scan_tiles');
    // no synchronising read at all; the first copy (the plan's routes, PE count, lists and VS
    // heads' summary) waits for an event behind the VS heads' rows, and only then are the PE
    // heads queued (their count comes with it)
    expect(log.some((e) => e.kind === 'read')).toBe(false);
    const firstWrite = log.findIndex((e) => e.kind === 'launch' && e.name === 'expand_write');
    const firstCopy = log.findIndex((e) => e.kind === 'copyRead');
    // (between them the main stream joins the third stream, where the statistics' head values are)
    expect(log.slice(firstWrite, firstCopy).map((e) => e.kind)).toEqual(['launch', 'wait', 'record', 'wait']);
    expect(log.findIndex((e) => e.kind === 'launch' && (e.name as string).startsWith('pe_'))).toBeGreaterThan(firstCopy);
    // zeros from the device: C_struct 0 routes every head to PE on both sides
    expect(plan.routing?.routes).toEqual(Array(H).fill('pe'));
    expect(plan.stats?.finite).toBe(true);
    releasePlan(plan);
    be.dispose();
  });

  it('launches the chain after the proxy pass programmatically (PDL_KERNELS), on the stream and with the arguments of a plain launch', async () => {
    const runs = [];
    for (const pdl of [true, false]) {
      const { be, inputs, log } = setup(undefined, pdl);
      expect(be.programmaticLaunch).toBe(pdl);
      (await sparsePrefill(be, inputs, crisp, { minSparseLength: 0 })).output.dispose();
      log.length = 0;
      (await sparsePrefill(be, inputs, crisp, { minSparseLength: 0 })).output.dispose();
      runs.push(log.filter((e) => e.kind === 'launch'));
      be.dispose();
    }
    const [on, off] = runs;
    // the same launches in the same order on the same streams, with the same grids, blocks and
    // shared bytes, either way
    expect(on.map((e) => [e.name, e.stream, e.shape])).toEqual(off.map((e) => [e.name, e.stream, e.shape]));
    expect(on.every((e) => e.shape?.length === 7 && e.shape.every((x) => x >= 0))).toBe(true);
    const programmatic = on.filter((e) => e.attributes !== undefined);
    // each of the chain's kernels ran (but the scans' tile sums: one tile at this n; and
    // coverage_select, the other selection), and exactly those went through
    // cuLaunchKernelEx, each with the one attribute: programmatic stream serialisation allowed
    expect(on.some((e) => e.name === 'exclusive_scan_sums' || String(e.name).startsWith('coverage_select'))).toBe(false);
    expect(new Set(programmatic.map((e) => e.name))).toEqual(new Set([...PDL_KERNELS].filter((x) => x !== 'exclusive_scan_sums' && !x.startsWith('coverage_select'))));
    expect(on.filter((e) => PDL_KERNELS.has(e.name as string)).every((e) => e.attributes !== undefined)).toBe(true);
    for (const e of programmatic) expect(e.attributes, e.name).toEqual([[6, 1]]);
    expect(on.find((e) => (e.name as string).startsWith('proxy_wg_pass1'))?.attributes).toBeUndefined();
    expect(off.every((e) => e.attributes === undefined)).toBe(true);
  });

  it('runs the router on a second stream beside the statistics, and the PE heads there beside the VS heads\' attention', async () => {
    const { be, inputs, log } = setup(undefined, undefined, 15);
    (await sparsePrefill(be, inputs, crisp, { minSparseLength: 0 })).output.dispose();
    log.length = 0;
    const r = await sparsePrefill(be, inputs, crisp, { minSparseLength: 0 });
    const main = log.find((e) => e.kind === 'launch')?.stream;
    const i = (pred: (e: (typeof log)[number]) => boolean) => log.findIndex(pred);
    const launch = (name: string) => i((e) => e.kind === 'launch' && (e.name as string).startsWith(name));
    const routes = log.filter((e) => e.kind === 'launch' && e.name === 'route_cstruct');
    expect(routes).toHaveLength(2);
    const side = routes[0].stream;
    expect(side).not.toBe(main);
    // the third stream: C_struct, then the head values and their copy (behind proxy_heads and
    // the finiteness count)
    const tail = routes[1].stream;
    expect([main, side]).not.toContain(tail);
    const onTail = log.filter((e) => e.kind === 'launch' && e.stream === tail).map((e) => e.name);
    expect(onTail).toEqual(['proxy_cstruct', 'proxy_heads', 'count_nonfinite_f64', 'route_cstruct']);
    // the third stream starts behind the block sums (a fence on the main stream), and the main
    // stream joins it behind the VS heads' rows, before the plan's end and their attention
    const heads = launch('proxy_heads');
    expect(log.slice(launch('proxy_blocks_b') + 1, heads).map((e) => [e.kind, e.stream])).toEqual([
      ['record', main],
      ['wait', tail],
    ]);
    const vsWrite = launch('expand_write');
    expect(log[vsWrite + 1]).toMatchObject({ kind: 'wait', stream: main });
    // C_struct on the third stream behind the combine (a fence on the main stream), then the
    // fence the second stream's router waits for; the main stream goes on to the block sums
    const cs = launch('proxy_cstruct');
    expect(log.slice(launch('proxy_combine') + 1, cs + 2).map((e) => [e.kind, e.stream])).toEqual([
      ['record', main],
      ['wait', tail],
      ['launch', tail],
      ['record', tail],
    ]);
    expect(log[cs + 2]).toMatchObject({ kind: 'launch', name: 'proxy_fused_sums', stream: main });
    const firstRoute = log.indexOf(routes[0]);
    expect(log[firstRoute - 1]).toMatchObject({ kind: 'wait', stream: side });
    // the main stream waits for the routes before vs_select
    expect(log.slice(firstRoute + 1, launch('vs_select')).map((e) => [e.kind, e.stream])).toEqual([
      ['record', side],
      ['wait', main],
      ['launch', tail],
      ['record', tail],
    ]);
    // two attention launches: the VS heads' on the main stream right behind their rows, then
    // the PE heads' on the second stream behind the PE kernels and rows, which start there
    // only once the plan's end is reached (a wait on the main stream's event)
    const attn = log.filter((e) => e.kind === 'launch' && (e.name as string).startsWith('attn_'));
    expect(attn.map((e) => e.stream)).toEqual([main, side]);
    // block-sparse launches: grid [query blocks, head slots] and CTA order 1 in hmode's bits
    // 2-3 beside the head selection (1: the routed VS heads of all H; 2: the listed PE heads)
    const Nq = Math.ceil(n / 128);
    expect(attn[0].shape?.slice(0, 3)).toEqual([Nq, H, 1]);
    expect(attn[0].args![14][0]).toBe(4 | 1);
    expect(attn[1].shape?.slice(0, 2)).toEqual([Nq, H]);
    expect(attn[1].args![14][0]).toBe(4 | 2);
    const vsAttn = log.indexOf(attn[0]);
    expect(launch('pe_q_means')).toBeGreaterThan(vsAttn);
    for (const e of log.slice(vsAttn + 1).filter((x) => x.kind === 'launch')) expect(e.stream, e.name as string).toBe(side);
    for (const e of log.slice(0, vsAttn).filter((x) => x.kind === 'launch' && x.stream !== tail && x !== routes[0])) {
      expect(e.stream, e.name as string).toBe(main);
    }
    const firstPe = launch('pe_q_means');
    expect(log.slice(vsAttn + 1, firstPe).filter((e) => e.kind === 'wait').map((e) => e.stream)).toContain(side);
    // the main stream waits for the PE heads' attention before the call's end
    const peAttn = log.indexOf(attn[1]);
    expect(log.slice(peAttn + 1).some((e) => e.kind === 'wait' && e.stream === main)).toBe(true);
    expect(r.plan.routing?.routes).toEqual(Array(H).fill('pe'));
    r.output.dispose();
    be.dispose();
  });

  it("plans a chunk after a cached prefix on the device: the proxy pass and the PE heads read q from the chunk's first position", async () => {
    const s = standInDriver({ heads: H, decodeArgs: 13 });
    const be = new CudaBackend(s.libs, { cacheDir: null });
    const m = 1000;
    const inputs = { q: be.allocate('bf16', [m, H, D]), k: be.allocate('bf16', [n, Hkv, D]), v: be.allocate('bf16', [n, Hkv, D]) };
    s.log.length = 0;
    const res = await sparsePrefill(be, inputs, crisp, { minSparseLength: 0 });
    expect(res.output.shape).toEqual([m, H, D]);
    expect(res.plan.shape.queries).toBe(m);
    expect(res.plan.numBlocks).toBe(n / 128);
    const launches = s.log.filter((e) => e.kind === 'launch');
    // the proxy pass: n, H, Hkv, b, q's first position
    const pass = launches.find((e) => /^proxy_(wg_)?pass1/.test(e.name ?? ''))!;
    expect(pass.args!.slice(8, 13).map((a) => a[0])).toEqual([n, H, Hkv, 128, n - m]);
    // the PE heads' query means from q's first position, and their map's rows from the chunk's first query block
    const at = (name: string) => launches.find((e) => e.name?.startsWith(name))!;
    expect(at('pe_q_means').args![7][0]).toBe(n - m);
    expect(at('pe_softmax').args![7][0]).toBe(Math.floor((n - m) / 128));
    // the VS heads' attention, then the PE heads' (the second stream), after the plan
    expect(launches.filter((e) => e.name?.startsWith('attn_')).length).toBe(2);
    be.dispose();
  });

  it('sparsePrefill launches the attention behind the plan before reading anything back', async () => {
    const { be, inputs, log } = setup();
    (await sparsePrefill(be, inputs, crisp, { minSparseLength: 0 })).output.dispose(); // checks q, k, v once
    log.length = 0;
    const r = await sparsePrefill(be, inputs, crisp, { minSparseLength: 0 });
    const attention = log.findIndex((e) => e.kind === 'launch' && (e.name as string).startsWith('attn_'));
    expect(attention).toBeGreaterThan(0);
    expect(log.slice(0, attention).some((e) => e.kind === 'read' || e.kind === 'copyRead' || e.kind === 'sync')).toBe(false);
    expect(log.slice(attention).some((e) => e.kind === 'copyRead')).toBe(true);
    expect(r.plan.routing?.routes).toEqual(Array(H).fill('pe'));
    // the device's timeline (the stand-in's events say 0 ms) and the host's overlapped work
    expect(r.timings.planMs).toBe(0);
    expect(r.plan.phases?.overlappedMs).toBeGreaterThanOrEqual(0);
    r.output.dispose();
    be.dispose();
  });

  it('checks a fresh layer for NaN/Inf once per tensor version, before any work on it', async () => {
    let poison = false;
    const { be, inputs, log } = setup((out, kind) => {
      // the checks' 4-byte counts
      if (poison && kind === 'read' && out instanceof Int32Array && out.length === 1) out[0] = 5;
    });
    (await sparsePrefill(be, inputs, crisp, { minSparseLength: 0 })).output.dispose();
    const fresh = () => {
      for (const t of Object.values(inputs)) (t as CudaTensor).markWritten();
    };
    // reused tensors: no check at all
    log.length = 0;
    (await sparsePrefill(be, inputs, crisp, { minSparseLength: 0 })).output.dispose();
    expect(log.some((e) => e.name === 'count_nonfinite')).toBe(false);
    // a new layer: q, k and v checked once each, q and k before the proxy pass
    fresh();
    log.length = 0;
    (await sparsePrefill(be, inputs, crisp, { minSparseLength: 0 })).output.dispose();
    const names = log.filter((e) => e.kind === 'launch').map((e) => e.name as string);
    expect(names.filter((x) => x === 'count_nonfinite').length).toBe(3);
    expect(names.slice(0, 2)).toEqual(['count_nonfinite', 'count_nonfinite']);
    // a bad count: NON_FINITE naming q, before any other launch and before any allocation of
    // an output
    fresh();
    poison = true;
    log.length = 0;
    const made: unknown[] = [];
    const allocate = be.allocate.bind(be);
    vi.spyOn(be, 'allocate').mockImplementation((d, shape) => {
      const t = allocate(d, shape);
      made.push(t);
      return t;
    });
    await expect(sparsePrefill(be, inputs, crisp, { minSparseLength: 0 })).rejects.toMatchObject({ code: 'NON_FINITE', details: { tensor: 'q' } });
    expect(log.filter((e) => e.kind === 'launch').map((e) => e.name)).toEqual(['count_nonfinite']);
    expect(made.length).toBe(0);
    be.dispose();
  });

  it("leaves the primary context's scheduling flags alone by default, sets the one asked for, and rejects an unknown schedule", () => {
    const flagsSet = (schedule?: string) => {
      const s = standInDriver({ heads: H });
      const be = new CudaBackend(s.libs, { cacheDir: null, ...(schedule ? { schedule: schedule as 'spin' } : {}) });
      be.dispose();
      return s.log.filter((e) => e.kind === 'ctxFlags').map((e) => e.name);
    };
    expect(flagsSet()).toEqual([]);
    expect(flagsSet('spin')).toEqual(['1']);
    expect(flagsSet('blocking')).toEqual(['4']);
    expect(flagsSet('yield')).toEqual(['2']);
    expect(flagsSet('auto')).toEqual([]);
    expect(() => flagsSet('busy')).toThrow(expect.objectContaining({ code: 'INVALID_ARGUMENT' }));
  });

  it('deviceSleep queues one spin kernel on the main stream and rejects a bad length before any launch', () => {
    const { be, log } = setup();
    const from = log.length;
    be.deviceSleep(2.5);
    const launches = log.slice(from).filter((e) => e.kind === 'launch');
    expect(launches.map((e) => e.name)).toEqual(['spin_ns']);
    for (const bad of [-1, Number.NaN, 1001]) expect(() => be.deviceSleep(bad)).toThrow(/deviceSleep takes 0..1000 ms/);
    expect(log.slice(from).filter((e) => e.kind === 'launch')).toHaveLength(1);
    be.dispose();
  });

  it("names each traced launch's stream", async () => {
    const { be, inputs } = setup();
    (await sparsePrefill(be, inputs, crisp, { minSparseLength: 0 })).output.dispose();
    be.startTrace();
    (await sparsePrefill(be, inputs, crisp, { minSparseLength: 0 })).output.dispose();
    const launches = be.stopTrace().filter((e) => e.startMs !== undefined);
    const streamOf = (name: string) => launches.filter((e) => e.name.startsWith(name)).map((e) => e.stream);
    expect(streamOf('pe_')).not.toHaveLength(0);
    expect(new Set(streamOf('pe_'))).toEqual(new Set(['side']));
    expect(streamOf('route_cstruct')).toEqual(['side', 'tail']);
    expect(streamOf('proxy_heads')).toEqual(['tail']);
    expect(streamOf('proxy_cstruct')).toEqual(['tail']);
    const others = launches.filter((e) => (e.name.startsWith('proxy_') && e.name !== 'proxy_heads' && e.name !== 'proxy_cstruct') || e.name.startsWith('vs_'));
    expect(new Set(others.map((e) => e.stream))).toEqual(new Set(['main']));
    // each expansion and attention launch twice: the VS heads' on the main stream, the PE heads' on the second
    expect(streamOf('expand_write')).toEqual(['main', 'side']);
    expect(streamOf('attn_')).toEqual(['main', 'side']);
    be.dispose();
  });

  it('runs the lean pass only when the router declares it reads no optional statistic, and computes those when first read', async () => {
    const { be, inputs, log } = setup();
    const pass = () => log.filter((e) => e.kind === 'launch' && (e.name as string).startsWith('proxy_wg_pass1')).map((e) => e.name);
    // crisp's router (needs.optionalStats []): the lean pass; reading the entropy or the
    // pooled estimate runs the full pass once, for both
    const plan = await planPrefill(be, inputs, crisp, { minSparseLength: 0 });
    expect(pass()).toEqual(['proxy_wg_pass1l_bf16_d128_b128']);
    log.length = 0;
    expect(plan.stats?.rowEntropy).toHaveLength(H);
    expect(plan.stats?.pooledEstimate).toHaveLength(H * plan.numBlocks);
    expect(pass()).toEqual(['proxy_wg_pass1f_bf16_d128_b128']);
    releasePlan(plan);
    // a router that does not declare what it reads: the full pass
    log.length = 0;
    const { needs: _n, ...undeclared } = crisp.router!;
    const full = await planPrefill(be, inputs, { ...crisp, router: { ...undeclared, route: (s: ProxyStats) => crisp.router!.route(s) } }, { minSparseLength: 0 });
    expect(pass()).toEqual(['proxy_wg_pass1f_bf16_d128_b128']);
    releasePlan(full);
    // once k is written, the left-out statistics can no longer be computed: a typed error
    const lean = await planPrefill(be, inputs, crisp, { minSparseLength: 0 });
    (inputs.k as CudaTensor).markWritten();
    expect(() => lean.stats?.rowEntropy).toThrow(expect.objectContaining({ code: 'INVALID_ARGUMENT' }));
    releasePlan(lean);
    // a bad request
    await expect(
      be.proxyStats(inputs.q, inputs.k, { blockSize: 128, wSink: 128, wLocal: 128, optionalStats: ['entropy' as 'rowEntropy'] }),
    ).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
    be.dispose();
  });

  it("names the pass for each call's own configuration when calls alternate dtype, head dim and block size", async () => {
    const { be, log } = setup();
    const pass = () => log.filter((e) => e.kind === 'launch' && (e.name as string).startsWith('proxy_wg_pass1')).map((e) => e.name);
    const layer = (dtype: 'bf16' | 'f16', d: number) => ({ q: be.allocate(dtype, [n, H, d]), k: be.allocate(dtype, [n, Hkv, d]) });
    const a = layer('bf16', 128);
    const b = layer('f16', 64);
    for (const [x, B] of [
      [a, 128],
      [b, 128],
      [b, 64],
      [a, 128],
    ] as const) {
      await be.proxyStats(x.q, x.k, { blockSize: B, wSink: 128, wLocal: 128 });
    }
    expect(pass()).toEqual(['proxy_wg_pass1f_bf16_d128_b128', 'proxy_wg_pass1f_f16_d64_b128', 'proxy_wg_pass1f_f16_d64_b64', 'proxy_wg_pass1f_bf16_d128_b128']);
    be.dispose();
  });

  it('decides the device plan per backend when one frozen policy alternates between backends', async () => {
    const { be, inputs, log } = setup();
    const ref = createReferenceBackend();
    const seen: (boolean | undefined)[] = [];
    const refStats = ref.proxyStats.bind(ref);
    ref.proxyStats = (q, k, opts) => {
      seen.push(opts.deferRead);
      return refStats(q, k, opts);
    };
    const small = 2048;
    const rq = ref.allocate('bf16', [small, H, D]);
    const rk = ref.allocate('bf16', [small, Hkv, D]);
    ref.write(rq, 0, new Uint16Array(small * H * D).fill(0x3c00));
    ref.write(rk, 0, new Uint16Array(small * Hkv * D).fill(0x3c00));
    for (let i = 0; i < 2; i++) {
      log.length = 0;
      releasePlan(await planPrefill(be, inputs, crisp, { minSparseLength: 0 }));
      // the CUDA backend plans on the device (its route kernel runs), the reference on the host
      expect(log.some((e) => e.kind === 'launch' && e.name === 'route_cstruct')).toBe(true);
      await planPrefill(ref, { q: rq, k: rk }, crisp, { minSparseLength: 0 });
    }
    expect(seen).toEqual([false, false]);
    be.dispose();
  });

  it('stays on one stream when other work was queued between the statistics and the plan', async () => {
    const { be, inputs, log } = setup();
    const stats = await be.proxyStats(inputs.q, inputs.k, { blockSize: 128, wSink: 128, wLocal: 128, deferRead: true });
    (await be.denseAttention(inputs.q, inputs.k, inputs.v)).output.dispose();
    log.length = 0;
    const res = await be.planner.plan(planRequest(stats, inputs.q, inputs.k));
    const launches = log.filter((e) => e.kind === 'launch');
    expect(launches.filter((e) => e.name === 'route_cstruct')).toHaveLength(1);
    expect(new Set(launches.map((e) => e.stream)).size).toBe(1);
    res.prepared.release();
    be.dispose();
  });

  it('routes a plan whose pooled maps pass the PE part size through route.cu, read back, then prepares its mask', async () => {
    // 8 heads of 16,384 blocks (n 2^20, B 64): 8 GiB of pooled maps, past one PE part
    const wantVs = [1, 0, 1, 1, 0, 0, 1, 0];
    const { libs, log } = standInDriver({
      heads: H,
      onRead: (out, kind) => {
        if (kind === 'read' && out instanceof Int32Array && out.length === H) out.set(wantVs);
      },
    });
    const be = new CudaBackend(libs, { cacheDir: null });
    const N = 1 << 20;
    const q = be.allocate('bf16', [N, H, D]);
    const k = be.allocate('bf16', [N, Hkv, D]);
    const stats = await be.proxyStats(q, k, { blockSize: 64, wSink: 64, wLocal: 64, deferRead: true });
    log.length = 0;
    const res = await be.planner.plan(planRequest(stats, q, k));
    const launches = log.filter((e) => e.kind === 'launch').map((e) => e.name as string);
    expect(launches.indexOf('route_cstruct')).toBeGreaterThanOrEqual(0);
    expect(launches.indexOf('route_cstruct')).toBeLessThan(launches.indexOf('vs_select'));
    expect(launches.filter((x) => x === 'route_cstruct')).toHaveLength(1);
    expect((await res.read()).routes).toEqual(wantVs.map((x) => (x === 1 ? 'vs' : 'pe')));
    res.prepared.release();
    be.dispose();
  });

  it('rejects requests it cannot run with typed errors, before any launch', async () => {
    const { be, inputs, log } = setup();
    const stats = await be.proxyStats(inputs.q, inputs.k, { blockSize: 128, wSink: 128, wLocal: 128, deferRead: true });
    const base = planRequest(stats, inputs.q, inputs.k);
    log.length = 0;
    const code = async (req: unknown) => {
      try {
        await be.planner.plan(req as Parameters<CudaBackend['planner']['plan']>[0]);
        return 'ok';
      } catch (e) {
        return (e as { code?: string }).code;
      }
    };
    expect(await code({ ...base, route: { kind: 'entropy', tau: 0.1 } })).toBe('UNSUPPORTED');
    expect(await code({ ...base, route: { kind: 'jsd', tauProxy: 0.1 } })).toBe('INVALID_ARGUMENT');
    expect(await code({ ...base, route: { kind: 'anyPe', rules: [{ kind: 'jsd', tau: 0.1 }, { kind: 'residualJsd', tau: 0.1, minResidual: 0.3 }] } })).toBe('UNSUPPORTED');
    expect(await code({ ...base, vs: { kind: 'cumulativeCoverage', gamma: 0.995, kMin: 1024 } })).toBe('INVALID_ARGUMENT');
    // (the coverage rule reads token scores, which these statistics do not hold)
    expect(await code({ ...base, vs: { kind: 'cumulativeCoverage', gamma: 0.95, kMin: 1024 } })).toBe('INVALID_ARGUMENT');
    expect(await code({ ...base, route: { kind: 'cStruct', tauProxy: Number.NaN } })).toBe('INVALID_ARGUMENT');
    expect(await code({ ...base, vs: { kind: 'noiseFloor', alpha: 1, kMin: 1000 } })).toBe('INVALID_ARGUMENT');
    expect(await code({ ...base, pe: { ...base.pe, gamma: 1.5 } })).toBe('INVALID_ARGUMENT');
    expect(await code({ ...base, stats: undefined })).toBe('INVALID_ARGUMENT');
    // q and k of another problem than the statistics' (half the heads)
    const fewer = be.allocate('bf16', [n, H / 2, D]);
    expect(await code({ ...base, pe: { ...base.pe, q: fewer } })).toBe('INVALID_ARGUMENT');
    expect(log.filter((e) => e.kind === 'launch').length).toBe(0);
    expect(await code(base)).toBe('ok');
    // a request that failed after the second stream's fence: the retry, and any later plan on
    // these statistics, routes on the main stream (the statistics' event may have been reused)
    const routes = log.filter((e) => e.kind === 'launch' && e.name === 'route_cstruct');
    expect(routes.map((e) => e.stream)).toEqual([routes[0].stream]);
    log.length = 0;
    expect(await code(base)).toBe('ok');
    expect(log.filter((e) => e.kind === 'launch' && e.name === 'route_cstruct')).toHaveLength(1);
    be.dispose();
  });

  it('rejects a two-stream plan whose VS heads\' rows came out bad once the PE heads are queued, and recovers', async () => {
    const prefix = devicePlanPrefix(H);
    let bad = false;
    const { be, inputs, log } = setup((out, kind) => {
      if (bad && kind === 'copyRead' && out instanceof Int32Array && out.length === prefix.ints) out[prefix.badRow] = 5;
    });
    (await sparsePrefill(be, inputs, crisp, { minSparseLength: 0 })).output.dispose();
    bad = true;
    log.length = 0;
    await expect(sparsePrefill(be, inputs, crisp, { minSparseLength: 0 })).rejects.toMatchObject({ code: 'BACKEND_ERROR' });
    // the VS heads' attention was launched, the PE heads' never were
    const attn = log.filter((e) => e.kind === 'launch' && (e.name as string).startsWith('attn_'));
    expect(attn).toHaveLength(1);
    expect(log.some((e) => e.kind === 'launch' && (e.name as string).startsWith('pe_'))).toBe(false);
    bad = false;
    const r = await sparsePrefill(be, inputs, crisp, { minSparseLength: 0 });
    expect(r.plan.routing?.routes).toEqual(Array(H).fill('pe'));
    r.output.dispose();
    be.dispose();
  });

  it('fails the plan when the device routes differ from the host router, and releases the prepared mask', async () => {
    // the device says head 0 is VS (routes follow the statistics' head copy in the buffer
    // read with the list pointers); the statistics say C_struct 0 (PE)
    const prefix = devicePlanPrefix(H);
    const { be, inputs } = setup((out, kind) => {
      if (kind === 'copyRead' && out instanceof Int32Array && out.length === prefix.ints) out[prefix.routes] = 1;
    });
    let stats: ProxyStats | undefined;
    await expect(
      (async () => {
        const r = await sparsePrefill(be, inputs, crisp, { minSparseLength: 0 });
        stats = r.plan.stats;
      })(),
    ).rejects.toMatchObject({ code: 'BACKEND_ERROR' });
    expect(stats).toBeUndefined();
    // what it prepared went back to the pool: the next plan runs
    expect(be.memoryInfo().pooled).toBeGreaterThan(0);
    be.dispose();
  });
});
