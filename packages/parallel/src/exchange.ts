/**
 * Which key/value blocks each rank's queries read, and their exchange. Every rank holds the
 * same plan, so each one knows what every other needs from it: an owner sends each rank the
 * blocks (per kv head) that its query blocks select, in one all-to-all, and nothing else.
 * A dense ring would move every rank's whole K/V shard to every other rank.
 *
 * Shape legend: Hkv kv heads, d head dim, B block size, Nb blocks; blocks are identified per
 * kv head as g·Nb + J.
 */
import { type BlockMask, bytesPerElement, type HostTensor, type PrefillPlan } from '@crisp/core';
import { kvHeadOf } from '@crisp/reference/f64';
import { bytesOf, type Communicator, exchangeStep } from './communicator.js';
import type { ShardLayout } from './layout.js';

/** The query blocks a rank holds, ascending. */
export function ownedBlocks(layout: ShardLayout, rank: number): Int32Array {
  const out: number[] = [];
  for (let J = 0; J < layout.numBlocks; J++) if (layout.owner[J] === rank) out.push(J);
  return Int32Array.from(out);
}

/**
 * [Hkv · Nb] flags: 1 where some query block of `rank` reads key block J of kv head g under
 * the plan (its own blocks included). A dense plan reads every block up to the rank's last.
 */
export function neededBlocks(plan: PrefillPlan, layout: ShardLayout, rank: number): Uint8Array {
  const Nb = layout.numBlocks;
  const { heads: H, kvHeads: Hkv } = plan.shape;
  const need = new Uint8Array(Hkv * Nb);
  const owned = ownedBlocks(layout, rank);
  if (owned.length === 0) return need;
  const last = owned[owned.length - 1];
  const mask = plan.mask;
  if (!mask) {
    for (let g = 0; g < Hkv; g++) need.fill(1, g * Nb, g * Nb + last + 1);
    return need;
  }
  for (let h = 0; h < H; h++) markHead(mask, h, kvHeadOf(h, H, Hkv) * Nb, owned, last, need);
  return need;
}

function markHead(mask: BlockMask, h: number, base: number, owned: Int32Array, last: number, need: Uint8Array): void {
  const Nb = mask.numBlocks;
  if (mask.vs) {
    const { verticalPtr, vertical, slashPtr, slash } = mask.vs;
    // a vertical block J is read by every query block I >= J
    for (let p = verticalPtr[h]; p < verticalPtr[h + 1]; p++) if (vertical[p] <= last) need[base + vertical[p]] = 1;
    // a slash offset O by query block I reads key block I - O
    for (let p = slashPtr[h]; p < slashPtr[h + 1]; p++) {
      const O = slash[p];
      for (const I of owned) if (I >= O) need[base + I - O] = 1;
    }
  }
  if (mask.rows) {
    const { rowPtr, cols } = mask.rows;
    for (const I of owned) for (let p = rowPtr[h * Nb + I]; p < rowPtr[h * Nb + I + 1]; p++) need[base + cols[p]] = 1;
  }
}

/**
 * The (kv head, block) pairs rank `owner` sends to a rank with the needs `need`, as flat
 * [g, J, g, J, ...] in the order they travel (kv head, then block, ascending): the one order
 * the sender packs and the receiver unpacks.
 */
function wireOrder(need: Uint8Array, layout: ShardLayout, owner: number, Hkv: number): Int32Array {
  const Nb = layout.numBlocks;
  const out: number[] = [];
  for (let g = 0; g < Hkv; g++) for (let J = 0; J < Nb; J++) if (need[g * Nb + J] && layout.owner[J] === owner) out.push(g, J);
  return Int32Array.from(out);
}

/** What a rank's attention reads: its keys and values for positions [0, rows), and the traffic. */
export interface GatheredKv {
  /** [rows, Hkv, d] in the shard's dtype: the rank's own rows, the blocks it received, and a poison value elsewhere */
  readonly k: HostTensor;
  readonly v: HostTensor;
  /** K/V bytes this rank received from other ranks */
  readonly bytesReceived: number;
  /** K/V bytes it sent */
  readonly bytesSent: number;
}

/**
 * A value no real key holds, written where a rank has no block: if a plan's attention ever
 * read such a block its logits would swamp the softmax and the output would be visibly wrong,
 * instead of silently attending to zeros.
 */
const POISON = { f32: 0x7149f2ca /* 1e30 */, bf16: 0x7149 /* about 1e30 */, f16: 0x7b53 /* 60000 */ } as const;

/**
 * Exchange the selected K/V blocks (every rank calls it with the same plan) and lay out the
 * keys and values this rank's queries read, positions [0, rows) where rows is one past its
 * last position.
 */
export async function exchangeKv(comm: Communicator, plan: PrefillPlan, layout: ShardLayout, k: HostTensor, v: HostTensor): Promise<GatheredKv> {
  const rank = comm.rank;
  const { numBlocks: Nb, blockSize: B, n } = layout;
  const [, Hkv, d] = k.shape;
  const dtype = k.dtype;
  const elem = bytesPerElement(dtype);
  const needs = Array.from({ length: layout.size }, (_, r) => neededBlocks(plan, layout, r));
  const blockRows = (J: number) => Math.min(B, n - J * B);
  // where each of this rank's blocks starts in its shard
  const localRow = new Int32Array(Nb).fill(-1);
  let row = 0;
  for (const r of layout.ranges[rank]) {
    for (let J = r.start / B; J * B < r.end; J++) localRow[J] = row + (J * B - r.start);
    row += r.end - r.start;
  }
  const kBytes = bytesOf(k.data);
  const vBytes = bytesOf(v.data);
  const rowBytes = d * elem;
  let bytesSent = 0;
  const got = await exchangeStep(comm, 'exchanging the selected K/V blocks', () =>
    needs.map((need, dst) => {
      if (dst === rank) return new Uint8Array(0);
      const sent = wireOrder(need, layout, rank, Hkv);
      let total = 0;
      for (let p = 1; p < sent.length; p += 2) total += 2 * blockRows(sent[p]) * rowBytes;
      const out = new Uint8Array(total);
      let at = 0;
      for (let p = 0; p < sent.length; p += 2) {
        const [g, J] = [sent[p], sent[p + 1]];
        for (const src of [kBytes, vBytes]) {
          for (let i = 0; i < blockRows(J); i++) {
            const o = ((localRow[J] + i) * Hkv + g) * rowBytes;
            out.set(src.subarray(o, o + rowBytes), at);
            at += rowBytes;
          }
        }
      }
      bytesSent += total;
      return out;
    }),
  );
  const owned = ownedBlocks(layout, rank);
  const rows = owned.length === 0 ? 0 : Math.min((owned[owned.length - 1] + 1) * B, n);
  const make = () => (dtype === 'f32' ? new Uint32Array(rows * Hkv * d).fill(POISON.f32) : new Uint16Array(rows * Hkv * d).fill(POISON[dtype]));
  const kOut = make();
  const vOut = make();
  const kOutBytes = bytesOf(kOut);
  const vOutBytes = bytesOf(vOut);
  // own rows
  row = 0;
  for (const r of layout.ranges[rank]) {
    const len = Math.min(r.end, rows) - r.start;
    if (len > 0) {
      kOutBytes.set(kBytes.subarray(row * Hkv * rowBytes, (row + len) * Hkv * rowBytes), r.start * Hkv * rowBytes);
      vOutBytes.set(vBytes.subarray(row * Hkv * rowBytes, (row + len) * Hkv * rowBytes), r.start * Hkv * rowBytes);
    }
    row += r.end - r.start;
  }
  // received blocks, in the order their owner packed them
  const need = needs[rank];
  let bytesReceived = 0;
  got.forEach((part, src) => {
    if (src === rank) return;
    bytesReceived += part.byteLength;
    const sent = wireOrder(need, layout, src, Hkv);
    let at = 0;
    for (let p = 0; p < sent.length; p += 2) {
      const [g, J] = [sent[p], sent[p + 1]];
      for (const dst of [kOutBytes, vOutBytes]) {
        for (let i = 0; i < blockRows(J); i++) {
          dst.set(part.subarray(at, at + rowBytes), ((J * B + i) * Hkv + g) * rowBytes);
          at += rowBytes;
        }
      }
    }
  });
  const asData = (a: Uint32Array | Uint16Array) => (dtype === 'f32' ? new Float32Array(a.buffer) : (a as Uint16Array));
  return {
    k: { dtype, shape: [rows, Hkv, d], data: asData(kOut) },
    v: { dtype, shape: [rows, Hkv, d], data: asData(vOut) },
    bytesReceived,
    bytesSent,
  };
}

/**
 * Bytes a dense ring moves for the same layer: every rank's K/V shard reaches every other
 * rank once (the causal zig-zag ring still passes every shard around).
 */
export function denseRingBytes(layout: ShardLayout, kvHeads: number, headDim: number, elementBytes: number): number {
  return (layout.size - 1) * layout.n * kvHeads * headDim * elementBytes * 2;
}
