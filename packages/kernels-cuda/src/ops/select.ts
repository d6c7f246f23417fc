/**
 * VS selection on the device (kernels/select/select.cu): the noise-floor rule, or FlexPrefill's
 * cumulative coverage (the token scores' count, then the best blocks), over the statistics'
 * scores where proxyStats left them, packed into lists the host reads once.
 */
import { checkDeviceSelectorRule, checkPeVsNarrowing, InvalidArgumentError, type ProxyStats, type Route, UnsupportedError, type VsLists } from '@crisp/core';
import type { CudaContext } from '../runtime/context.js';
import type { KeptStats } from '../runtime/kept-stats.js';
import { D64, I, P, U64 } from '../runtime/launcher.js';
import type { DeviceBlock } from '../runtime/pool.js';
import { uploadTemp } from './expand.js';
import type { DeviceVsRequest } from './mask-types.js';

/** The block statistics in a kept statistics buffer, in its order after [non-finite count][C_struct H][entropy H] (f64). */
const BLOCK_FIELDS = ['verticalBlocks', 'slashBlocks', 'pooledEstimate'] as const;
/** select.cu's COV_CL: the CTAs of coverage_select_c8's cluster (one direction and head) */
const COVERAGE_CLUSTER = 8;

/**
 * Device pointers to `fields` of the statistics ([H·Nb] f64 each): in `keptBlock`, the buffer
 * proxyStats left them in, when given, else uploaded from the object into a block of `temp`.
 */
export function blockStatsOnDevice(
  cx: CudaContext,
  keptBlock: number | undefined,
  stats: ProxyStats,
  fields: readonly (typeof BLOCK_FIELDS)[number][],
  temp: DeviceBlock[],
): number[] {
  const HNb = stats.heads * stats.numBlocks;
  if (keptBlock !== undefined) {
    // after the non-finite count, C_struct and the entropies
    const first = keptBlock + 8 + 2 * stats.heads * 8;
    return fields.map((f) => first + BLOCK_FIELDS.indexOf(f) * HNb * 8);
  }
  const all = new Float64Array(fields.length * HNb);
  for (const [i, f] of fields.entries()) all.set(stats[f].subarray(0, HNb), i * HNb);
  const ptr = uploadTemp(cx, all, temp);
  return fields.map((_, i) => ptr + i * HNb * 8);
}

/**
 * Device pointers to the statistics' token scores [a_v, a_s] ([H·n] f32 each): where proxyStats
 * kept them (deferRead statistics with token scores), else uploaded from the object into
 * blocks of `temp`.
 */
function tokensOnDevice(cx: CudaContext, store: KeptStats, stats: ProxyStats, temp: DeviceBlock[]): [number, number] {
  const kept = store.get(stats)?.tokens;
  if (kept) return [kept[0].ptr, kept[1].ptr];
  const HN = stats.heads * stats.n;
  const v = stats.verticalTokens;
  const s = stats.slashTokens;
  if (!(v instanceof Float32Array && s instanceof Float32Array && v.length === HN && s.length === HN)) {
    throw new InvalidArgumentError('cumulativeCoverage on the device reads the token scores: ask proxyStats for them (tokenScores: true)');
  }
  return [uploadTemp(cx, v, temp), uploadTemp(cx, s, temp)];
}

/** selectOnDevice's lists on the device: their pointers, their buffer, and their read. */
export interface DeviceVsSelection {
  readonly ptrs: readonly [number, number, number, number];
  readonly buf: DeviceBlock;
  readonly read: (after?: unknown) => { lists: () => VsLists; prefix: ArrayBuffer };
}

/**
 * VS selection on the device (kernels/select.cu) for a DeviceVsRequest: the block scores
 * of the statistics proxyStats last returned are still on the device (other statistics
 * are uploaded). Queues vs_select and vs_pack; returns the lists' device pointers
 * [verticalPtr, vertical, slashPtr, slash] and `read()`, which copies them to the host on
 * the copy stream once the kernels are known to be done. `prefix` (a device plan): that
 * many bytes (a multiple of 8) before the list pointers in the same buffer, handed to
 * `prefix.fill`, which queues what writes them before vs_select and returns where in them
 * the routes are ([H] int, 1 = VS: route.cu's; req.routes is then not read); they come
 * back with the pointers, in one copy.
 */
export function selectOnDevice(
  cx: CudaContext,
  store: KeptStats,
  req: Omit<DeviceVsRequest, 'routes'> & { readonly routes?: readonly Route[] },
  H: number,
  Nb: number,
  B: number,
  temp: DeviceBlock[],
  prefix?: { readonly bytes: number; readonly fill: (ptr: number) => number },
): DeviceVsSelection {
  const { rule, stats, routes, peK, peWithVs, peVs, peVsExcess, peVsFullAnchor } = req;
  if (rule?.kind !== 'noiseFloor' && rule?.kind !== 'cumulativeCoverage') {
    throw new UnsupportedError(`device selection supports the noiseFloor and cumulativeCoverage rules; got ${(rule as { kind?: unknown } | undefined)?.kind}`, {
      limit: 'deviceSelector',
    });
  }
  // the parameters' ranges, as for a policy's device form (the coverage's γ <= 0.99: where
  // select.cu's count is exact), and whole blocks of kMin
  checkDeviceSelectorRule(rule, 'the device selection rule');
  if (rule.kMin % B !== 0) throw new InvalidArgumentError(`${rule.kind} kMin must be a positive multiple of the block size ${B}; got ${rule.kMin}`);
  if (!(Number.isInteger(peK) && peK >= 0)) throw new InvalidArgumentError(`peK must be a non-negative integer; got ${peK}`);
  if (!stats || stats.heads !== H || stats.numBlocks !== Nb || stats.blockSize !== B) {
    throw new InvalidArgumentError(`device selection: the statistics are for H=${stats?.heads}, Nb=${stats?.numBlocks}, B=${stats?.blockSize}; the mask for H=${H}, Nb=${Nb}, B=${B}`);
  }
  if (!prefix && (!routes || routes.length !== H || routes.some((r) => r !== 'vs' && r !== 'pe'))) {
    throw new InvalidArgumentError(`device selection needs ${H} routes ('vs' or 'pe')`);
  }
  if (peVs !== undefined) {
    checkDeviceSelectorRule(peVs, 'the PE lists\' device selection rule (peVs)');
    if (rule.kind !== 'noiseFloor' || peVs.kind !== 'noiseFloor' || peVs.kMin !== rule.kMin || peWithVs !== true) {
      throw new InvalidArgumentError(
        `device selection: peVs needs peWithVs and a noise floor beside a noise-floor rule with the same kMin; got ${peVs.kind} (kMin ${peVs.kMin}) beside ${rule.kind} (kMin ${rule.kMin}), peWithVs ${peWithVs}`,
      );
    }
  }
  const narrow = peVsExcess !== undefined;
  checkPeVsNarrowing(peVsExcess, peVsFullAnchor, 'device selection: ');
  if (narrow && (rule.kind !== 'noiseFloor' || peWithVs !== true)) {
    throw new InvalidArgumentError(`device selection: peVsExcess needs the noiseFloor rule and peWithVs; got ${rule.kind}, peWithVs ${peWithVs}`);
  }
  const HNb = H * Nb;
  const kept = store.get(stats)?.block.ptr;
  const [pv, ps, pooled] = blockStatsOnDevice(cx, kept, stats, narrow ? ['verticalBlocks', 'slashBlocks', 'pooledEstimate'] : ['verticalBlocks', 'slashBlocks'], temp);
  // C_struct [H] f64: after the non-finite count in the kept buffer, else uploaded
  const cs = !narrow ? 0 : kept !== undefined ? kept + 8 : uploadTemp(cx, Float64Array.from(stats.cStruct.subarray(0, H)), temp);
  // each block to `temp` as it is taken (the caller releases them, also after a failure here)
  const take = (bytes: number): DeviceBlock => {
    const x = cx.scratch(bytes);
    temp.push(x);
    return x;
  };
  const lists = take(2 * HNb * 4);
  const counts = take(2 * H * 4);
  const pb = prefix?.bytes ?? 0;
  const buf = take(pb + (2 * (H + 1) + 2 * HNb) * 4);
  // the token scores a_v, a_s [H·n] f32 each (cumulativeCoverage): where proxyStats kept them
  // (deferRead), else uploaded from the object; found before prefix.fill launches the routes,
  // so statistics without them are refused before any launch
  const tokens = rule.kind === 'cumulativeCoverage' ? tokensOnDevice(cx, store, stats, temp) : undefined;
  const rt = prefix ? prefix.fill(buf.ptr) : uploadTemp(cx, Int32Array.from(routes ?? [], (r) => (r === 'vs' ? 1 : 0)), temp);
  if (rule.kind === 'noiseFloor') {
    cx.launch('select/select.cu', 'vs_select', [2, H], 256, Math.ceil(Nb / 32) * 4, [
      P(pv),
      P(ps),
      P(rt),
      I(H),
      I(Nb),
      D64(rule.alpha),
      D64(peVs?.kind === 'noiseFloor' ? peVs.alpha : rule.alpha),
      I(rule.kMin / B),
      I(peK),
      P(lists.ptr),
      P(counts.ptr),
      I(peWithVs === true ? 1 : 0),
      P(narrow ? pooled : 0),
      P(cs),
      D64(narrow ? peVsExcess : 0),
      D64(peVsFullAnchor?.from ?? 0),
      D64(peVsFullAnchor?.below ?? 0),
    ]);
  } else {
    // T = floor(γ · 2^52): the running sums are integers in units of 2^-52 there (exact below 2^53)
    const T = Math.floor(rule.gamma * 2 ** 52);
    // sm_90 and later: a cluster of COVERAGE_CLUSTER CTAs counts each direction and head
    const cluster = cx.arch >= 90 ? COVERAGE_CLUSTER : 1;
    cx.launch('select/select.cu', cluster > 1 ? 'coverage_select_c8' : 'coverage_select', [2, H, cluster], 256, Math.ceil(Nb / 32) * 4, [
      P(pv),
      P(ps),
      P(tokens![0]),
      P(tokens![1]),
      P(rt),
      I(H),
      I(Nb),
      I(stats.n),
      I(B),
      U64(T),
      I(rule.kMin / B),
      I(peK),
      P(lists.ptr),
      P(counts.ptr),
      I(peWithVs === true ? 1 : 0),
    ]);
  }
  const vPtr = buf.ptr + pb;
  cx.launch('select/select.cu', 'vs_pack', [2, H], 256, 0, [P(lists.ptr), P(counts.ptr), I(H), I(Nb), P(vPtr)]);
  const sPtr = vPtr + (H + 1) * 4;
  const vert = vPtr + 2 * (H + 1) * 4;
  const slash = vert + HNb * 4;
  // the prefix and the list pointers in one copy; the lists when asked (buf must live)
  // `after`: an event behind the lists' kernels, for a caller that has not waited for them
  const read = (after?: unknown) => {
    const head = cx.streams.readOnCopyStream(buf.ptr, new Int32Array(pb / 4 + 2 * (H + 1)), after);
    const ptrs = head.subarray(pb / 4);
    const verticalPtr = ptrs.slice(0, H + 1);
    const slashPtr = ptrs.slice(H + 1);
    // the copy stream already waited for `after`
    const lists = (): VsLists => ({
      verticalPtr,
      vertical: cx.streams.readOnCopyStream(vert, new Int32Array(verticalPtr[H])),
      slashPtr,
      slash: cx.streams.readOnCopyStream(slash, new Int32Array(slashPtr[H])),
    });
    return { lists, prefix: head.buffer.slice(0, pb) };
  };
  return { ptrs: [vPtr, vert, sPtr, slash], buf, read };
}
