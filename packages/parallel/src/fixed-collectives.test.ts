import { crispSmall } from '@crisp/conformance';
import { createReferenceBackend } from '@crisp/reference';
import { scenario } from '@crisp/synth';
import { describe, expect, it } from 'vitest';
import { type FixedCollectives, communicatorOver } from './fixed-collectives.js';
import { shardTensor, unshardTensor, zigzagLayout } from './layout.js';
import { createLocalGroup } from './local-group.js';
import { parallelPrefill } from './prefill.js';

/**
 * A transport with NCCL's rules, over ranks in one thread: the all-gather refuses parts of
 * different lengths, and a receiver gets exactly the byte count it names (a send of another
 * length fails, as a mismatched ncclSend/ncclRecv pair would hang or truncate).
 */
function strictTransports(size: number): FixedCollectives[] {
  const group = createLocalGroup(size);
  return group.map((comm) => ({
    rank: comm.rank,
    size,
    async allGatherFixed(data: Uint8Array) {
      const parts = await comm.allGather(data);
      const len = parts[0].byteLength;
      if (parts.some((p) => p.byteLength !== len)) throw new Error(`all-gather of unequal parts: ${parts.map((p) => p.byteLength).join(', ')}`);
      const out = new Uint8Array(len * size);
      for (let s = 0; s < size; s++) out.set(parts[s], s * len);
      return out;
    },
    async exchange(parts: readonly Uint8Array[], recvBytes: readonly number[]) {
      const got = await comm.allToAll(parts.map((p, s) => (s === comm.rank ? new Uint8Array(0) : p)));
      return got.map((g, s) => {
        if (s !== comm.rank && g.byteLength !== recvBytes[s]) throw new Error(`rank ${comm.rank} expected ${recvBytes[s]} bytes from ${s}, got ${g.byteLength}`);
        return s === comm.rank ? new Uint8Array(0) : g;
      });
    },
    close() {},
  }));
}

describe('communicatorOver (a Communicator over equal-sized collectives, as NCCL offers)', () => {
  it('gathers and exchanges parts of any length, counting the traffic', async () => {
    const comms = strictTransports(3).map(communicatorOver);
    const gathered = await Promise.all(comms.map((c) => c.allGather(Uint8Array.from({ length: 2 + 5 * c.rank }, (_, i) => 10 * c.rank + i))));
    for (const parts of gathered) {
      expect(parts.map((p) => p.byteLength)).toEqual([2, 7, 12]);
      expect(Array.from(parts[1])).toEqual([10, 11, 12, 13, 14, 15, 16]);
    }
    const exchanged = await Promise.all(comms.map((c) => c.allToAll(Array.from({ length: 3 }, (_, d) => Uint8Array.from({ length: c.rank + 2 * d }, () => 100 + 10 * c.rank + d)))));
    for (let r = 0; r < 3; r++) {
      expect(exchanged[r].map((p) => p.byteLength)).toEqual([0 + 2 * r, 1 + 2 * r, 2 + 2 * r]);
      for (let s = 0; s < 3; s++) expect(exchanged[r][s].every((x) => x === 100 + 10 * s + r)).toBe(true);
    }
    // rank 1: sent its 7 bytes twice and parts of 1 and 5 bytes; received 2 + 12 and 2 + 4
    expect(comms[1].traffic).toEqual({ bytesSent: 14 + 1 + 5, bytesReceived: 14 + 6 });
  });

  it('carries a context-parallel prefill for P = 2 and 3: the output of one rank group over the local communicator, bit for bit', async () => {
    const n = 1337;
    const dims = { heads: 4, kvHeads: 2, headDim: 32 };
    const { q, k, v } = scenario('llama-like', { n, ...dims, seed: 5, dtype: 'f32' }).rows(0, n);
    for (const P of [2, 3]) {
      const layout = zigzagLayout(n, P, crispSmall.blockSize ?? 128);
      const run = (comms: readonly Parameters<typeof parallelPrefill>[0][]) =>
        Promise.all(
          comms.map((comm, r) =>
            parallelPrefill(comm, createReferenceBackend(), layout, { q: shardTensor(layout, r, q), k: shardTensor(layout, r, k), v: shardTensor(layout, r, v) }, crispSmall),
          ),
        );
      const over = await run(strictTransports(P).map(communicatorOver));
      const local = await run(createLocalGroup(P));
      const a = unshardTensor(layout, over.map((x) => x.output));
      const b = unshardTensor(layout, local.map((x) => x.output));
      expect(Array.from(a.data), `P = ${P}`).toEqual(Array.from(b.data));
      expect(over.map((x) => x.traffic.kvBytesReceived)).toEqual(local.map((x) => x.traffic.kvBytesReceived));
      expect(over[0].plan.mask).toEqual(local[0].plan.mask);
    }
  }, 60_000);

  it('refuses a rank outside the group and a wrong number of parts', async () => {
    const t = strictTransports(2)[0];
    expect(() => communicatorOver({ ...t, rank: 2 })).toThrow(/rank 2, size 2/);
    await expect(communicatorOver(t).allToAll([new Uint8Array(1)])).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
  });
});
