// Shared helpers of the hostile-input suite: exact error codes, hang guards, special files
// and "nothing was written" checks.
import { execFileSync } from 'node:child_process';
import { closeSync, constants, openSync } from 'node:fs';
import { readdir } from 'node:fs/promises';
import { type CrispErrorCode, isCrispError } from '@crisp/core';
import { expect } from 'vitest';
import { SEED } from '../helpers.js';

/** Rejects with a clear failure when `p` has not settled after `ms` (a hang is a defect). */
export async function settlesWithin<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const hang = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`HUNG: ${what} did not settle within ${ms} ms`)), ms);
  });
  try {
    return await Promise.race([p, hang]);
  } finally {
    clearTimeout(timer);
  }
}

/** The error `p` (or a thunk) ends in, or undefined when it succeeds. */
export async function caught(p: Promise<unknown> | (() => unknown), ms = 10_000): Promise<unknown> {
  try {
    const run = typeof p === 'function' ? Promise.resolve().then(p) : p;
    await settlesWithin(run, ms, 'the call');
  } catch (e) {
    return e;
  }
  return undefined;
}

/** Asserts a CrispError with exactly `code` (and a message matching `message`, when given). */
export async function expectCode(
  p: Promise<unknown> | (() => unknown),
  code: CrispErrorCode,
  message?: RegExp,
  ms?: number,
): Promise<Error> {
  const e = await caught(p, ms);
  expect(isCrispError(e, code), `expected ${code}, got ${e instanceof Error ? `${e.name}: ${e.message}` : String(e)} (seed ${SEED})`).toBe(
    true,
  );
  if (message !== undefined) expect((e as Error).message).toMatch(message);
  return e as Error;
}

/** Makes a FIFO, or returns false (with the reason printed) where mkfifo is unavailable. */
export function makeFifo(path: string): boolean {
  try {
    execFileSync('mkfifo', [path]);
    return true;
  } catch (e) {
    console.warn(`[hostile] skipped a FIFO case: mkfifo failed (${(e as Error).message})`);
    return false;
  }
}

/** Makes a character device node equal to /dev/null (root only), or returns false. */
export function makeCharDevice(path: string): boolean {
  try {
    execFileSync('mknod', [path, 'c', '1', '3'], { stdio: 'ignore' });
    return true;
  } catch (e) {
    console.warn(`[hostile] skipped a device-node case: mknod failed (${(e as Error).message})`);
    return false;
  }
}

/** Names in `dir` that a writer may have left behind (temporary or partial files). */
export async function leftovers(dir: string): Promise<string[]> {
  return (await readdir(dir)).filter((f) => f.includes('.partial') || f.includes('.crisp-tmp'));
}

/**
 * Releases a reader stuck opening `path` (a FIFO): a non-blocking open for writing succeeds
 * only when a reader waits, and closing it gives that reader end-of-file at once.
 */
export function releaseFifo(path: string): void {
  try {
    closeSync(openSync(path, constants.O_WRONLY | constants.O_NONBLOCK));
  } catch {
    // ENXIO: nobody was waiting
  }
}
