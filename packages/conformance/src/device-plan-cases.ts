/**
 * The device planner's cases (backends with `planner`): routing, VS selection, PE rows and
 * the expanded mask made on the device must equal the host parts on the same statistics,
 * for crisp's rules (cStruct + noise floor) and crispGuarded's (anyPe of cStruct and
 * residualJsd, PE heads keeping the noise floor's lists).
 */
import {
  assertFiniteStats,
  type Backend,
  type DevicePlanOutcome,
  type DeviceRouterRule,
  type DeviceTensor,
  type DType,
  headSlice,
  deviceRouteTerms,
  numBlocks,
  plannerMargin,
  type PreparedMask,
  type ProxyStats,
  residualDistance,
  type Route,
  routeMarginal,
  selectedBlockCounts,
  selectVsLists,
  spreadRowPtr,
  toFloat32,
  vsHead,
  vsListsFromArrays,
  type VsLists,
} from '@crisp/core';
import { noiseFloor } from '@crisp/select';
import { bitEqual, type ConformanceCase, makeCase, outcome, poisoned, type ShapeCase, shapeName, upload } from './case-support.js';
import { attentionInputs } from './random.js';

/**
 * τ for a device-plan case: between the two middle distinct values of the statistics'
 * C_struct, so both routes occur; when the windows cover every key (n <= wSink + wLocal)
 * C_struct is 1 up to rounding for every head, and one route is all there is to check.
 */
function splitTau(stats: ProxyStats): { tauProxy: number; split: boolean; distinct: number } {
  const distinct = [...new Set(stats.cStruct)].sort((a, b) => a - b);
  const m = Math.max(1, Math.floor(distinct.length / 2));
  const split = distinct.length > 1;
  return { tauProxy: split ? (distinct[m - 1] + distinct[m]) / 2 : distinct[0], split, distinct: distinct.length };
}

/** The cStruct rule's routes, by its definition (C_struct >= τ: VS). */
function cStructRoutes(stats: ProxyStats, tauProxy: number): Route[] {
  return Array.from(stats.cStruct, (v): Route => (v >= tauProxy ? 'vs' : 'pe'));
}

/**
 * Device selection (backends whose planner runs the noise floor): the device plan's routes
 * and lists must equal the host rules' on the same statistics, exactly (same f64 rule, same
 * ties), for VS heads on the floor, VS heads where too few blocks pass (the top-k fallback)
 * and PE heads (the peK best of each direction, ∪ {0}).
 */
export function deviceSelectCase(dtype: DType, s: ShapeCase): ConformanceCase {
  const c = makeCase(`deviceSelect/${shapeName(s)}/${dtype}`, dtype, s, s.blockSize, async (ctx, r) => {
    const x = attentionInputs(r, dtype, s);
    const B = s.blockSize;
    const be = ctx.backend;
    const d = upload(be, x);
    const opts = { blockSize: B, wSink: B, wLocal: B };
    const { tauProxy } = splitTau(await be.proxyStats(d.q, d.k, opts));
    const gamma = 0.8 + 0.15 * r();
    const lines: string[] = [];
    try {
      // alpha 1 (the floor), a huge alpha (nothing passes: the kMin / B best), peK 2
      for (const alpha of [1, 1e6]) {
        const peK = 2;
        const stats = await be.proxyStats(d.q, d.k, { ...opts, deferRead: true, optionalStats: [] });
        const res = await be.planner!.plan({
          stats,
          route: { kind: 'cStruct', tauProxy },
          vs: { kind: 'noiseFloor', alpha, kMin: 2 * B },
          peK,
          pe: { q: d.q, k: d.k, gamma },
        });
        try {
          const got = await res.read();
          await stats.settle?.();
          assertFiniteStats(stats);
          const routes = cStructRoutes(stats, tauProxy);
          if (got.routes.join(',') !== routes.join(',')) lines.push(`alpha ${alpha}: routes ${got.routes.join(',')}, expected ${routes.join(',')}`);
          const want = selectVsLists(stats, routes, noiseFloor({ alpha, kMin: 2 * B }), peK);
          for (const key of ['verticalPtr', 'vertical', 'slashPtr', 'slash'] as const) {
            if (!bitEqual(got.vs[key], want[key])) lines.push(`alpha ${alpha}: ${key} differs from the host selector's: got [${got.vs[key].slice(0, 12).join(',')}...], expected [${want[key].slice(0, 12).join(',')}...]`);
          }
        } finally {
          res.prepared.release();
        }
      }
    } finally {
      for (const t of Object.values(d)) t.dispose();
    }
    return outcome(lines.length ? 1 : 0, 0, lines);
  });
  return { ...c, needs: { ...c.needs, deviceSelector: 'noiseFloor', deviceRouter: 'cStruct' } };
}

/**
 * The plan on the device (backends with a planner): statistics with deferRead, then
 * routing, selection, PE rows and expansion in one request. Exactly what the host parts give
 * on the same statistics: the cStruct rule's routes, the noise floor's lists, the backend's
 * own peBlockRows for the routed PE heads (checked against the reference by peBlockRows'
 * case), and the union's block counts. τ sits between two heads' C_struct, so both routes
 * occur. `narrowed` (with `guarded`): the PE heads' lists narrowed as Policy.peVsExcess does,
 * with a band of C_struct (Policy.peVsFullAnchor) that keeps the full lists on some PE heads,
 * and taken at their own α (Policy.peVs), apart from the VS heads'.
 */
export function devicePlanCase(dtype: DType, s: ShapeCase, guarded = false, narrowed = false): ConformanceCase {
  const kind = narrowed ? 'Narrowed' : guarded ? 'Guarded' : '';
  const c = makeCase(`devicePlan${kind}/${shapeName(s)}/${dtype}`, dtype, s, s.blockSize, async (ctx, r) => {
    const x = attentionInputs(r, dtype, s);
    const B = s.blockSize;
    const be = ctx.backend;
    const d = upload(be, x);
    const H = s.heads;
    const Nb = numBlocks(s.n, B);
    const opts = { blockSize: B, wSink: B, wLocal: B };
    const { tauProxy, split, distinct } = splitTau(await be.proxyStats(d.q, d.k, opts));
    const gamma = 0.8 + 0.15 * r();
    const peK = 2;
    // narrowed: the VS heads' noise floor at α 1.5 and the PE heads' lists at α 1 (Policy.peVs,
    // as a policy tuning the two apart has them); otherwise one rule at α 1 for both
    const rule = { kind: 'noiseFloor' as const, alpha: narrowed ? 1.5 : 1, kMin: 2 * B };
    const peRule = narrowed ? { kind: 'noiseFloor' as const, alpha: 1, kMin: 2 * B } : undefined;
    // (as sparsePrefill asks for them: no optional statistics with the C_struct router, the
    // pooled estimate with the residual one)
    const stats = await be.proxyStats(d.q, d.k, { ...opts, deferRead: true, optionalStats: guarded ? ['pooledEstimate'] : [] });
    // guarded: τ for the residual test between the two middle distances of the heads cStruct
    // sends to VS, so that some go to PE by their residual alone
    const margin = plannerMargin(be.planner);
    const residual = guarded ? splitResidual(await be.proxyStats(d.q, d.k, { ...opts, optionalStats: ['pooledEstimate'] }), tauProxy, margin) : undefined;
    const route: DeviceRouterRule = residual
      ? { kind: 'anyPe', rules: [{ kind: 'cStruct', tauProxy }, { kind: 'residualJsd', tau: residual.tau, minResidual: 0 }] }
      : { kind: 'cStruct', tauProxy };
    // narrowed: κ about 1 (about half of a random input's blocks pass p_v > κ ā), and the
    // band [0, a midpoint between the two smallest C_struct): the lowest heads keep the full
    // lists, the rest are narrowed
    const narrow = narrowed ? { peVsExcess: 0.8 + 0.4 * r(), peVsFullAnchor: lowestBand(await be.proxyStats(d.q, d.k, opts)) } : undefined;
    const res = await be.planner!.plan({ stats, route, vs: rule, peK, pe: { q: d.q, k: d.k, gamma }, ...(guarded ? { peWithVs: true } : {}), ...(peRule ? { peVs: peRule } : {}), ...narrow });
    const lines: string[] = [];
    const outs: DeviceTensor[] = [];
    try {
      const queued = await queueOnUnreadPlan(be, d, dtype, { heads: H, numBlocks: Nb, blockSize: B }, res.prepared, outs);
      const plan = await res.read();
      await stats.settle?.();
      assertFiniteStats(stats);
      // the host rules' routes; a head whose residual distance lies within the planner's
      // margin of τ may take the device's route (the plan keeps it, as sparsePrefill does)
      const hostRoutes = residual ? guardedRoutes(stats, tauProxy, residual.tau) : cStructRoutes(stats, tauProxy);
      const terms = deviceRouteTerms(route);
      const routes = hostRoutes.map((x, h) => (x !== plan.routes[h] && terms && routeMarginal(terms, stats, h, margin) ? plan.routes[h] : x));
      if (!bitEqual(Array.from(plan.routes, (x) => (x === 'vs' ? 1 : 0)), Array.from(routes, (x) => (x === 'vs' ? 1 : 0)))) {
        lines.push(`routes ${plan.routes.join(',')}, expected ${routes.join(',')} (tauProxy ${tauProxy}${residual ? `, residual τ ${residual.tau}` : ''})`);
      }
      if (residual?.split && !routes.some((x, h) => x === 'pe' && stats.cStruct[h] >= tauProxy)) {
        lines.push(`residual τ ${residual.tau} sent no head to PE by its residual alone`);
      }
      const hostLists = (excess: number | undefined) =>
        selectVsLists(stats, routes, noiseFloor({ alpha: rule.alpha, kMin: 2 * B }), peK, {
          withVs: guarded,
          selector: peRule ? noiseFloor({ alpha: peRule.alpha, kMin: peRule.kMin }) : undefined,
          excess,
          fullAnchor: narrow?.peVsFullAnchor,
        });
      let want = hostLists(narrow?.peVsExcess);
      if (narrow) {
        // a narrowed block whose p_v lies within the planner's (relative) margin of κ ā may
        // fall either way: the device's lists lie between the host's at κ (1 + margin) and
        // κ (1 − margin), and the rest of the check runs on them
        const off = narrowedWithin(plan.vs, hostLists(narrow.peVsExcess * (1 + margin)), hostLists(narrow.peVsExcess * (1 - margin)), H);
        if (off) lines.push(off);
        else want = plan.vs;
      }
      if (narrow && residual?.split && !routes.some((x, h) => x === 'pe' && stats.cStruct[h] >= narrow.peVsFullAnchor.below)) {
        lines.push(`the band [0, ${narrow.peVsFullAnchor.below}) of C_struct left no PE head to narrow`);
      }
      const peHeads = routes.flatMap((x, h) => (x === 'pe' ? [h] : []));
      // (guarded: the residual test may send every head cStruct keeps to PE where it has no
      // split, e.g. with Nb = 3, where the one residual block gives every head distance 0)
      const mixed = residual ? residual.split : split;
      if (mixed && (!peHeads.length || peHeads.length === H)) {
        lines.push(`tauProxy ${tauProxy}${residual ? ` and residual τ ${residual.tau}` : ''} gave one route to every head (C_struct has ${distinct} distinct values)`);
      }
      await checkAgainstHostParts(be, d, dtype, { heads: H, numBlocks: Nb, blockSize: B, gamma, peHeads, want }, plan, res.prepared, queued, outs, lines);
    } finally {
      res.prepared.release();
      for (const t of [...outs, ...Object.values(d)]) t.dispose();
    }
    return outcome(lines.length ? 1 : 0, 0, lines);
  });
  return { ...c, needs: { ...c.needs, deviceSelector: 'noiseFloor', deviceRouter: guarded ? 'anyPe' : 'cStruct', ...(narrowed ? { narrowedPeLists: true } : {}) } };
}

/**
 * undefined when every head's vertical list in `got` holds `lo`'s and lies within `hi`'s and
 * its slash list equals theirs (narrowing takes vertical blocks only); else what differs.
 */
function narrowedWithin(got: VsLists, lo: VsLists, hi: VsLists, H: number): string | undefined {
  for (let h = 0; h < H; h++) {
    const g = vsHead(got, h);
    const a = vsHead(lo, h);
    const b = vsHead(hi, h);
    const has = new Set(g.vertical);
    const inHi = new Set(b.vertical);
    const missing = Array.from(a.vertical).filter((J) => !has.has(J));
    const extra = Array.from(g.vertical).filter((J) => !inHi.has(J));
    if (missing.length || extra.length) return `head ${h}: vertical list [${Array.from(g.vertical).join(',')}] lacks [${missing.join(',')}] or holds [${extra.join(',')}] beyond the narrowing's margin`;
    if (!bitEqual(g.slash, a.slash)) return `head ${h}: slash list [${Array.from(g.slash).join(',')}], expected [${Array.from(a.slash).join(',')}]`;
  }
  return undefined;
}

/** [0, a midpoint between the two smallest distinct C_struct values) (all heads' when they are equal). */
function lowestBand(st: ProxyStats): { from: number; below: number } {
  const c = [...new Set(Array.from(st.cStruct))].sort((a, b) => a - b);
  return { from: 0, below: c.length > 1 ? (c[0] + c[1]) / 2 : Math.min(1, c[0] + 1e-6) };
}

type Geometry = { readonly heads: number; readonly numBlocks: number; readonly blockSize: number };

/**
 * The attention queued on a device plan's prepared mask before anything is read back, as
 * sparsePrefill does, into a poisoned output (added to `outs`); checked afterwards against the
 * same mask from the host parts (checkAgainstHostParts).
 */
export async function queueOnUnreadPlan(
  be: Backend,
  d: { readonly q: DeviceTensor; readonly k: DeviceTensor; readonly v: DeviceTensor },
  dtype: DType,
  g: Geometry,
  prepared: PreparedMask,
  outs: DeviceTensor[],
): Promise<DeviceTensor> {
  const none: number[][] = Array.from({ length: g.heads }, () => []);
  const out = poisoned(be, dtype, d.q.shape);
  outs.push(out);
  return (await be.sparseAttention(d.q, d.k, d.v, { ...g, vs: vsListsFromArrays(none, none) }, { prepared, out })).output;
}

/**
 * The rest of a device plan's check, given the host's lists `want` on the plan's routes (PE
 * heads `peHeads`): the plan's VS lists equal `want`, the PE rows the backend's own
 * peBlockRows, the prepared mask's block counts the union's, and the attention queued on the
 * unread plan (`queued`) the attention on the host mask, bit for bit (the same kernel on the
 * same blocks). Failures go to `lines` (`context` after a list's), the outputs it makes to `outs`.
 */
export async function checkAgainstHostParts(
  be: Backend,
  d: { readonly q: DeviceTensor; readonly k: DeviceTensor; readonly v: DeviceTensor },
  dtype: DType,
  p: Geometry & { readonly gamma: number; readonly peHeads: number[]; readonly want: VsLists; readonly context?: string },
  plan: DevicePlanOutcome,
  prepared: PreparedMask,
  queued: DeviceTensor,
  outs: DeviceTensor[],
  lines: string[],
): Promise<void> {
  const { heads: H, numBlocks: Nb, blockSize: B, peHeads, want } = p;
  for (const key of ['verticalPtr', 'vertical', 'slashPtr', 'slash'] as const) {
    if (!bitEqual(plan.vs[key], want[key])) {
      lines.push(`${key} differs from the host selector's${p.context ? ` (${p.context})` : ''}: got [${plan.vs[key].slice(0, 12).join(',')}...], expected [${want[key].slice(0, 12).join(',')}...]`);
    }
  }
  const wantRows = peHeads.length > 0 ? await be.peBlockRows(d.q, d.k, { blockSize: B, gamma: p.gamma, heads: peHeads }) : undefined;
  const gotRows = plan.peRows ? await plan.peRows() : undefined;
  if (Boolean(gotRows) !== Boolean(wantRows)) lines.push(`PE rows ${gotRows ? 'returned' : 'missing'} for PE heads [${peHeads.join(',')}]`);
  else if (gotRows && wantRows && !(bitEqual(gotRows.rowPtr, wantRows.rowPtr) && bitEqual(gotRows.cols, wantRows.cols))) {
    lines.push(`PE rows differ from peBlockRows for heads [${peHeads.join(',')}]`);
  }
  const rows = wantRows ? { rowPtr: spreadRowPtr(wantRows.rowPtr, peHeads, H, Nb), cols: wantRows.cols } : undefined;
  const counts = selectedBlockCounts({ heads: H, numBlocks: Nb, blockSize: B, vs: want, rows });
  const gotCounts = await prepared.readBlockCounts();
  if (!bitEqual(gotCounts, counts)) lines.push(`block counts ${gotCounts.join(',')} differ from the host's ${counts.join(',')}`);
  const hOut = poisoned(be, dtype, d.q.shape);
  outs.push(hOut);
  const host = await be.sparseAttention(d.q, d.k, d.v, { heads: H, numBlocks: Nb, blockSize: B, vs: want, rows }, { out: hOut });
  const [a, b] = [toFloat32(await be.download(queued)), toFloat32(await be.download(host.output))];
  if (!bitEqual(a, b)) lines.push('the attention run on the unread device plan differs from the run on the host mask');
}

/**
 * A residual τ for the guarded case: between the two middle distinct residual distances of
 * the heads cStruct sends to VS (each more than the planner's margin away), so both residual
 * routes occur among them; `split` false when fewer than two such heads differ.
 */
function splitResidual(stats: ProxyStats, tauProxy: number, margin: number): { tau: number; split: boolean } {
  const Nb = stats.numBlocks;
  const ds: number[] = [];
  for (let h = 0; h < stats.heads; h++) {
    if (!(stats.cStruct[h] >= tauProxy)) continue;
    const r = residualDistance(headSlice(stats.verticalBlocks, h, Nb), headSlice(stats.pooledEstimate, h, Nb));
    if (r.residual > 0) ds.push(r.distance);
  }
  const distinct = [...new Set(ds)].sort((a, b) => a - b);
  for (let m = Math.floor(distinct.length / 2); m >= 1; m--) {
    if (distinct[m] - distinct[m - 1] > 4 * margin && distinct[m] < 0.8) return { tau: (distinct[m - 1] + distinct[m]) / 2, split: true };
  }
  return { tau: 0.1, split: false };
}

/** anyPe(cStruct τ, residualJsd τr, minResidual 0), by the rules' definitions. */
function guardedRoutes(stats: ProxyStats, tauProxy: number, tau: number): Route[] {
  const Nb = stats.numBlocks;
  return Array.from({ length: stats.heads }, (_, h): Route => {
    if (!(stats.cStruct[h] >= tauProxy)) return 'pe';
    const r = residualDistance(headSlice(stats.verticalBlocks, h, Nb), headSlice(stats.pooledEstimate, h, Nb));
    return r.residual >= 0 && r.distance < tau ? 'pe' : 'vs';
  });
}
