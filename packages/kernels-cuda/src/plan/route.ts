/**
 * Routing on the device (kernels/route/route.cu): the rule's two tests (core's
 * deviceRouteTerms), the residual one's per-head verdicts, and the routes read back for the
 * device plan's fallback, so that each rule has one device implementation beside
 * @crisp/router's host one.
 */
import {
  type DeviceRouteTerms,
  checkDeviceRouterRule,
  type DeviceRouterRule,
  deviceRouteTerms,
  type ProxyStats,
  type Route,
  UnsupportedError,
} from '@crisp/core';
import { uploadTemp } from '../ops/expand.js';
import { blockStatsOnDevice } from '../ops/select.js';
import type { CudaContext } from '../runtime/context.js';
import type { KeptStats } from '../runtime/kept-stats.js';
import { D64, I, P } from '../runtime/launcher.js';
import type { DeviceBlock } from '../runtime/pool.js';

/** The request's rule as route.cu's two tests; typed errors for a rule it cannot run. */
export function checkedTerms(route: DeviceRouterRule | undefined): DeviceRouteTerms {
  const kinds = new Set(['cStruct', 'residualJsd', 'jsd', 'anyPe']);
  const known = (r: DeviceRouterRule | undefined): boolean =>
    r !== undefined && r !== null && kinds.has(r.kind) && (r.kind !== 'anyPe' || (Array.isArray(r.rules) && r.rules.every(known)));
  if (!known(route)) {
    throw new UnsupportedError(`device routing runs the cStruct, residualJsd and jsd rules and anyPe of them; got ${describe(route)}`, { limit: 'deviceRouter' });
  }
  const terms = deviceRouteTerms(route!);
  if (!terms) throw new UnsupportedError('device routing runs at most one residualJsd or jsd rule in an anyPe', { limit: 'deviceRouter' });
  // the parameters' ranges, as for a policy's device form
  checkDeviceRouterRule(route, 'the device routing rule');
  return terms;
}

function describe(route: DeviceRouterRule | undefined): string {
  return route && typeof route === 'object' ? String((route as { kind?: unknown }).kind) : String(route);
}

/**
 * route_residual's verdicts [H] int (1: the distance test sends the head to PE), queued on
 * the current stream into a block of `temp`; 0 (no verdicts) when the terms have no distance
 * test. `keptBlock`: the statistics' device buffer ([non-finite count][C_struct H][entropy H]
 * [p_v H·Nb][p_s H·Nb][pooled H·Nb] f64), else p_v and the pooled estimate are uploaded from
 * the object.
 */
export function residualFlags(cx: CudaContext, stats: ProxyStats, keptBlock: number | undefined, terms: DeviceRouteTerms, temp: DeviceBlock[]): number {
  const test = terms.residual ?? (terms.jsd ? { tau: terms.jsd.tau, minResidual: 0 } : undefined);
  if (!test) return 0;
  const { heads: H, numBlocks: Nb } = stats;
  const [pv, pooled] = blockStatsOnDevice(cx, keptBlock, stats, ['verticalBlocks', 'pooledEstimate'], temp);
  const out = cx.scratch(H * 4);
  temp.push(out);
  const full = terms.residual ? 0 : 1;
  cx.launch('route/route.cu', 'route_residual', [H], 256, 0, [P(pv), P(pooled), I(H), I(Nb), D64(test.tau), D64(test.minResidual), P(out.ptr), I(full)]);
  return out.ptr;
}

/**
 * Each head's route by route_cstruct (mode 1: routes only; with route_residual's verdicts
 * when the rule has a residual test) over the statistics where proxyStats left them
 * (uploaded otherwise), read synchronously. The caller has joined the statistics' third
 * stream (KeptStats.releaseHeld), so they are complete on the main stream.
 */
export function routesOnDevice(cx: CudaContext, store: KeptStats, stats: ProxyStats, terms: DeviceRouteTerms): Route[] {
  const H = stats.heads;
  const kept = store.get(stats);
  const temp: DeviceBlock[] = [];
  try {
    // [non-finite count][C_struct H] (route.cu reads C_struct at stats + 1)
    const st = kept ? kept.block.ptr : uploadTemp(cx, Float64Array.from([0, ...stats.cStruct]), temp);
    const flags = residualFlags(cx, stats, kept?.block.ptr, terms, temp);
    // routes [H] then the PE head list [count][heads]
    const out = cx.scratch((2 * H + 1) * 4);
    temp.push(out);
    cx.launch('route/route.cu', 'route_cstruct', [1], 32, 0, [P(st), I(H), D64(terms.tauProxy), P(0), P(out.ptr), I(1), P(flags)]);
    return Array.from(cx.read(out.ptr, new Int32Array(H)), (x): Route => (x === 1 ? 'vs' : 'pe'));
  } finally {
    cx.releaseBlocks(temp);
  }
}
