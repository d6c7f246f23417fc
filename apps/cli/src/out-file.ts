/**
 * Files the command writes (`crisp report --out`): the path is checked before any work, and
 * the file is written whole or not at all: into a temporary file next to the target, then
 * renamed over it. Only a regular file is ever replaced (never a directory, device, FIFO or
 * socket); a symbolic link to a regular file is followed, so the link stays.
 */
import { constants } from 'node:fs';
import { access, lstat, open, realpath, rename, stat, unlink } from 'node:fs/promises';
import { basename, dirname, join, resolve } from 'node:path';
import { CrispError } from '@crisp/core';
import { UsageError } from './cli-io.js';

type Stats = Awaited<ReturnType<typeof stat>>;

function kindOf(st: Stats): string {
  if (st.isDirectory()) return 'a directory';
  if (st.isFIFO()) return 'a FIFO (named pipe)';
  if (st.isCharacterDevice()) return 'a character device';
  if (st.isBlockDevice()) return 'a block device';
  if (st.isSocket()) return 'a socket';
  return 'not a regular file';
}

function errno(e: unknown): string | undefined {
  return (e as NodeJS.ErrnoException | undefined)?.code;
}

function why(e: unknown): string {
  const code = errno(e);
  if (code === 'ENOENT') return 'no such file or directory';
  if (code === 'EACCES' || code === 'EPERM') return 'permission denied';
  if (code === 'ENOSPC') return 'the disk is full';
  if (code === 'EROFS') return 'the file system is read-only';
  if (code === 'EDQUOT') return 'the disk quota is used up';
  if (code === 'ENAMETOOLONG') return 'the name is too long';
  if (code === 'ENOTDIR') return 'a part of the path is not a directory';
  return e instanceof Error ? e.message : String(e);
}

/**
 * Resolves `raw` to the regular file to write, or throws: a usage error for an empty path,
 * IO_ERROR (naming `flag`) when the target is not a regular file or its directory is
 * missing or not writable (`example`: the file name its errors suggest). Nothing is created.
 */
export async function checkOutputPath(flag: string, raw: string, example = 'crisp-report.html'): Promise<string> {
  if (raw.trim() === '') throw new UsageError(`${flag} needs a file path; got '${raw}'`);
  if (raw.includes('\0')) throw new UsageError(`${flag} holds a NUL character; give a real path`);
  const fail = (msg: string, path: string) => new CrispError('IO_ERROR', `cannot write ${path} (${flag}): ${msg}; pick another ${flag}`, { path });
  let path = resolve(raw);
  if (/[/\\]$/.test(raw)) throw fail(`it names a directory; give a file path such as ${join(path, example)}`, path);
  let target: Stats | undefined;
  try {
    const link = await lstat(path);
    if (link.isSymbolicLink()) {
      try {
        path = await realpath(path);
      } catch (e) {
        throw fail(`it is a symbolic link to a missing or unreachable target (${why(e)})`, path);
      }
    }
    target = await stat(path);
  } catch (e) {
    if (e instanceof CrispError) throw e;
    if (errno(e) !== 'ENOENT') throw fail(why(e), path);
  }
  if (target?.isDirectory()) throw fail(`it is a directory; give a file path such as ${join(path, example)}`, path);
  if (target && !target.isFile()) throw fail(`it is ${kindOf(target)}, not a regular file: only regular files are written`, path);
  if (target) {
    try {
      await access(path, constants.W_OK);
    } catch (e) {
      throw fail(`the file exists and is not writable (${why(e)})`, path);
    }
  }
  const dir = dirname(path);
  let dirSt: Stats;
  try {
    dirSt = await stat(dir);
  } catch (e) {
    throw fail(`its directory ${dir} does not exist or cannot be reached (${why(e)}); create it first`, path);
  }
  if (!dirSt.isDirectory()) throw fail(`${dir} is not a directory`, path);
  try {
    await access(dir, constants.W_OK | constants.X_OK);
  } catch (e) {
    throw fail(`its directory ${dir} is not writable (${why(e)})`, path);
  }
  return path;
}

/**
 * Writes `data` to `path` (from checkOutputPath) all at once: a temporary file in the same
 * directory, flushed, then renamed over the target. On any failure the temporary file is
 * removed and the target is left as it was.
 */
export async function writeFileAtomic(flag: string, path: string, data: string | Uint8Array): Promise<void> {
  const dir = dirname(path);
  const tmp = join(dir, `.${basename(path)}.${process.pid}.${Math.random().toString(36).slice(2, 10)}.tmp`);
  let created = false;
  try {
    const h = await open(tmp, 'wx', 0o666);
    created = true;
    try {
      await h.writeFile(data);
      await h.sync();
    } finally {
      await h.close();
    }
    // The target may have changed since the check: still only a regular file is replaced.
    const now = await stat(path).catch((e) => (errno(e) === 'ENOENT' ? undefined : Promise.reject(e)));
    if (now && !now.isFile()) {
      throw new CrispError('IO_ERROR', `cannot write ${path} (${flag}): it is now ${kindOf(now)}, not a regular file; pick another ${flag}`, { path });
    }
    await rename(tmp, path);
    created = false;
  } catch (e) {
    if (e instanceof CrispError) throw e;
    throw new CrispError('IO_ERROR', `cannot write ${path} (${flag}): ${why(e)}; free space or pick another ${flag}`, { path, errno: errno(e) });
  } finally {
    if (created) await unlink(tmp).catch(() => undefined);
  }
}
