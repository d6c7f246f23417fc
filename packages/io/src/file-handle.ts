/**
 * Thin wrappers over Node's fs/promises file handles: exact positional reads and writes
 * (looping over short transfers) with Node errors turned into typed CrispErrors. Only
 * regular files are opened for reading: a FIFO, socket or device is refused before open,
 * and the open itself never blocks (O_NONBLOCK), so a path swapped for a FIFO cannot hang.
 */
import type { Stats } from 'node:fs';
import { constants } from 'node:fs';
import { type FileHandle, open, stat } from 'node:fs/promises';
import { endianness } from 'node:os';
import { CrispError, InvalidArgumentError, UnsupportedError } from '@crisp/core';

/** Every on-disk format here is little-endian; typed-array views use host order. */
export function assertLittleEndianHost(): void {
  if (endianness() !== 'LE') {
    throw new UnsupportedError('@crisp/io needs a little-endian host (safetensors and .npy data here are little-endian)');
  }
}

/** Largest single read/write request (Node caps one call near 2 GiB). */
const MAX_IO = 1 << 30;

export function formatError(message: string, details?: Record<string, unknown>): CrispError {
  return new CrispError('FORMAT_ERROR', message, details);
}

/** A path argument must be a non-empty string without NUL bytes. */
export function assertPath(path: unknown, what = 'path'): asserts path is string {
  if (typeof path !== 'string' || path.length === 0) {
    throw new InvalidArgumentError(
      `${what} must be a non-empty string (a file or directory path); got ${path === '' ? "''" : describeValue(path)}`,
    );
  }
  if (path.includes('\0')) {
    throw new InvalidArgumentError(`${what} ${JSON.stringify(path)} contains a NUL byte; give a real path`);
  }
}

/** A short description of any value for messages (never throws). */
export function describeValue(x: unknown): string {
  if (x === null) return 'null';
  if (typeof x === 'string') return JSON.stringify(x.length > 60 ? `${x.slice(0, 60)}...` : x);
  if (typeof x === 'number' || typeof x === 'boolean' || typeof x === 'bigint' || x === undefined) return String(x);
  if (typeof x === 'function') return 'a function';
  if (Array.isArray(x)) return `an array of ${x.length}`;
  const name = (x as { constructor?: { name?: unknown } }).constructor?.name;
  return typeof name === 'string' && name !== 'Object' ? `a ${name}` : 'an object';
}

/** What a non-regular path is, in words. */
export function kindOf(st: Stats): string {
  if (st.isDirectory()) return 'a directory';
  if (st.isFIFO()) return 'a FIFO (named pipe)';
  if (st.isSocket()) return 'a socket';
  if (st.isCharacterDevice()) return 'a character device';
  if (st.isBlockDevice()) return 'a block device';
  if (st.isSymbolicLink()) return 'a symbolic link';
  return st.isFile() ? 'a regular file' : 'not a regular file';
}

/** Turns a Node fs error into an IO_ERROR whose message says what to check. */
export function ioError(e: unknown, action: string, path: string): CrispError {
  if (e instanceof CrispError) return e;
  const code = (e as NodeJS.ErrnoException | undefined)?.code;
  const msg = e instanceof Error ? e.message : String(e);
  const hint =
    code === 'ENOENT'
      ? 'no such file or directory: check the path'
      : code === 'EACCES' || code === 'EPERM'
        ? 'permission denied: check the file permissions'
        : code === 'EISDIR'
          ? 'it is a directory, not a file'
          : code === 'ENOTDIR'
            ? 'a part of the path is not a directory: check the path'
            : code === 'ELOOP'
              ? 'too many levels of symbolic links (a symlink loop): fix the link'
              : code === 'ENAMETOOLONG'
                ? 'the path is too long'
                : code === 'ENOSPC'
                  ? 'the disk is full: free space or write elsewhere'
                  : code === 'EDQUOT'
                    ? 'the disk quota is exhausted: free space or write elsewhere'
                    : code === 'EROFS'
                      ? 'the file system is read-only: write elsewhere'
                      : code === 'EMFILE' || code === 'ENFILE'
                        ? 'too many open files: close some, or raise the limit (ulimit -n)'
                        : code === 'EIO'
                          ? 'an input/output error from the device: check the disk'
                          : msg;
  return new CrispError('IO_ERROR', `cannot ${action} ${path}: ${hint}`, { path, errno: code });
}

function notRegular(path: string, st: Stats, action = 'read'): CrispError {
  return new CrispError(
    'IO_ERROR',
    `cannot ${action} ${path}: it is ${kindOf(st)}, not a regular file; give the path of a .safetensors or .npy file`,
    { path, kind: kindOf(st) },
  );
}

/**
 * Opens a regular file for reading. Refuses directories, FIFOs, sockets and devices
 * (IO_ERROR naming what the path is) without blocking on them; symlinks to regular files
 * are followed.
 */
export async function openForRead(path: string): Promise<{ handle: FileHandle; size: number }> {
  assertPath(path);
  let before: Stats;
  try {
    before = await stat(path);
  } catch (e) {
    throw ioError(e, 'open', path);
  }
  if (!before.isFile()) throw notRegular(path, before);
  let handle: FileHandle;
  try {
    // O_NONBLOCK: if the path became a FIFO after the stat, open returns instead of
    // waiting for a writer; the fstat below then refuses it.
    handle = await open(path, constants.O_RDONLY | constants.O_NONBLOCK);
  } catch (e) {
    throw ioError(e, 'open', path);
  }
  try {
    const st = await handle.stat();
    if (!st.isFile()) throw notRegular(path, st);
    return { handle, size: st.size };
  } catch (e) {
    await handle.close().catch(() => undefined);
    throw ioError(e, 'stat', path);
  }
}

/** Fills `target` from `position`; a file that ends early is a FORMAT_ERROR (truncated). */
export async function readExactly(handle: FileHandle, target: Uint8Array, position: number, path: string): Promise<void> {
  let done = 0;
  while (done < target.length) {
    let bytesRead: number;
    try {
      ({ bytesRead } = await handle.read(target, done, Math.min(target.length - done, MAX_IO), position + done));
    } catch (e) {
      throw ioError(e, 'read', path);
    }
    if (bytesRead === 0) {
      throw formatError(
        `${path} ended at byte ${position + done} while ${target.length - done} more bytes were expected: the file is truncated (or shrank while being read); re-copy or re-export it`,
        { path, position: position + done },
      );
    }
    done += bytesRead;
  }
}

/** Writes all of `bytes` at `position`. */
export async function writeFully(handle: FileHandle, bytes: Uint8Array, position: number, path: string): Promise<void> {
  let done = 0;
  while (done < bytes.length) {
    let bytesWritten: number;
    try {
      ({ bytesWritten } = await handle.write(bytes, done, Math.min(bytes.length - done, MAX_IO), position + done));
    } catch (e) {
      throw ioError(e, 'write', path);
    }
    if (bytesWritten === 0) {
      throw new CrispError('IO_ERROR', `cannot write ${path}: the file system accepted no bytes (is the disk full?)`, { path });
    }
    done += bytesWritten;
  }
}

/** A byte view over a typed array's storage (no copy). */
export function bytesOf(a: ArrayBufferView): Uint8Array {
  return new Uint8Array(a.buffer, a.byteOffset, a.byteLength);
}

/**
 * Runs every task to completion before reporting the first failure: no read is still in
 * flight when the caller goes on to close the file, and no rejection goes unobserved.
 */
export async function settleAll(tasks: readonly Promise<unknown>[]): Promise<void> {
  const results = await Promise.allSettled(tasks);
  const failed = results.find((r): r is PromiseRejectedResult => r.status === 'rejected');
  if (failed !== undefined) throw failed.reason;
}
