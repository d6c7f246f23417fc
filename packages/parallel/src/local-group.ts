/**
 * Communicators for ranks that run in one thread (each rank an async task): every collective
 * resolves once all ranks have called it. For tests, examples and single-process use; ranks
 * on worker threads use `runRanks` from `@crisp/parallel/node`.
 */
import { CrispError, InvalidArgumentError } from '@crisp/core';
import type { Communicator, Traffic } from './communicator.js';

interface Round {
  readonly kind: 'allGather' | 'allToAll';
  /** what each rank put in: one part (allGather) or one part per destination (allToAll) */
  readonly parts: (readonly Uint8Array[] | undefined)[];
  readonly waiting: ((parts: Uint8Array[]) => void)[];
  readonly failing: ((e: Error) => void)[];
  arrived: number;
}

/**
 * `size` communicators joined to each other, for ranks run as async tasks in this thread.
 * Payloads are copied, as a transport would. A rank calling a different collective than the
 * others at the same step rejects every rank's call (BACKEND_ERROR).
 */
export function createLocalGroup(size: number): Communicator[] {
  if (!Number.isInteger(size) || size < 1) throw new InvalidArgumentError(`createLocalGroup needs a positive integer size; got ${String(size)}`);
  const rounds = new Map<number, Round>();
  const calls = new Array<number>(size).fill(0);
  const traffic: Traffic[] = Array.from({ length: size }, () => ({ bytesSent: 0, bytesReceived: 0 }));

  const contribute = (rank: number, kind: Round['kind'], mine: readonly Uint8Array[]): Promise<Uint8Array[]> => {
    const index = calls[rank]++;
    let round = rounds.get(index);
    if (!round) {
      round = { kind, parts: new Array(size).fill(undefined), waiting: new Array(size), failing: new Array(size), arrived: 0 };
      rounds.set(index, round);
    }
    const r = round;
    return new Promise<Uint8Array[]>((resolve, reject) => {
      r.waiting[rank] = resolve;
      r.failing[rank] = reject;
      if (r.kind !== kind) {
        const e = new CrispError('BACKEND_ERROR', `collective ${index}: rank ${rank} called ${kind}, another rank ${r.kind}; every rank must call the same collectives in the same order`);
        for (const f of r.failing) f?.(e);
        rounds.delete(index);
        return;
      }
      r.parts[rank] = mine.map((p) => p.slice());
      if (++r.arrived < size) return;
      rounds.delete(index);
      for (let dst = 0; dst < size; dst++) {
        const got: Uint8Array[] = [];
        for (let src = 0; src < size; src++) {
          const from = r.parts[src]!;
          const part = r.kind === 'allGather' ? from[0] : from[dst];
          got.push(part);
          if (src !== dst) {
            traffic[src].bytesSent += part.byteLength;
            traffic[dst].bytesReceived += part.byteLength;
          }
        }
        r.waiting[dst](got);
      }
    });
  };

  return Array.from({ length: size }, (_, rank) => ({
    rank,
    size,
    get traffic() {
      return { ...traffic[rank] };
    },
    allGather: (data: Uint8Array) => contribute(rank, 'allGather', [data]),
    allToAll: (parts: readonly Uint8Array[]) => {
      if (parts.length !== size) return Promise.reject(new InvalidArgumentError(`allToAll needs ${size} parts (one per rank); got ${parts.length}`));
      return contribute(rank, 'allToAll', parts);
    },
  }));
}
