/**
 * Context-parallel CRISP prefill of one layer: the sequence sharded over P ranks (zig-zag,
 * layout.ts), each rank holding the q, k and v rows of its shard on the host.
 *
 *   gather proxy rows, partial statistics, block means ─► the same plan on every rank
 *   (checked: every rank's plan digest must agree) ─► all-to-all of the selected K/V blocks
 *   ─► each range of the shard attended as a chunk over the keys before it (chunked prefill)
 *
 * A rank's output rows equal the rows a single backend's `sparsePrefill` gives for the same
 * plan: the mask is the same and every row reads the same key blocks.
 */
import {
  type AttentionShape,
  type Backend,
  type BlockMask,
  CrispError,
  DEFAULTS,
  defaultScale,
  type DeviceTensor,
  type HostTensor,
  InvalidArgumentError,
  type Policy,
  type PrefillPlan,
  ShapeError,
  assertBackend,
  assertCallOptions,
  attentionShape,
  bytesPerElement,
  planFromStatistics,
  validatePolicy,
  validatePolicyBlocks,
} from '@crisp/core';
import { assertCommunicator, bytesOf, type Communicator, gatherStep, i32Of } from './communicator.js';
import { denseRingBytes, exchangeKv } from './exchange.js';
import { assertLayout, type ShardLayout, shardRows, storageLike } from './layout.js';
import { ShardStatistics, shardData } from './shard-stats.js';

/** One rank's shard: its rows of q [rows, H, d], k and v [rows, Hkv, d], in position order. */
export interface ShardInputs {
  readonly q: HostTensor;
  readonly k: HostTensor;
  readonly v: HostTensor;
}

export interface ParallelPrefillOptions {
  /** softmax scale, default 1/sqrt(d) */
  readonly scale?: number;
  /** length gate in keys: below it the layer runs dense (default 0: sparse whenever FlexPrefill's minimum-length rule allows) */
  readonly minSparseLength?: number;
}

export interface ParallelTraffic {
  /** K/V bytes this rank received for its attention */
  readonly kvBytesReceived: number;
  /** K/V bytes it sent */
  readonly kvBytesSent: number;
  /** bytes it received while planning (proxy rows, partial statistics, block means, the plan check) */
  readonly planBytesReceived: number;
  /** what a dense ring would move in all for the same layer (every shard to every other rank) */
  readonly denseRingBytes: number;
}

export interface ParallelPrefillResult {
  /** this rank's output rows [rows, H, d], in shard order, q's dtype */
  readonly output: HostTensor;
  /** the plan, the same on every rank */
  readonly plan: PrefillPlan;
  readonly traffic: ParallelTraffic;
  /** wall milliseconds on this rank: planning, the K/V exchange, the attention */
  readonly timings: { readonly planMs: number; readonly exchangeMs: number; readonly attentionMs: number };
}

/**
 * Check this rank's arguments (layout, shard, policy, options) and describe them, for the
 * ranks to compare: `shape` must agree (else SHAPE_MISMATCH), `same` (the layout, the
 * policy's data, the options) too (else INVALID_ARGUMENT). Every check a rank could fail
 * alone runs here, inside the first collective, so no rank gives up while others wait.
 */
function describeShard(layout: ShardLayout, rank: number, backend: Backend, local: ShardInputs, policy: Policy, opts: ParallelPrefillOptions): string {
  assertLayout(layout, 'parallelPrefill');
  assertCallOptions(opts, 'parallelPrefill', ['scale', 'minSparseLength']);
  validatePolicy(policy);
  if (!local || typeof local !== 'object') throw new InvalidArgumentError('parallelPrefill needs { q, k, v } host tensors of this rank\'s rows');
  const rows = shardRows(layout, rank);
  const shape = attentionShape(local.q, local.k, local.v);
  if (shape.queries !== rows || shape.keys !== rows) {
    throw new ShapeError(`rank ${rank} holds ${rows} rows under the layout; its q has ${shape.queries} and k ${shape.keys}`, { rank });
  }
  const B = policy?.blockSize ?? DEFAULTS.blockSize;
  if (B !== layout.blockSize) {
    throw new InvalidArgumentError(`the layout cuts blocks of ${layout.blockSize} rows, policy ${policy?.name} plans blocks of ${B}; make them agree`);
  }
  validatePolicyBlocks(policy, B);
  if (layout.ranges[rank].some((r) => r.start > 0) && !backend.capabilities.chunkedPrefill) {
    throw new InvalidArgumentError(`backend ${backend.name} has no chunked prefill, which a rank's later ranges need`);
  }
  return shardHeader(layout, shape, policy, opts);
}

/** The shard check's message: the rank's shape, and the layout, policy data and options every rank must share. */
function shardHeader(layout: ShardLayout, shape: AttentionShape, policy: Policy, opts: ParallelPrefillOptions): string {
  const same = {
    layout: [layout.n, layout.size, layout.blockSize, layout.ranges],
    // the policy's data (its functions cannot be compared; its name, numbers and device rules can)
    policy: JSON.stringify({ ...policy, router: policy.router?.device ?? policy.router?.name, vs: policy.vs?.device ?? policy.vs?.name, pe: policy.pe?.name }),
    scale: opts.scale ?? null,
    minSparseLength: opts.minSparseLength ?? null,
  };
  return JSON.stringify({ shape: [shape.heads, shape.kvHeads, shape.headDim, shape.dtype], same });
}

/**
 * Bytes of the first message each rank sends (the shard check) for this layer, layout,
 * policy and options: for traffic models that count parallelPrefill's messages without
 * running it.
 */
export function shardHeaderBytes(layout: ShardLayout, shape: AttentionShape, policy: Policy, opts: ParallelPrefillOptions = {}): number {
  return new TextEncoder().encode(shardHeader(layout, shape, policy, opts)).length;
}

/** FNV-1a over the plan's routes and mask: ranks that made the same plan agree on it. */
function planDigest(plan: PrefillPlan): Int32Array {
  let h = 0x811c9dc5;
  const mix = (x: number) => {
    h ^= x & 0xffff;
    h = Math.imul(h, 0x01000193);
    h ^= x >>> 16;
    h = Math.imul(h, 0x01000193);
  };
  for (const r of plan.routing?.routes ?? []) mix(r === 'vs' ? 1 : 2);
  const m = plan.mask;
  for (const a of [m?.vs?.verticalPtr, m?.vs?.vertical, m?.vs?.slashPtr, m?.vs?.slash, m?.rows?.rowPtr, m?.rows?.cols]) {
    mix(a?.length ?? -1);
    if (a) for (let i = 0; i < a.length; i++) mix(a[i]);
  }
  return Int32Array.of(h, plan.denseReason ? 1 : 0);
}

/** The mask of the first `Nb` blocks: what a chunk ending at block Nb reads. */
export function prefixMask(mask: BlockMask, Nb: number): BlockMask {
  if (Nb === mask.numBlocks) return mask;
  const keep = (ptr: Int32Array, list: Int32Array) => {
    const outPtr = new Int32Array(ptr.length);
    const out: number[] = [];
    for (let h = 0; h + 1 < ptr.length; h++) {
      for (let p = ptr[h]; p < ptr[h + 1]; p++) if (list[p] < Nb) out.push(list[p]);
      outPtr[h + 1] = out.length;
    }
    return { ptr: outPtr, list: Int32Array.from(out) };
  };
  let vs: BlockMask['vs'];
  if (mask.vs) {
    const v = keep(mask.vs.verticalPtr, mask.vs.vertical);
    const s = keep(mask.vs.slashPtr, mask.vs.slash);
    vs = { verticalPtr: v.ptr, vertical: v.list, slashPtr: s.ptr, slash: s.list };
  }
  let rows: BlockMask['rows'];
  if (mask.rows) {
    const { rowPtr, cols } = mask.rows;
    const ptr = new Int32Array(mask.heads * Nb + 1);
    const out: number[] = [];
    for (let h = 0; h < mask.heads; h++) {
      for (let I = 0; I < Nb; I++) {
        for (let p = rowPtr[h * mask.numBlocks + I]; p < rowPtr[h * mask.numBlocks + I + 1]; p++) out.push(cols[p]);
        ptr[h * Nb + I + 1] = out.length;
      }
    }
    rows = { rowPtr: ptr, cols: Int32Array.from(out) };
  }
  return { heads: mask.heads, numBlocks: Nb, blockSize: mask.blockSize, ...(vs ? { vs } : {}), ...(rows ? { rows } : {}) };
}

/** Rows [start, start + len) of a [rows, ...] host tensor (a view). */
function rowsOf(t: HostTensor, start: number, len: number): HostTensor {
  const per = t.shape[1] * t.shape[2];
  return { dtype: t.dtype, shape: [len, t.shape[1], t.shape[2]], data: t.data.subarray(start * per, (start + len) * per) };
}

/**
 * Plan and run one layer's attention with the sequence sharded over the communicator's ranks.
 * Every rank calls it with its own shard, the same layout, policy and options; `backend`
 * runs this rank's attention. A rank whose input is wrong makes every rank reject with the
 * same error code (the others name it), so no rank waits on a peer that has given up.
 */
export async function parallelPrefill(
  comm: Communicator,
  backend: Backend,
  layout: ShardLayout,
  local: ShardInputs,
  policy: Policy,
  opts: ParallelPrefillOptions = {},
): Promise<ParallelPrefillResult> {
  assertCommunicator(comm, 'parallelPrefill');
  const t0 = performance.now();
  const rank = comm.rank;
  const before = comm.traffic.bytesReceived;
  const headers = await gatherStep(comm, 'checking the shards', () => {
    assertBackend(backend, 'parallelPrefill');
    if (!layout || layout.size !== comm.size) throw new InvalidArgumentError(`parallelPrefill: the layout is for ${layout?.size} ranks, the communicator joins ${comm.size}`);
    return new TextEncoder().encode(describeShard(layout, rank, backend, local, policy, opts));
  });
  const described = headers.map((h) => JSON.parse(new TextDecoder().decode(h)) as { shape: [number, number, number, AttentionShape['dtype']]; same: Record<string, unknown> });
  described.forEach((x, r) => {
    if (JSON.stringify(x.shape) !== JSON.stringify(described[0].shape)) {
      throw new ShapeError(`rank ${r}'s shard has [heads, kv heads, head dim, dtype] ${JSON.stringify(x.shape)}, rank 0's ${JSON.stringify(described[0].shape)}`);
    }
    for (const key of Object.keys(x.same)) {
      if (JSON.stringify(x.same[key]) !== JSON.stringify(described[0].same[key])) {
        throw new InvalidArgumentError(`parallelPrefill: rank ${r} was given another ${key} than rank 0; every rank must pass the same layout, policy and options`, { rank: r });
      }
    }
  });
  const [H, Hkv, d, dtype] = described[0].shape;
  const shape: AttentionShape = { queries: layout.n, keys: layout.n, heads: H, kvHeads: Hkv, headDim: d, dtype };
  const scale = opts.scale ?? defaultScale(d);

  let stats: ShardStatistics | undefined;
  const source = {
    name: 'parallelPrefill',
    proxyStats: async (o: Parameters<ShardStatistics['proxyStats']>[0]) => {
      // decoding is local work: a rank with NaN in its shard fails here, and every rank with it
      await gatherStep(comm, 'decoding the shards', () => {
        stats = new ShardStatistics(comm, shardData(layout, rank, local.q, local.k), scale);
        return new Uint8Array(0);
      });
      return stats!.proxyStats(o);
    },
    peBlockRows: (o: Parameters<ShardStatistics['peBlockRows']>[0]) => stats!.peBlockRows(o),
  };
  const plan = await planFromStatistics(source, shape, policy, { scale: opts.scale, minSparseLength: opts.minSparseLength ?? 0 });
  const digests = await gatherStep(comm, 'checking the plan', () => bytesOf(planDigest(plan)));
  const mine = i32Of(digests[rank]);
  digests.forEach((p, r) => {
    const x = i32Of(p);
    if (x[0] !== mine[0] || x[1] !== mine[1]) throw new CrispError('BACKEND_ERROR', `rank ${r} made a different plan than rank ${rank} from the same statistics`, { rank: r });
  });
  const tPlan = performance.now();
  const planBytesReceived = comm.traffic.bytesReceived - before;

  const kv = await exchangeKv(comm, plan, layout, local.k, local.v);
  const tExchange = performance.now();

  const rows = shardRows(layout, rank);
  const outData = storageLike(local.q.data, rows * H * d);
  const made: DeviceTensor[] = [];
  try {
    let at = 0;
    for (const r of layout.ranges[rank]) {
      const len = r.end - r.start;
      const q = backend.upload(rowsOf(local.q, at, len));
      made.push(q);
      const k = backend.upload(rowsOf(kv.k, 0, r.end));
      made.push(k);
      const v = backend.upload(rowsOf(kv.v, 0, r.end));
      made.push(v);
      const Nb = Math.ceil(r.end / layout.blockSize);
      const res = plan.mask
        ? await backend.sparseAttention(q, k, v, prefixMask(plan.mask, Nb), { scale })
        : await backend.denseAttention(q, k, v, { scale });
      made.push(res.output);
      const host = await backend.download(res.output);
      outData.set(host.data, at * H * d);
      at += len;
    }
  } finally {
    for (const t of made) t.dispose();
  }
  const tEnd = performance.now();
  return {
    output: { dtype, shape: [rows, H, d], data: outData },
    plan,
    traffic: {
      kvBytesReceived: kv.bytesReceived,
      kvBytesSent: kv.bytesSent,
      planBytesReceived,
      denseRingBytes: denseRingBytes(layout, Hkv, d, bytesPerElement(dtype)),
    },
    timings: { planMs: tPlan - t0, exchangeMs: tExchange - tPlan, attentionMs: tEnd - tExchange },
  };
}
