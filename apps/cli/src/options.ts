/** Flag parsing helpers: every bad value is a UsageError (exit 2) that names the flag. */
import { DTYPES, type DType } from '@crisp/core';
import { type Layout, parseLayout } from '@crisp/io';
import { UsageError } from './cli-io.js';

const INT = /^[+-]?\d+$/;
// Plain decimal numbers only: no hex/octal/binary literals, no 'Infinity', no empty string.
const DECIMAL = /^[+-]?(\d+\.?\d*|\.\d+)(e[+-]?\d+)?$/i;

export function intFlag(flag: string, lo: number, hi: number) {
  return (raw: string): number => {
    const s = raw.trim();
    const x = Number(s);
    if (!INT.test(s) || !Number.isSafeInteger(x) || x < lo || x > hi) {
      throw new UsageError(`${flag} must be an integer in [${lo}, ${hi}]; got '${raw}'`);
    }
    return x === 0 ? 0 : x; // -0 reads as 0
  };
}

export function numFlag(flag: string, lo: number, hi: number, open = false) {
  return (raw: string): number => {
    const s = raw.trim();
    const x = Number(s);
    const ok = DECIMAL.test(s) && Number.isFinite(x) && (open ? x > lo && x < hi : x >= lo && x <= hi);
    if (!ok) throw new UsageError(`${flag} must be a number in ${open ? '(' : '['}${lo}, ${hi}${open ? ')' : ']'}; got '${raw}'`);
    return x;
  };
}

export function choiceFlag<T extends string>(flag: string, choices: readonly T[]) {
  return (raw: string): T => {
    if (!(choices as readonly string[]).includes(raw)) {
      throw new UsageError(`${flag} must be one of ${choices.join(', ')}; got '${raw}'`);
    }
    return raw as T;
  };
}

export const dtypeFlag = choiceFlag<DType>('--dtype', DTYPES);

/** --layout: nhd, 1nhd or hnd, or the shapes they stand for ('[n,H,d]', '[1,n,H,d]', '[H,n,d]'). */
export function layoutFlag(raw: string): Layout {
  try {
    return parseLayout(raw);
  } catch {
    throw new UsageError(`--layout must be one of nhd ([n,H,d]), 1nhd ([1,n,H,d]) or hnd ([H,n,d]); got '${raw}'`);
  }
}

/** A path flag: never empty or blank (an empty path would silently mean "no file"). */
export function pathFlag(flag: string, what: string) {
  return (raw: string): string => {
    if (raw.trim() === '') throw new UsageError(`${flag} needs ${what}; got '${raw}'`);
    if (raw.includes('\0')) throw new UsageError(`${flag} holds a NUL character; give a real path`);
    return raw;
  };
}

export interface QkvNameFlags {
  readonly q?: string;
  readonly k?: string;
  readonly v?: string;
}

/** `--names q=NAME,k=NAME,v=NAME`: any of the three, each at most once. */
export function namesFlag(raw: string): QkvNameFlags {
  const out: Record<string, string> = {};
  const fail = (why: string): never => {
    throw new UsageError(`--names takes q=NAME,k=NAME,v=NAME (any of the three); ${why}; got '${raw}'`);
  };
  if (raw.trim() === '') fail('it is empty');
  for (const part of raw.split(',')) {
    const eq = part.indexOf('=');
    if (eq < 0) fail(`'${part}' has no '='`);
    const role = part.slice(0, eq).trim();
    const name = part.slice(eq + 1).trim();
    if (role !== 'q' && role !== 'k' && role !== 'v') fail(`'${role}' is not q, k or v`);
    if (name === '') fail(`${role} has an empty name`);
    if (out[role] !== undefined) fail(`${role} is given twice`);
    out[role] = name;
  }
  return out;
}
