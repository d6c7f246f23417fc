/**
 * The NCCL transport's own logic (staging offsets, grouped sends and receives, the stream
 * polled until done, its refusals) over stand-ins for the driver and NCCL that move bytes
 * between ranks in this thread: a collective completes once every rank has called it, as
 * NCCL's do. The real library runs on a GPU host (tools/gpu-rig/src/nccl-main.ts).
 */
import { mulberry32 } from '@crisp/core';
import { describe, expect, it } from 'vitest';
import { NCCL_UNIQUE_ID_BYTES, type NcclCudaCalls, type NcclLib, ncclCollectivesOver, ncclUniqueId } from './nccl.js';

/** Device memory, streams and collectives of `P` ranks; `libsFor(r)` is rank r's view. */
function fakeWorld(P: number) {
  const mems = Array.from({ length: P }, () => new Map<number, Uint8Array>());
  let nextPtr = 0x10000;
  let nextStream = 1;
  const pending = new Map<number, number>();
  const find = (r: number, ptr: number) => {
    for (const [base, buf] of mems[r]) if (ptr >= base && ptr < base + buf.length) return { buf, off: ptr - base };
    throw new Error(`rank ${r}: ${ptr} is not device memory`);
  };
  const gathers: { contrib: { send: number; recv: number; count: number; stream: number }[]; n: number }[] = [];
  const gatherCalls = new Array<number>(P).fill(0);
  const sends = new Map<string, { rank: number; ptr: number; count: number; stream: number }[]>();
  const recvs = new Map<string, { rank: number; ptr: number; count: number; stream: number }[]>();
  const match = (key: string) => {
    const s = sends.get(key) ?? [];
    const r = recvs.get(key) ?? [];
    while (s.length && r.length) {
      const a = s.shift()!;
      const b = r.shift()!;
      if (a.count !== b.count) throw new Error(`${key}: a send of ${a.count} bytes met a receive of ${b.count}`);
      const src = find(a.rank, a.ptr);
      const dst = find(b.rank, b.ptr);
      dst.buf.set(src.buf.subarray(src.off, src.off + a.count), dst.off);
      pending.set(a.stream, pending.get(a.stream)! - 1);
      pending.set(b.stream, pending.get(b.stream)! - 1);
    }
  };
  const joined = new Set<number>();
  const aborted = new Set<number>();
  const destroyed = new Set<number>();
  const configs: Record<string, unknown>[] = [];
  const inProgressPolls: number[] = [];
  let peerError: number | undefined;
  /** a send or a receive queued on its stream, moved once its other half is there */
  const post = (queue: typeof sends, key: string, op: { rank: number; ptr: number; count: number; stream: number }) => {
    queue.set(key, [...(queue.get(key) ?? []), op]);
    pending.set(op.stream, pending.get(op.stream)! + 1);
    match(key);
    return 0;
  };
  const libsFor = (rank: number) => {
    const cu: NcclCudaCalls = {
      cuInit: () => 0,
      cuDeviceGet: (out: number[], ordinal: number) => {
        out[0] = ordinal;
        return 0;
      },
      cuDevicePrimaryCtxRetain: (out: unknown[]) => {
        out[0] = { rank };
        return 0;
      },
      cuDevicePrimaryCtxRelease: () => 0,
      cuCtxSetCurrent: () => 0,
      cuStreamCreate: (out: number[]) => {
        out[0] = nextStream++;
        pending.set(out[0], 0);
        return 0;
      },
      cuStreamDestroy: () => 0,
      cuStreamQuery: (s: number) => (pending.get(s) === 0 ? 0 : 600),
      cuMemAlloc: (out: number[], bytes: number) => {
        out[0] = nextPtr;
        mems[rank].set(nextPtr, new Uint8Array(bytes).fill(0xee));
        nextPtr += bytes + 4096;
        return 0;
      },
      cuMemFree: (ptr: number) => (mems[rank].delete(ptr) ? 0 : 1),
      cuMemcpyHtoD: (dst: number, src: Uint8Array, bytes: number) => {
        const d = find(rank, dst);
        d.buf.set(src.subarray(0, bytes), d.off);
        return 0;
      },
      cuMemcpyDtoH: (dst: Uint8Array, src: number, bytes: number) => {
        const s = find(rank, src);
        dst.set(s.buf.subarray(s.off, s.off + bytes));
        return 0;
      },
    };
    const nccl: NcclLib = {
      getUniqueId: () => 0,
      // non-blocking: in progress until every rank has joined
      commInitRankConfig: (out: unknown[], n: number, id: { internal: Uint8Array }, r: number, config: Record<string, unknown>) => {
        if (n !== P || r !== rank || id.internal.byteLength !== NCCL_UNIQUE_ID_BYTES) return 4;
        configs[rank] = config;
        joined.add(rank);
        out[0] = { rank };
        return 7;
      },
      commGetAsyncError: (_comm: unknown, state: number[]) => {
        state[0] = peerError ?? (joined.size < P ? 7 : (inProgressPolls[rank] ?? 0) > 0 ? 7 : 0);
        if ((inProgressPolls[rank] ?? 0) > 0 && joined.size === P) inProgressPolls[rank]--;
        return 0;
      },
      commAbort: () => {
        aborted.add(rank);
        return 0;
      },
      commDestroy: () => {
        destroyed.add(rank);
        return 0;
      },
      allGather: (send: number, recv: number, count: number, _type: number, _comm: unknown, stream: number) => {
        const i = gatherCalls[rank]++;
        gathers[i] ??= { contrib: new Array(P), n: 0 };
        const g = gathers[i];
        g.contrib[rank] = { send, recv, count, stream };
        pending.set(stream, pending.get(stream)! + 1);
        if (++g.n === P) {
          if (g.contrib.some((c) => c.count !== count)) throw new Error('an all-gather of unequal counts');
          for (let dst = 0; dst < P; dst++) {
            const out = find(dst, g.contrib[dst].recv);
            for (let src = 0; src < P; src++) {
              const from = find(src, g.contrib[src].send);
              out.buf.set(from.buf.subarray(from.off, from.off + count), out.off + src * count);
            }
            pending.set(g.contrib[dst].stream, pending.get(g.contrib[dst].stream)! - 1);
          }
        }
        return 0;
      },
      send: (ptr: number, count: number, _type: number, peer: number, _comm: unknown, stream: number) => post(sends, `${rank}->${peer}`, { rank, ptr, count, stream }),
      recv: (ptr: number, count: number, _type: number, peer: number, _comm: unknown, stream: number) => post(recvs, `${peer}->${rank}`, { rank, ptr, count, stream }),
      groupStart: () => 0,
      // the group's launch still running for a few polls, as a non-blocking communicator may say
      groupEnd: () => {
        inProgressPolls[rank] = 3;
        return 7;
      },
      errorString: (r: number) => `stand-in error ${r}`,
      version: () => 0,
    };
    return { cu, nccl, errorName: (r: number) => `CUresult ${r}` };
  };
  return {
    libsFor,
    mems,
    aborted,
    destroyed,
    configs,
    /** every later state poll reports this NCCL error (a peer gone) */
    failPeers: (code: number) => {
      peerError = code;
    },
  };
}

const id = new Uint8Array(NCCL_UNIQUE_ID_BYTES).fill(7);

async function group(P: number) {
  const world = fakeWorld(P);
  return { world, ranks: await Promise.all(Array.from({ length: P }, (_, rank) => ncclCollectivesOver({ rank, size: P, id }, world.libsFor(rank)))) };
}

const bytes = (seed: number, n: number) => {
  const rnd = mulberry32(seed);
  return Uint8Array.from({ length: n }, () => Math.floor(rnd() * 256));
};

describe('ncclCollectives (stand-ins for the driver and NCCL, ranks in one thread)', () => {
  it('all-gathers equal parts in rank order, growing its staging buffers', async () => {
    const { ranks } = await group(3);
    for (const len of [5, 300, 0, 4097]) {
      const parts = ranks.map((c) => bytes(100 * len + c.rank, len));
      const got = await Promise.all(ranks.map((c) => c.allGatherFixed(parts[c.rank])));
      const want = new Uint8Array(3 * len);
      for (let s = 0; s < 3; s++) want.set(parts[s], s * len);
      for (const g of got) expect(Array.from(g)).toEqual(Array.from(want));
    }
  });

  it('exchanges parts of any length (empty ones included) point to point, each at its offset', async () => {
    const P = 4;
    const { ranks } = await group(P);
    const len = (s: number, d: number) => (s * 7 + d * 13) % 11 === 0 ? 0 : 1 + ((s * 31 + d * 17) % 900);
    const parts = ranks.map((c) => Array.from({ length: P }, (_, d) => bytes(1000 * c.rank + d, len(c.rank, d))));
    const got = await Promise.all(ranks.map((c) => c.exchange(parts[c.rank], Array.from({ length: P }, (_, s) => len(s, c.rank)))));
    for (let r = 0; r < P; r++) {
      for (let s = 0; s < P; s++) {
        if (s === r) expect(got[r][s].byteLength).toBe(0);
        else expect(Array.from(got[r][s]), `${s} -> ${r}`).toEqual(Array.from(parts[s][r]));
      }
    }
  });

  it('refuses a bad rank, id or time limit before any call, and a collective on a closed or busy rank', async () => {
    const world = fakeWorld(2);
    await expect(ncclCollectivesOver({ rank: 2, size: 2, id }, world.libsFor(0))).rejects.toThrow(/rank 2, size 2/);
    await expect(ncclCollectivesOver({ rank: 0, size: 2, id: new Uint8Array(5) }, world.libsFor(0))).rejects.toThrow(/128-byte id/);
    for (const t of [0, -1, Number.NaN, '5' as unknown as number]) {
      await expect(ncclCollectivesOver({ rank: 0, size: 2, id, timeoutMs: t }, world.libsFor(0))).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
      await expect(ncclCollectivesOver({ rank: 0, size: 2, id, initTimeoutMs: t }, world.libsFor(0))).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
    }
    const [a, b] = await Promise.all([0, 1].map((rank) => ncclCollectivesOver({ rank, size: 2, id }, world.libsFor(rank))));
    // a non-blocking communicator, in NCCL 2.17's config layout
    expect(world.configs[0]).toMatchObject({ size: 40, magic: 0xcafebeef, version: 21700, blocking: 0 });
    const first = a.allGatherFixed(new Uint8Array(4));
    await expect(a.allGatherFixed(new Uint8Array(4))).rejects.toThrow(/another collective/);
    await b.allGatherFixed(new Uint8Array(4));
    await first;
    await expect(a.exchange([new Uint8Array(1)], [0])).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
    a.close();
    a.close();
    // a healthy communicator is destroyed (once), not aborted
    expect(world.destroyed.has(0) && !world.aborted.has(0)).toBe(true);
    await expect(a.allGatherFixed(new Uint8Array(4))).rejects.toThrow(/closed/);
    // its staging buffers are freed
    expect(world.mems[0].size).toBe(0);
    expect(world.mems[1].size).toBe(2);
  });

  it('a group NCCL refuses is a BACKEND_ERROR naming the call', async () => {
    const world = fakeWorld(2);
    const libs = world.libsFor(0);
    await expect(ncclCollectivesOver({ rank: 0, size: 3, id }, libs)).rejects.toThrow(/ncclCommInitRankConfig\(rank 0 of 3\) failed: NCCL error 4/);
  });

  it('a rank that never joins: BACKEND_ERROR (timedOut) after initTimeoutMs, the communicator aborted, nothing left', async () => {
    const world = fakeWorld(2);
    const t0 = performance.now();
    const e = await ncclCollectivesOver({ rank: 0, size: 2, id, initTimeoutMs: 40 }, world.libsFor(0)).catch((x: unknown) => x);
    expect(e).toMatchObject({ code: 'BACKEND_ERROR', details: { timedOut: true, timeoutMs: 40, rank: 0 } });
    expect(String((e as Error).message)).toMatch(/ncclCommInitRankConfig\(rank 0 of 2\).*within 40 ms.*aborted/);
    expect(performance.now() - t0).toBeLessThan(5000);
    expect(world.aborted.has(0)).toBe(true);
  });

  it('a peer that never calls the collective: BACKEND_ERROR (timedOut) after timeoutMs; the rank is closed, its staging freed', async () => {
    const world = fakeWorld(2);
    const [a] = await Promise.all([0, 1].map((rank) => ncclCollectivesOver({ rank, size: 2, id, timeoutMs: 40 }, world.libsFor(rank))));
    await expect(a.allGatherFixed(new Uint8Array(8))).rejects.toMatchObject({ code: 'BACKEND_ERROR', details: { timedOut: true } });
    expect(world.aborted.has(0)).toBe(true);
    expect(world.mems[0].size).toBe(0);
    await expect(a.allGatherFixed(new Uint8Array(8))).rejects.toThrow(/closed/);
    // closing an aborted rank touches the communicator no more
    a.close();
    expect(world.destroyed.has(0)).toBe(false);
  });

  it('a peer lost mid-exchange (NCCL reports a remote error): BACKEND_ERROR with NCCL\'s code, the communicator aborted', async () => {
    const world = fakeWorld(2);
    const [a] = await Promise.all([0, 1].map((rank) => ncclCollectivesOver({ rank, size: 2, id }, world.libsFor(rank))));
    world.failPeers(6);
    await expect(a.exchange([new Uint8Array(0), new Uint8Array(16)], [0, 16])).rejects.toMatchObject({ code: 'BACKEND_ERROR', details: { ncclResult: 6 } });
    expect(world.aborted.has(0)).toBe(true);
  });

  it('without NCCL (or the driver) here, ncclUniqueId is BACKEND_UNAVAILABLE with the reason', () => {
    let result: unknown;
    try {
      result = ncclUniqueId();
    } catch (e) {
      result = e;
    }
    if (result instanceof Uint8Array) expect(result.byteLength).toBe(NCCL_UNIQUE_ID_BYTES);
    else expect(result).toMatchObject({ code: 'BACKEND_UNAVAILABLE' });
  });
});
