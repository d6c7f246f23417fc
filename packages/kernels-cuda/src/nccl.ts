/**
 * NCCL through koffi, as the transport of a context-parallel prefill: one process per GPU,
 * each holding a `ncclCollectives` rank. The collectives move host bytes through device
 * staging buffers on a stream of their own (NCCL moves device memory): an all-gather of
 * equal parts (`ncclAllGather`) and point-to-point sends and receives in one group
 * (`ncclSend` / `ncclRecv`). `@crisp/parallel`'s `communicatorOver` turns them into the
 * Communicator `parallelPrefill` takes:
 *
 *   const id = ncclUniqueId();                       // on one process, passed to the others
 *   const comm = communicatorOver(ncclCollectives({ rank, size, id, device: rank }));
 *
 * The library is `libnccl.so.2` on the loader's path unless `library` or CRISP_NCCL_LIBRARY
 * names another (PyTorch's wheels carry it under nvidia/nccl/lib). NVLink multicast is left
 * off (NCCL_NVLS_ENABLE=0) unless the environment says otherwise.
 */
import { CrispError, InvalidArgumentError } from '@crisp/core';
import { type CudaLibs, cudaErrorName, type Handle, loadCuda } from './runtime/ffi.js';

// biome-ignore lint/suspicious/noExplicitAny: koffi's functions are untyped by nature
type Fn = (...args: any[]) => any;

/** The NCCL entry points the transport calls (koffi functions, or a test's stand-ins). */
export interface NcclLib {
  readonly getUniqueId: Fn;
  readonly commInitRank: Fn;
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
  let lib: Handle;
  const tried: string[] = [];
  for (const name of libraryNames(library)) {
    try {
      lib = koffi.load(name);
      break;
    } catch (e) {
      tried.push(`${name}: ${(e as Error).message.split('\n')[0]}`);
    }
  }
  if (!lib) {
    throw new CrispError('BACKEND_UNAVAILABLE', `NCCL did not load (${tried.join('; ')}); set CRISP_NCCL_LIBRARY to libnccl.so.2's path`, { tried });
  }
  if (!idTypeDeclared) {
    koffi.struct('crisp_ncclUniqueId', { internal: koffi.array('uint8_t', NCCL_UNIQUE_ID_BYTES, 'Typed') });
    idTypeDeclared = true;
  }
  const nccl: NcclLib = {
    getUniqueId: lib.func('int ncclGetUniqueId(_Out_ crisp_ncclUniqueId *id)'),
    commInitRank: lib.func('int ncclCommInitRank(_Out_ void **comm, int nranks, crisp_ncclUniqueId id, int rank)'),
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
 * Joins the NCCL group `id` as `rank` of `size` on CUDA device `device`: blocks until every
 * rank has joined (ncclCommInitRank). Every rank must then call the same collectives in the
 * same order; each resolves once its stream has finished (polled, so the process's event
 * loop runs while NCCL waits for the other ranks). `close()` destroys the communicator and
 * frees its staging buffers.
 */
export function ncclCollectives(opts: NcclCollectivesOptions): NcclCollectives {
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
}

/**
 * ncclCollectives over given entry points: the driver's calls, NCCL's, and a CUresult's name
 * (tests pass stand-ins that move bytes between ranks in one thread).
 */
export function ncclCollectivesOver(
  opts: NcclCollectivesOptions,
  libs: { readonly cu: NcclCudaCalls; readonly nccl: NcclLib; readonly errorName: (res: number) => string },
): NcclCollectives {
  checkOptions(opts);
  const { rank, size, id, device = 0 } = opts;
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
  ncclCheck(nccl, nccl.commInitRank(comm, size, { internal: id }, rank), `ncclCommInitRank(rank ${rank} of ${size})`);

  // staging: one device buffer for what goes out, one for what comes in, grown as needed
  const buffers = { send: { ptr: 0, bytes: 0 }, recv: { ptr: 0, bytes: 0 } };
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
  /** the stream's work done: cuStreamQuery polled between turns of the event loop */
  const finished = async (what: string): Promise<void> => {
    for (;;) {
      const r = cu.cuStreamQuery(stream[0]);
      if (r === 0) return;
      if (r !== CUDA_ERROR_NOT_READY) check(r, what);
      await new Promise<void>((resolve) => setImmediate(resolve));
    }
  };
  let closed = false;
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
        ncclCheck(nccl, nccl.allGather(send, recv, len, NCCL_UINT8, comm[0], stream[0]), 'ncclAllGather');
        await finished('ncclAllGather');
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
        ncclCheck(nccl, nccl.groupStart(), 'ncclGroupStart');
        try {
          for (let s = 0; s < size; s++) {
            if (s === rank) continue;
            if (parts[s].byteLength > 0) ncclCheck(nccl, nccl.send(send + sendOff[s], parts[s].byteLength, NCCL_UINT8, s, comm[0], stream[0]), `ncclSend to rank ${s}`);
            if (recvBytes[s] > 0) ncclCheck(nccl, nccl.recv(recv + recvOff[s], recvBytes[s], NCCL_UINT8, s, comm[0], stream[0]), `ncclRecv from rank ${s}`);
          }
        } finally {
          ncclCheck(nccl, nccl.groupEnd(), 'ncclGroupEnd');
        }
        await finished('ncclSend/ncclRecv');
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
      if (closed) return;
      closed = true;
      nccl.commDestroy(comm[0]);
      for (const b of Object.values(buffers)) if (b.ptr) cu.cuMemFree(b.ptr);
      cu.cuStreamDestroy(stream[0]);
      cu.cuDevicePrimaryCtxRelease(dev[0]);
    },
  };
}
