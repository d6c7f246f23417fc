/**
 * The collective interface a context-parallel prefill runs on, and the steps it builds from
 * it. A communicator joins `size` ranks; every collective is called by every rank, in the
 * same order, and resolves on each once its part has arrived. The payloads are bytes, so the
 * same interface serves threads in one process (thread-group.ts, local-group.ts) and a
 * library such as NCCL.
 */
import { CrispError, type CrispErrorCode, InvalidArgumentError, isCrispError } from '@crisp/core';

/** Bytes a rank sent to and received from other ranks (its own part is not counted). */
export interface Traffic {
  bytesSent: number;
  bytesReceived: number;
}

export interface Communicator {
  /** this rank, 0 .. size - 1 */
  readonly rank: number;
  readonly size: number;
  /** Every rank's `data` (parts may differ in length), indexed by rank; part `rank` is this rank's own. */
  allGather(data: Uint8Array): Promise<Uint8Array[]>;
  /** `parts[s]` goes to rank s; the result's part s is what rank s sent here. */
  allToAll(parts: readonly Uint8Array[]): Promise<Uint8Array[]>;
  /** What this communicator moved so far. */
  readonly traffic: Readonly<Traffic>;
}

/** Throws INVALID_ARGUMENT unless `comm` looks like a Communicator. */
export function assertCommunicator(comm: unknown, where: string): asserts comm is Communicator {
  const c = comm as Partial<Communicator> | null;
  if (
    !c ||
    typeof c !== 'object' ||
    !Number.isInteger(c.size) ||
    (c.size as number) < 1 ||
    !Number.isInteger(c.rank) ||
    (c.rank as number) < 0 ||
    (c.rank as number) >= (c.size as number) ||
    typeof c.allGather !== 'function' ||
    typeof c.allToAll !== 'function'
  ) {
    throw new InvalidArgumentError(`${where} needs a Communicator { rank, size, allGather, allToAll } (createLocalGroup, or a rank of @crisp/parallel/node's runRanks)`);
  }
}

/** The bytes of a typed array (a view, no copy). */
export function bytesOf(a: ArrayBufferView): Uint8Array {
  return new Uint8Array(a.buffer, a.byteOffset, a.byteLength);
}

/** Float64 values of received bytes (copied when unaligned). */
export function f64Of(b: Uint8Array): Float64Array {
  if (b.byteOffset % 8 === 0) return new Float64Array(b.buffer, b.byteOffset, b.byteLength / 8);
  return new Float64Array(b.slice().buffer);
}

/** Int32 values of received bytes (copied when unaligned). */
export function i32Of(b: Uint8Array): Int32Array {
  if (b.byteOffset % 4 === 0) return new Int32Array(b.buffer, b.byteOffset, b.byteLength / 4);
  return new Int32Array(b.slice().buffer);
}

/**
 * Element-wise sum of every rank's `x`, added in rank order (rank 0's first), so every rank
 * gets the same bits.
 */
export async function allReduceSum(comm: Communicator, x: Float64Array): Promise<Float64Array> {
  return sumInRankOrder(await comm.allGather(bytesOf(x)), x.length);
}

/** Element-wise sum of gathered float64 parts of `length` values each, rank 0's first. */
export function sumInRankOrder(parts: readonly Uint8Array[], length: number): Float64Array {
  const out = new Float64Array(length);
  for (const p of parts) {
    const v = f64Of(p);
    if (v.length !== length) throw new CrispError('BACKEND_ERROR', `a rank sent ${v.length} values to sum, this one ${length}`);
    for (let i = 0; i < length; i++) out[i] += v[i];
  }
  return out;
}

const OK = 1;
const FAILED = 0;
const encoder = new TextEncoder();
const decoder = new TextDecoder();

interface Failure {
  readonly rank: number;
  readonly code: CrispErrorCode;
  readonly message: string;
}

function failureBytes(rank: number, e: unknown): Uint8Array {
  const code: CrispErrorCode = isCrispError(e) ? e.code : 'BACKEND_ERROR';
  const message = e instanceof Error ? e.message : String(e);
  const body = encoder.encode(JSON.stringify({ rank, code, message } satisfies Failure));
  const out = new Uint8Array(body.length + 1);
  out[0] = FAILED;
  out.set(body, 1);
  return out;
}

function withStatus(payload: Uint8Array): Uint8Array {
  const out = new Uint8Array(payload.length + 1);
  out[0] = OK;
  out.set(payload, 1);
  return out;
}

/**
 * The first failure among the parts, rethrown: on the rank that failed, its own error; on the
 * others a CrispError with the same code naming that rank, so every rank stops at the same
 * step instead of waiting for a peer that will not come.
 */
function rethrowFailure(parts: readonly Uint8Array[], ownError: unknown, step: string): void {
  for (const p of parts) {
    if (p.length === 0 || p[0] === OK) continue;
    if (ownError !== undefined) throw ownError;
    const f = JSON.parse(decoder.decode(p.subarray(1))) as Failure;
    throw new CrispError(f.code, `rank ${f.rank} failed in ${step}: ${f.message}`, { rank: f.rank, step });
  }
}

/**
 * One step every rank takes together: `produce` runs here (its throw is caught), then every
 * rank's result is gathered with a status byte. If any rank failed, every rank throws (the
 * failing one its own error). The parts returned carry no status byte.
 */
export async function gatherStep(comm: Communicator, step: string, produce: () => Uint8Array): Promise<Uint8Array[]> {
  let mine: Uint8Array;
  let error: unknown;
  try {
    mine = withStatus(produce());
  } catch (e) {
    error = e;
    mine = failureBytes(comm.rank, e);
  }
  const parts = await comm.allGather(mine);
  rethrowFailure(parts, error, step);
  return parts.map((p) => p.subarray(1));
}

/** allToAll with the same failure rule as gatherStep: `produce` returns the parts for every rank. */
export async function exchangeStep(comm: Communicator, step: string, produce: () => readonly Uint8Array[]): Promise<Uint8Array[]> {
  let mine: Uint8Array[];
  let error: unknown;
  try {
    const parts = produce();
    if (parts.length !== comm.size) throw new CrispError('BACKEND_ERROR', `${step}: ${parts.length} parts for ${comm.size} ranks`);
    mine = parts.map(withStatus);
  } catch (e) {
    error = e;
    const f = failureBytes(comm.rank, e);
    mine = Array.from({ length: comm.size }, () => f);
  }
  const got = await comm.allToAll(mine);
  rethrowFailure(got, error, step);
  return got.map((p) => p.subarray(1));
}
