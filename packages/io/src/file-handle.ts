/**
 * Thin wrappers over Node's fs/promises file handles: exact positional reads and writes
 * (looping over short transfers) with Node errors turned into typed CrispErrors.
 */
import { open, type FileHandle } from 'node:fs/promises';
import { endianness } from 'node:os';
import { CrispError, UnsupportedError } from '@crisp/core';

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
          : code === 'ENOSPC'
            ? 'the disk is full: free space or write elsewhere'
            : msg;
  return new CrispError('IO_ERROR', `cannot ${action} ${path}: ${hint}`, { path, errno: code });
}

export async function openForRead(path: string): Promise<{ handle: FileHandle; size: number }> {
  let handle: FileHandle;
  try {
    handle = await open(path, 'r');
  } catch (e) {
    throw ioError(e, 'open', path);
  }
  try {
    const st = await handle.stat();
    if (!st.isFile()) {
      throw new CrispError('IO_ERROR', `cannot read ${path}: it is not a regular file`, { path });
    }
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
    done += bytesWritten;
  }
}

/** A byte view over a typed array's storage (no copy). */
export function bytesOf(a: ArrayBufferView): Uint8Array {
  return new Uint8Array(a.buffer, a.byteOffset, a.byteLength);
}
