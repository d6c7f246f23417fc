/**
 * Ranks as worker threads (Node only: import from '@crisp/parallel/node'). `runRanks` starts
 * one worker per rank on an entry file of the caller's, joined pairwise by message ports; the
 * entry calls `serveRank(fn)` first, which in a rank worker builds the rank's Communicator,
 * runs fn and reports its result. Each rank has its own heap and thread, as a process per
 * GPU would; a rank that throws or exits makes `runRanks` reject and stops the others.
 *
 * @module @crisp/parallel/node
 */
import { isMainThread, MessageChannel, type MessagePort, parentPort, Worker, workerData } from 'node:worker_threads';
import { CrispError, InvalidArgumentError } from '@crisp/core';
import type { Communicator, Traffic } from './communicator.js';

const FLAG = 'crispParallelRank';

interface Envelope {
  readonly seq: number;
  readonly bytes: Uint8Array;
}

/** A rank's communicator over one message port per peer; messages carry the collective's sequence number. */
class PortCommunicator implements Communicator {
  readonly rank: number;
  readonly size: number;
  readonly #ports: (MessagePort | undefined)[];
  readonly #inbox: Map<number, Uint8Array>[];
  readonly #waiters: Map<number, (b: Uint8Array) => void>[];
  readonly #traffic: Traffic = { bytesSent: 0, bytesReceived: 0 };
  #seq = 0;

  constructor(rank: number, size: number, ports: (MessagePort | undefined)[]) {
    this.rank = rank;
    this.size = size;
    this.#ports = ports;
    this.#inbox = ports.map(() => new Map());
    this.#waiters = ports.map(() => new Map());
    ports.forEach((port, src) => {
      port?.on('message', (m: Envelope) => {
        const w = this.#waiters[src].get(m.seq);
        if (w) {
          this.#waiters[src].delete(m.seq);
          w(m.bytes);
        } else this.#inbox[src].set(m.seq, m.bytes);
      });
    });
  }

  get traffic(): Readonly<Traffic> {
    return { ...this.#traffic };
  }

  #send(dst: number, seq: number, bytes: Uint8Array): void {
    const copy = bytes.slice();
    this.#traffic.bytesSent += copy.byteLength;
    this.#ports[dst]!.postMessage({ seq, bytes: copy } satisfies Envelope, [copy.buffer as ArrayBuffer]);
  }

  #receive(src: number, seq: number): Promise<Uint8Array> {
    const count = (b: Uint8Array) => {
      this.#traffic.bytesReceived += b.byteLength;
      return b;
    };
    const ready = this.#inbox[src].get(seq);
    if (ready) {
      this.#inbox[src].delete(seq);
      return Promise.resolve(count(ready));
    }
    return new Promise((resolve) => this.#waiters[src].set(seq, (b) => resolve(count(b))));
  }

  async #round(partFor: (dst: number) => Uint8Array): Promise<Uint8Array[]> {
    const seq = this.#seq++;
    for (let dst = 0; dst < this.size; dst++) if (dst !== this.rank) this.#send(dst, seq, partFor(dst));
    const got: Promise<Uint8Array>[] = [];
    for (let src = 0; src < this.size; src++) got.push(src === this.rank ? Promise.resolve(partFor(src).slice()) : this.#receive(src, seq));
    return Promise.all(got);
  }

  allGather(data: Uint8Array): Promise<Uint8Array[]> {
    return this.#round(() => data);
  }

  allToAll(parts: readonly Uint8Array[]): Promise<Uint8Array[]> {
    if (parts.length !== this.size) return Promise.reject(new InvalidArgumentError(`allToAll needs ${this.size} parts (one per rank); got ${parts.length}`));
    return this.#round((dst) => parts[dst]);
  }

  close(): void {
    for (const p of this.#ports) p?.close();
  }
}

interface RankData {
  readonly [FLAG]: true;
  readonly rank: number;
  readonly size: number;
  readonly ports: (MessagePort | undefined)[];
  readonly data: unknown;
}

type Report = { readonly ok: true; readonly value: unknown } | { readonly ok: false; readonly code: string; readonly message: string };

/**
 * Call first in the entry file `runRanks` starts: in a rank worker it runs `fn` with the
 * rank's communicator and the data `runRanks` was given, reports what fn returns (structured
 * clone) and returns true; elsewhere it returns false and does nothing.
 */
export function serveRank(fn: (comm: Communicator, data: unknown) => Promise<unknown> | unknown): boolean {
  const wd = workerData as RankData | null;
  if (isMainThread || !parentPort || wd?.[FLAG] !== true) return false;
  const port = parentPort;
  const comm = new PortCommunicator(wd.rank, wd.size, wd.ports);
  (async () => {
    let report: Report;
    try {
      report = { ok: true, value: await fn(comm, wd.data) };
    } catch (e) {
      report = { ok: false, code: (e as { code?: string }).code ?? 'BACKEND_ERROR', message: e instanceof Error ? e.message : String(e) };
    }
    port.postMessage(report);
    comm.close();
  })();
  return true;
}

export interface RunRanksOptions {
  /** ranks (worker threads) to start */
  readonly size: number;
  /** the entry file each rank runs; it must call serveRank first */
  readonly entry: URL;
  /** handed to every rank's fn (structured clone) */
  readonly data?: unknown;
}

/**
 * Start `size` ranks on worker threads and resolve with what each rank's fn returned, by rank.
 * Rejects with the first rank's failure (a CrispError with that rank's code, naming the rank)
 * after stopping every worker; a rank's error reaches the others through their collectives,
 * so none is left waiting.
 */
export async function runRanks(opts: RunRanksOptions): Promise<unknown[]> {
  const { size, entry } = opts ?? ({} as RunRanksOptions);
  if (!Number.isInteger(size) || size < 1) throw new InvalidArgumentError(`runRanks needs a positive integer size; got ${String(size)}`);
  if (!(entry instanceof URL)) throw new InvalidArgumentError('runRanks needs the entry file as a URL (it must call serveRank first)');
  const ports: (MessagePort | undefined)[][] = Array.from({ length: size }, () => new Array(size).fill(undefined));
  for (let a = 0; a < size; a++) {
    for (let b = a + 1; b < size; b++) {
      const ch = new MessageChannel();
      ports[a][b] = ch.port1;
      ports[b][a] = ch.port2;
    }
  }
  const workers: Worker[] = [];
  try {
    return await new Promise<unknown[]>((resolve, reject) => {
      const results = new Array<unknown>(size);
      // by rank: whether it reported (a rank's fn may return undefined)
      const reported = new Array<boolean>(size).fill(false);
      let done = 0;
      let failed = false;
      const fail = (e: Error) => {
        if (failed) return;
        failed = true;
        reject(e);
      };
      for (let rank = 0; rank < size; rank++) {
        const own = ports[rank].filter((p): p is MessagePort => p !== undefined);
        const w = new Worker(entry, { workerData: { [FLAG]: true, rank, size, ports: ports[rank], data: opts.data } satisfies RankData, transferList: own });
        workers.push(w);
        w.on('message', (r: Report) => {
          if (!r.ok) {
            fail(new CrispError(r.code as CrispError['code'], `rank ${rank}: ${r.message}`, { rank }));
            return;
          }
          results[rank] = r.value;
          reported[rank] = true;
          if (++done === size) resolve(results);
        });
        w.on('error', (e) => fail(new CrispError('BACKEND_ERROR', `rank ${rank}'s thread failed: ${e instanceof Error ? e.message : String(e)}`, { rank })));
        w.on('exit', (code) => {
          if (!reported[rank]) fail(new CrispError('BACKEND_ERROR', `rank ${rank}'s thread exited (code ${code}) before reporting; its entry must call serveRank first`, { rank }));
        });
      }
    });
  } finally {
    await Promise.all(workers.map((w) => w.terminate()));
  }
}
