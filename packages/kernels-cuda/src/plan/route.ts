/**
 * Routing read back to the host through the device form of the router (kernels/route/route.cu):
 * for the device plan's fallback, so that the C_struct rule has one device implementation
 * beside @crisp/router's host one.
 */
import type { ProxyStats, Route } from '@crisp/core';
import type { CudaContext } from '../runtime/context.js';
import type { KeptStats } from '../runtime/kept-stats.js';
import { D64, I, P } from '../runtime/launcher.js';
import type { DeviceBlock } from '../runtime/pool.js';

/**
 * Each head's route by route_cstruct (mode 1: routes only) over C_struct where proxyStats left
 * it (uploaded otherwise), read synchronously. The caller has joined the statistics' third
 * stream (KeptStats.releaseHeld), so their C_struct is complete on the main stream.
 */
export function routesOnDevice(cx: CudaContext, store: KeptStats, stats: ProxyStats, tauProxy: number): Route[] {
  const H = stats.heads;
  const kept = store.get(stats);
  const temp: DeviceBlock[] = [];
  try {
    // [non-finite count][C_struct H] (route.cu reads C_struct at stats + 1)
    let st: number;
    if (kept) st = kept.block.ptr;
    else {
      const up = cx.uploadArray(Float64Array.from([0, ...stats.cStruct]));
      temp.push(up);
      st = up.ptr;
    }
    // routes [H] then the PE head list [count][heads]
    const out = cx.scratch((2 * H + 1) * 4);
    temp.push(out);
    cx.launch('route/route.cu', 'route_cstruct', [1], 32, 0, [P(st), I(H), D64(tauProxy), P(0), P(out.ptr), I(1)]);
    return Array.from(cx.read(out.ptr, new Int32Array(H)), (x): Route => (x === 1 ? 'vs' : 'pe'));
  } finally {
    cx.releaseBlocks(temp);
  }
}
