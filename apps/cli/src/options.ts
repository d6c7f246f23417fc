/** Flag parsing helpers: every bad value is a UsageError (exit 2) that names the flag. */
import { DTYPES, type DType } from '@crisp/core';
import { UsageError } from './cli-io.js';

export function intFlag(flag: string, lo: number, hi: number) {
  return (raw: string): number => {
    const x = Number(raw);
    if (!/^[+-]?\d+$/.test(raw.trim()) || !Number.isSafeInteger(x) || x < lo || x > hi) {
      throw new UsageError(`${flag} must be an integer in [${lo}, ${hi}]; got '${raw}'`);
    }
    return x;
  };
}

export function numFlag(flag: string, lo: number, hi: number, open = false) {
  return (raw: string): number => {
    const x = Number(raw);
    const ok = raw.trim() !== '' && Number.isFinite(x) && (open ? x > lo && x < hi : x >= lo && x <= hi);
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
