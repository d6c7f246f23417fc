/**
 * A Communicator over a transport whose collectives move equal-sized parts, as NCCL's do
 * (`ncclAllGather` takes one count for every rank; `ncclSend` / `ncclRecv` need the receiver
 * to know the count). `communicatorOver` adds what the prefill's collectives need on top: the
 * parts' lengths are exchanged first, an all-gather pads every part to the longest, and an
 * all-to-all becomes point-to-point sends whose lengths each receiver was told.
 * `@crisp/kernels-cuda`'s `ncclCollectives` is such a transport.
 */
import { CrispError, InvalidArgumentError } from '@crisp/core';
import { bytesOf, type Communicator, f64Of, type Traffic } from './communicator.js';

/** Collectives of equal-sized parts, called by every rank in the same order. */
export interface FixedCollectives {
  readonly rank: number;
  readonly size: number;
  /** Every rank's `data` (the same length on every rank), concatenated in rank order. */
  allGatherFixed(data: Uint8Array): Promise<Uint8Array>;
  /**
   * Point to point: `parts[s]` goes to rank s (s ≠ rank) and `recvBytes[s]` bytes come from
   * each rank s ≠ rank, which sends exactly that many; the result's part s is what s sent
   * (the part for this rank is not sent: it may be empty).
   */
  exchange(parts: readonly Uint8Array[], recvBytes: readonly number[]): Promise<Uint8Array[]>;
  /** Frees the transport (its communicator, buffers and stream); idempotent. */
  close(): void;
}

/** A Communicator (allGather, allToAll of any lengths) over equal-sized collectives. */
export interface FixedCommunicator extends Communicator {
  /** Closes the transport underneath. */
  close(): void;
}

/** `communicatorOver(ncclCollectives({ rank, size, id }))`: the prefill's Communicator over `fixed`. */
export function communicatorOver(fixed: FixedCollectives): FixedCommunicator {
  const { rank, size } = fixed;
  if (!Number.isInteger(size) || size < 1 || !Number.isInteger(rank) || rank < 0 || rank >= size) {
    throw new InvalidArgumentError(`communicatorOver needs 0 <= rank < size; got rank ${rank}, size ${size}`);
  }
  const traffic: Traffic = { bytesSent: 0, bytesReceived: 0 };

  /** Every rank's `values` (the same count everywhere), as float64s in rank order. */
  const gatherNumbers = async (values: readonly number[]): Promise<Float64Array[]> => {
    const all = f64Of(await fixed.allGatherFixed(bytesOf(Float64Array.from(values))));
    if (all.length !== values.length * size) {
      throw new CrispError('BACKEND_ERROR', `the transport's all-gather returned ${all.length} values; expected ${values.length * size}`);
    }
    return Array.from({ length: size }, (_, s) => all.subarray(s * values.length, (s + 1) * values.length));
  };

  return {
    rank,
    size,
    get traffic() {
      return { ...traffic };
    },
    async allGather(data: Uint8Array): Promise<Uint8Array[]> {
      const lengths = (await gatherNumbers([data.byteLength])).map((v) => v[0]);
      const longest = Math.max(...lengths);
      const padded = new Uint8Array(longest);
      padded.set(data);
      const all = await fixed.allGatherFixed(padded);
      if (all.byteLength !== longest * size) {
        throw new CrispError('BACKEND_ERROR', `the transport's all-gather returned ${all.byteLength} bytes; expected ${longest * size}`);
      }
      const parts = lengths.map((len, s) => all.slice(s * longest, s * longest + len));
      for (let s = 0; s < size; s++) {
        if (s === rank) continue;
        traffic.bytesSent += data.byteLength;
        traffic.bytesReceived += lengths[s];
      }
      return parts;
    },
    async allToAll(parts: readonly Uint8Array[]): Promise<Uint8Array[]> {
      if (parts.length !== size) throw new InvalidArgumentError(`allToAll needs ${size} parts (one per rank); got ${parts.length}`);
      // row s of the matrix: what rank s sends to each rank; this rank receives column `rank`
      const matrix = await gatherNumbers(parts.map((p) => p.byteLength));
      const recvBytes = matrix.map((row) => row[rank]);
      const got = await fixed.exchange(parts, recvBytes);
      if (got.length !== size) throw new CrispError('BACKEND_ERROR', `the transport's exchange returned ${got.length} parts for ${size} ranks`);
      const out = got.map((g, s) => {
        if (s === rank) return parts[rank].slice();
        if (g.byteLength !== recvBytes[s]) {
          throw new CrispError('BACKEND_ERROR', `the transport delivered ${g.byteLength} bytes from rank ${s}; it announced ${recvBytes[s]}`);
        }
        return g;
      });
      for (let s = 0; s < size; s++) {
        if (s === rank) continue;
        traffic.bytesSent += parts[s].byteLength;
        traffic.bytesReceived += recvBytes[s];
      }
      return out;
    },
    close: () => fixed.close(),
  };
}
