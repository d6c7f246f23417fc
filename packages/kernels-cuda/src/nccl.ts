/**
 * NCCL through koffi, as the transport of a context-parallel prefill: one process per GPU,
 * each holding a `ncclCollectives` rank. The collectives move host bytes through device
 * staging buffers on a stream of their own (NCCL moves device memory): an all-gather of
 * equal parts (`ncclAllGather`) and point-to-point sends and receives in one group
 * (`ncclSend` / `ncclRecv`). `@crisp/parallel`'s `communicatorOver` turns them into the
 * Communicator `parallelPrefill` takes:
 *
 *   const id = ncclUniqueId();                       // on one process, passed to the others
 *   const comm = communicatorOver(await ncclCollectives({ rank, size, id, device: rank }));
 *
 * The library is `libnccl.so.2` on the loader's path unless `library` or CRISP_NCCL_LIBRARY
 * names another (PyTorch's wheels carry it under nvidia/nccl/lib). NVLink multicast is left
 * off (NCCL_NVLS_ENABLE=0) unless the environment says otherwise.
 *
 * The communicator is NCCL's non-blocking kind (`ncclConfig_t.blocking = 0`, NCCL 2.14 and
 * later): joining the group and every collective are polled, so a rank that never arrives, or
 * dies mid-collective, ends in a typed error after `initTimeoutMs` / `timeoutMs` (the
 * communicator aborted with ncclCommAbort) instead of a hang.
 */
import { CrispError, InvalidArgumentError } from '@crisp/core';
import { type CudaLibs, cudaErrorName, loadCuda, loadFirst } from './runtime/ffi.js';

// biome-ignore lint/suspicious/noExplicitAny: koffi's functions are untyped by nature
type Fn = (...args: any[]) => any;

/** The NCCL entry points the transport calls (koffi functions, or a test's stand-ins). */
export interface NcclLib {
  readonly getUniqueId: Fn;
  /** ncclCommInitRankConfig(comm*, nranks, id, rank, config*) */
  readonly commInitRankConfig: Fn;
  /** ncclCommGetAsyncError(comm, int* state): the state of a non-blocking communicator */
  readonly commGetAsyncError: Fn;
  readonly commAbort: Fn;
  readonly commDestroy: Fn;
  readonly allGather: Fn;
  readonly send: Fn;
  readonly recv: Fn;
  readonly groupStart: Fn;
  readonly groupEnd: Fn;
  readonly errorString: Fn;
  readonly version: Fn;
}

/** The driver calls the transport makes (CudaLibs['cu'] has them; a test may pass its own). */
export interface NcclCudaCalls {
  readonly cuInit: Fn;
  readonly cuDeviceGet: Fn;
  readonly cuDevicePrimaryCtxRetain: Fn;
  readonly cuDevicePrimaryCtxRelease: Fn;
  readonly cuCtxSetCurrent: Fn;
  readonly cuStreamCreate: Fn;
  readonly cuStreamDestroy: Fn;
  readonly cuStreamQuery: Fn;
  readonly cuMemAlloc: Fn;
  readonly cuMemFree: Fn;
  readonly cuMemcpyHtoD: Fn;
  readonly cuMemcpyDtoH: Fn;
}

/** CUDA_ERROR_NOT_READY: cuStreamQuery's "still running" */
const CUDA_ERROR_NOT_READY = 600;

/** ncclUint8 */
const NCCL_UINT8 = 1;
/** ncclInProgress: a non-blocking communicator's call still running */
const NCCL_IN_PROGRESS = 7;
/** NCCL_CONFIG_UNDEF_INT */
const NCCL_UNDEF_INT = -2147483648;
/**
 * ncclConfig_t as NCCL 2.17 laid it out (size, magic, version, then the fields up to netName):
 * NCCL reads a config by its size and version, so later libraries take it as they are.
 */
const NCCL_CONFIG_V21700 = { bytes: 40, version: 21700, magic: 0xcafebeef } as const;
/** Defaults: joining the group, and one collective (a peer may be planning meanwhile). */
const DEFAULT_INIT_TIMEOUT_MS = 300_000;
const DEFAULT_TIMEOUT_MS = 1_800_000;
/** ncclUniqueId: 128 opaque bytes */
export const NCCL_UNIQUE_ID_BYTES = 128;

const loaded = new Map<string, { cuda: CudaLibs; nccl: NcclLib }>();
/** koffi's struct types are named once per process */
let idTypeDeclared = false;

function libraryNames(library?: string): string[] {
  const named = library ?? process.env.CRISP_NCCL_LIBRARY;
  return named ? [named] : ['libnccl.so.2', 'libnccl.so'];
}

function load(library?: string): { cuda: CudaLibs; nccl: NcclLib } {
  const key = libraryNames(library).join(':');
  const hit = loaded.get(key);
  if (hit) return hit;
  const cuda = loadCuda();
  const koffi = cuda.koffi;
  const { lib, tried } = loadFirst(koffi, libraryNames(library));
  if (!lib) {
    throw new CrispError('BACKEND_UNAVAILABLE', `NCCL did not load (${tried.join('; ')}); set CRISP_NCCL_LIBRARY to libnccl.so.2's path`, { tried });
  }
  if (!idTypeDeclared) {
    koffi.struct('crisp_ncclUniqueId', { internal: koffi.array('uint8_t', NCCL_UNIQUE_ID_BYTES, 'Typed') });
    koffi.struct('crisp_ncclConfig', {
      size: 'size_t',
      magic: 'uint32_t',
      version: 'uint32_t',
      blocking: 'int',
      cgaClusterSize: 'int',
      minCTAs: 'int',
      maxCTAs: 'int',
      netName: 'void *',
    });
    idTypeDeclared = true;
  }
  const nccl: NcclLib = {
    getUniqueId: lib.func('int ncclGetUniqueId(_Out_ crisp_ncclUniqueId *id)'),
    commInitRankConfig: lib.func('int ncclCommInitRankConfig(_Out_ void **comm, int nranks, crisp_ncclUniqueId id, int rank, crisp_ncclConfig *config)'),
    commGetAsyncError: lib.func('int ncclCommGetAsyncError(void *comm, _Out_ int *asyncError)'),
    commAbort: lib.func('int ncclCommAbort(void *comm)'),
    commDestroy: lib.func('int ncclCommDestroy(void *comm)'),
    allGather: lib.func('int ncclAllGather(uint64_t send, uint64_t recv, size_t count, int type, void *comm, void *stream)'),
    send: lib.func('int ncclSend(uint64_t send, size_t count, int type, int peer, void *comm, void *stream)'),
    recv: lib.func('int ncclRecv(uint64_t recv, size_t count, int type, int peer, void *comm, void *stream)'),
    groupStart: lib.func('int ncclGroupStart()'),
    groupEnd: lib.func('int ncclGroupEnd()'),
    errorString: lib.func('const char *ncclGetErrorString(int result)'),
    version: lib.func('int ncclGetVersion(_Out_ int *version)'),
  };
  const out = { cuda, nccl };
  loaded.set(key, out);
  return out;
}

function ncclCheck(nccl: NcclLib, res: number, what: string): void {
  if (res === 0) return;
  throw new CrispError('BACKEND_ERROR', `${what} failed: NCCL error ${res} (${String(nccl.errorString(res))})`, { ncclResult: res });
}

/** The NCCL version as a number (e.g. 22708 for 2.27.8), or BACKEND_UNAVAILABLE. */
export function ncclVersion(opts: { library?: string } = {}): number {
  const { nccl } = load(opts.library);
  const v = [0];
  ncclCheck(nccl, nccl.version(v), 'ncclGetVersion');
  return v[0];
}

/** A new group's id (128 bytes): made by one process, handed to every rank's `ncclCollectives`. */
export function ncclUniqueId(opts: { library?: string } = {}): Uint8Array {
  const { nccl } = load(opts.library);
  const out: { internal?: Uint8Array } = {};
  ncclCheck(nccl, nccl.getUniqueId(out), 'ncclGetUniqueId');
  return Uint8Array.from(out.internal ?? []);
}

export interface NcclCollectivesOptions {
  /** this process's rank, 0 .. size − 1 */
  readonly rank: number;
  readonly size: number;
  /** the group's id from `ncclUniqueId`, the same on every rank */
  readonly id: Uint8Array;
  /** the CUDA device ordinal this rank uses (default 0; one GPU per rank) */
  readonly device?: number;
  /** libnccl's path or name (default CRISP_NCCL_LIBRARY, else libnccl.so.2) */
  readonly library?: string;
  /** how long to wait for every rank to join, ms (default 300,000; Infinity: no limit) */
  readonly initTimeoutMs?: number;
  /** how long one collective may wait for the other ranks, ms (default 1,800,000; Infinity: no limit) */
  readonly timeoutMs?: number;
}

/** The equal-sized collectives of @crisp/parallel's `FixedCollectives`, over NCCL. */
export interface NcclCollectives {
  readonly rank: number;
  readonly size: number;
  allGatherFixed(data: Uint8Array): Promise<Uint8Array>;
  exchange(parts: readonly Uint8Array[], recvBytes: readonly number[]): Promise<Uint8Array[]>;
  close(): void;
}

/**
 * Joins the NCCL group `id` as `rank` of `size` on CUDA device `device`: resolves once every
 * rank has joined (ncclCommInitRankConfig, non-blocking, polled), or rejects with a
 * BACKEND_ERROR (`details.timedOut`) after `initTimeoutMs`. Every rank must then call the same
 * collectives in the same order; each resolves once its stream has finished (polled, so the
 * process's event loop runs while NCCL waits for the other ranks); one that waits past
 * `timeoutMs`, or that NCCL reports failed (a peer gone), aborts the communicator and rejects.
 * `close()` destroys the communicator and frees its staging buffers.
 */
export async function ncclCollectives(opts: NcclCollectivesOptions): Promise<NcclCollectives> {
  checkOptions(opts);
  const { cuda, nccl } = load(opts.library);
  const cu = cuda.cu;
  if (!cu.cuStreamQuery) throw new CrispError('BACKEND_UNAVAILABLE', 'the driver has no cuStreamQuery');
  return ncclCollectivesOver(opts, { cu: cu as unknown as NcclCudaCalls, nccl, errorName: (r) => cudaErrorName(cuda, r) });
}

function checkOptions(opts: NcclCollectivesOptions): void {
  const { rank, size, id } = opts ?? ({} as NcclCollectivesOptions);
  if (!Number.isInteger(size) || size < 1 || !Number.isInteger(rank) || rank < 0 || rank >= size) {
    throw new InvalidArgumentError(`ncclCollectives needs 0 <= rank < size; got rank ${rank}, size ${size}`);
  }
  if (!(id instanceof Uint8Array) || id.byteLength !== NCCL_UNIQUE_ID_BYTES) {
    throw new InvalidArgumentError(`ncclCollectives needs the group's ${NCCL_UNIQUE_ID_BYTES}-byte id from ncclUniqueId()`);
  }
  for (const key of ['initTimeoutMs', 'timeoutMs'] as const) {
    const t = opts[key];
    if (t !== undefined && !(typeof t === 'number' && t > 0)) throw new InvalidArgumentError(`ncclCollectives: ${key} must be a positive number of ms (or Infinity); got ${String(t)}`);
  }
}

/**
 * ncclCollectives over given entry points: the driver's calls, NCCL's, and a CUresult's name
 * (tests pass stand-ins that move bytes between ranks in one thread).
 */
export async function ncclCollectivesOver(
  opts: NcclCollectivesOptions,
  libs: { readonly cu: NcclCudaCalls; readonly nccl: NcclLib; readonly errorName: (res: number) => string },
): Promise<NcclCollectives> {
  checkOptions(opts);
  const { rank, size, id, device = 0, initTimeoutMs = DEFAULT_INIT_TIMEOUT_MS, timeoutMs = DEFAULT_TIMEOUT_MS } = opts;
  const { cu, nccl } = libs;
  const check = (res: number, what: string) => {
    if (res !== 0) throw new CrispError(res === 2 ? 'OUT_OF_MEMORY' : 'BACKEND_ERROR', `${what} failed: ${libs.errorName(res)}`, { cuResult: res });
  };
  process.env.NCCL_NVLS_ENABLE ??= '0';
  // the device's primary context (the one the CUDA backend and NCCL's runtime calls use)
  check(cu.cuInit(0), 'cuInit');
  const dev = [0];
  check(cu.cuDeviceGet(dev, device), `cuDeviceGet(${device})`);
  const ctx = [null];
  check(cu.cuDevicePrimaryCtxRetain(ctx, dev[0]), 'cuDevicePrimaryCtxRetain');
  check(cu.cuCtxSetCurrent(ctx[0]), 'cuCtxSetCurrent');
  const stream = [null];
  check(cu.cuStreamCreate(stream, 1), 'cuStreamCreate');
  const comm = [null];
  let closed = false;
  const buffers = { send: { ptr: 0, bytes: 0 }, recv: { ptr: 0, bytes: 0 } };
  /** frees what this rank holds on the device; `abort`: the communicator by ncclCommAbort */
  const release = (abort: boolean) => {
    if (closed) return;
    closed = true;
    // (NCCL: a communicator is not to be touched once ncclCommDestroy has returned, whatever it returned)
    if (comm[0] !== null) (abort ? nccl.commAbort : nccl.commDestroy)(comm[0]);
    for (const b of Object.values(buffers)) if (b.ptr) cu.cuMemFree(b.ptr);
    cu.cuStreamDestroy(stream[0]);
    cu.cuDevicePrimaryCtxRelease(dev[0]);
  };
  /** aborts the communicator and throws a BACKEND_ERROR for `what` */
  const fail = (what: string, message: string, details: Record<string, unknown>): never => {
    release(true);
    throw new CrispError('BACKEND_ERROR', `${what}: ${message}; the NCCL communicator of rank ${rank} was aborted`, { rank, ...details });
  };
  const ncclFailed = (what: string, res: number): never => fail(what, `NCCL error ${res} (${String(nccl.errorString(res))})`, { ncclResult: res });
  const timedOut = (what: string, limit: number): never =>
    fail(what, `no answer from the other ranks within ${limit} ms (a rank not started, gone, or calling other collectives)`, { timedOut: true, timeoutMs: limit });
  const tick = () => new Promise<void>((resolve) => setImmediate(resolve));
  /** polls the communicator until its last call is done (ncclInProgress -> ncclSuccess) */
  const settled = async (what: string, deadline: number, limit: number): Promise<void> => {
    for (;;) {
      const state = [NCCL_IN_PROGRESS];
      const r = nccl.commGetAsyncError(comm[0], state);
      if (r !== 0) ncclFailed(`${what} (ncclCommGetAsyncError)`, r);
      if (state[0] === 0) return;
      if (state[0] !== NCCL_IN_PROGRESS) ncclFailed(what, state[0]);
      if (performance.now() > deadline) timedOut(what, limit);
      await tick();
    }
  };
  /** a call's result: done, still running (polled until done), or an error */
  const called = async (res: number, what: string, deadline: number, limit: number): Promise<void> => {
    if (res === NCCL_IN_PROGRESS) await settled(what, deadline, limit);
    else if (res !== 0) ncclFailed(what, res);
  };
  const joining = `ncclCommInitRankConfig(rank ${rank} of ${size})`;
  const config = {
    size: NCCL_CONFIG_V21700.bytes,
    magic: NCCL_CONFIG_V21700.magic,
    version: NCCL_CONFIG_V21700.version,
    blocking: 0,
    cgaClusterSize: NCCL_UNDEF_INT,
    minCTAs: NCCL_UNDEF_INT,
    maxCTAs: NCCL_UNDEF_INT,
    netName: null,
  };
  const init = nccl.commInitRankConfig(comm, size, { internal: id }, rank, config);
  if (init !== 0 && init !== NCCL_IN_PROGRESS) {
    // no communicator to abort when the call itself was refused
    if (comm[0] === null) {
      release(false);
      throw new CrispError('BACKEND_ERROR', `${joining} failed: NCCL error ${init} (${String(nccl.errorString(init))})`, { rank, ncclResult: init });
    }
    ncclFailed(joining, init);
  }
  await called(init, joining, performance.now() + initTimeoutMs, initTimeoutMs);

  // staging: one device buffer for what goes out, one for what comes in, grown as needed
  const ensure = (which: 'send' | 'recv', bytes: number): number => {
    const b = buffers[which];
    if (b.bytes >= bytes) return b.ptr;
    if (b.ptr) check(cu.cuMemFree(b.ptr), 'cuMemFree');
    b.ptr = 0;
    b.bytes = 0;
    const p = [0];
    const want = Math.max(256, 2 ** Math.ceil(Math.log2(bytes)));
    check(cu.cuMemAlloc(p, want), `cuMemAlloc(${want} bytes for NCCL staging)`);
    b.ptr = Number(p[0]);
    b.bytes = want;
    return b.ptr;
  };
  /** the stream's work done: cuStreamQuery polled between turns of the event loop, NCCL's state beside it */
  const finished = async (what: string, deadline: number): Promise<void> => {
    for (let turn = 0; ; turn++) {
      const r = cu.cuStreamQuery(stream[0]);
      if (r === 0) return;
      if (r !== CUDA_ERROR_NOT_READY) check(r, what);
      if (turn % 64 === 63) {
        // a peer lost mid-collective shows as the communicator's error, not on the stream
        const state = [0];
        if (nccl.commGetAsyncError(comm[0], state) === 0 && state[0] !== 0 && state[0] !== NCCL_IN_PROGRESS) ncclFailed(what, state[0]);
        if (performance.now() > deadline) timedOut(what, timeoutMs);
      }
      await tick();
    }
  };
  let busy = false;
  /** one collective at a time, on an open communicator (every rank calls them in order) */
  const enter = (what: string) => {
    if (closed) throw new CrispError('INVALID_ARGUMENT', `${what} on a closed NCCL communicator`);
    if (busy) throw new CrispError('INVALID_ARGUMENT', `${what} while another collective of this rank runs: await each before the next`);
    busy = true;
  };

  return {
    rank,
    size,
    async allGatherFixed(data: Uint8Array): Promise<Uint8Array> {
      enter('allGatherFixed');
      try {
        const len = data.byteLength;
        const out = new Uint8Array(len * size);
        if (len === 0) return out;
        const send = ensure('send', len);
        const recv = ensure('recv', len * size);
        check(cu.cuMemcpyHtoD(send, data, len), 'cuMemcpyHtoD (NCCL staging)');
        const deadline = performance.now() + timeoutMs;
        await called(nccl.allGather(send, recv, len, NCCL_UINT8, comm[0], stream[0]), 'ncclAllGather', deadline, timeoutMs);
        await finished('ncclAllGather', deadline);
        check(cu.cuMemcpyDtoH(out, recv, len * size), 'cuMemcpyDtoH (NCCL staging)');
        return out;
      } finally {
        busy = false;
      }
    },
    async exchange(parts: readonly Uint8Array[], recvBytes: readonly number[]): Promise<Uint8Array[]> {
      if (parts.length !== size || recvBytes.length !== size) {
        throw new InvalidArgumentError(`exchange needs ${size} parts and ${size} receive counts; got ${parts.length} and ${recvBytes.length}`);
      }
      enter('exchange');
      try {
        // one staging area each way, the parts at their offsets
        const sendOff: number[] = [];
        const recvOff: number[] = [];
        let sendTotal = 0;
        let recvTotal = 0;
        for (let s = 0; s < size; s++) {
          sendOff.push(sendTotal);
          recvOff.push(recvTotal);
          if (s === rank) continue;
          sendTotal += parts[s].byteLength;
          recvTotal += recvBytes[s];
        }
        const send = ensure('send', Math.max(1, sendTotal));
        const recv = ensure('recv', Math.max(1, recvTotal));
        for (let s = 0; s < size; s++) {
          if (s !== rank && parts[s].byteLength > 0) check(cu.cuMemcpyHtoD(send + sendOff[s], parts[s], parts[s].byteLength), 'cuMemcpyHtoD (NCCL staging)');
        }
        const deadline = performance.now() + timeoutMs;
        ncclCheck(nccl, nccl.groupStart(), 'ncclGroupStart');
        let ended: number;
        try {
          for (let s = 0; s < size; s++) {
            if (s === rank) continue;
            if (parts[s].byteLength > 0) ncclCheck(nccl, nccl.send(send + sendOff[s], parts[s].byteLength, NCCL_UINT8, s, comm[0], stream[0]), `ncclSend to rank ${s}`);
            if (recvBytes[s] > 0) ncclCheck(nccl, nccl.recv(recv + recvOff[s], recvBytes[s], NCCL_UINT8, s, comm[0], stream[0]), `ncclRecv from rank ${s}`);
          }
        } finally {
          ended = nccl.groupEnd();
        }
        await called(ended, 'ncclGroupEnd (sends and receives)', deadline, timeoutMs);
        await finished('ncclSend/ncclRecv', deadline);
        return Array.from({ length: size }, (_, s) => {
          const got = new Uint8Array(s === rank ? 0 : recvBytes[s]);
          if (got.byteLength > 0) check(cu.cuMemcpyDtoH(got, recv + recvOff[s], got.byteLength), 'cuMemcpyDtoH (NCCL staging)');
          return got;
        });
      } finally {
        busy = false;
      }
    },
    close() {
      release(false);
    },
  };
}
