/**
 * Shared input checks for routers. Routers are public entry points: a user can hand them
 * statistics from any backend (or build them by hand), so lengths and finiteness are
 * checked before any decision is taken.
 *
 * Shape legend: H heads, Nb = ceil(n / B) blocks.
 */
import { describeValue, InvalidArgumentError, NonFiniteError, type ProxyStats, ShapeError } from '@crisp/core';

/** Throws unless `stats` has H >= 1 heads and the named per-head arrays have the right lengths and finite values. */
export function checkStats(
  stats: ProxyStats,
  router: string,
  fields: ReadonlyArray<'cStruct' | 'rowEntropy' | 'verticalBlocks' | 'pooledEstimate'>,
): void {
  if (!stats || typeof stats !== 'object') {
    throw new InvalidArgumentError(`router ${router}: stats must be the ProxyStats a backend's proxyStats() returned`);
  }
  const H = stats.heads;
  const Nb = stats.numBlocks;
  if (!Number.isInteger(H) || H < 1 || !Number.isInteger(Nb) || Nb < 1) {
    throw new ShapeError(`router ${router}: stats need positive integer heads and numBlocks; got ${H}, ${Nb}`);
  }
  for (const f of fields) {
    const a = stats[f];
    const perHead = f === 'cStruct' || f === 'rowEntropy' ? 1 : Nb;
    if (!a || a.length !== H * perHead) {
      throw new ShapeError(
        `router ${router}: stats.${f} must hold ${H * perHead} values (${H} heads${perHead > 1 ? ` x ${Nb} blocks` : ''}); got ${a?.length}`,
      );
    }
    for (let i = 0; i < a.length; i++) {
      if (!Number.isFinite(a[i])) {
        throw new NonFiniteError(
          `router ${router}: stats.${f}[${i}] is ${a[i]}; q or k holds NaN/Inf or the softmax overflowed`,
          { statistic: f, index: i },
        );
      }
    }
  }
}

/** A finite number in (lo, hi) (open) or [lo, hi] where `closed`; else InvalidArgumentError naming the parameter. */
export function checkRange(value: unknown, name: string, lo: number, hi: number, how: string): number {
  if (typeof value !== 'number' || !Number.isFinite(value) || value <= lo || value >= hi) {
    throw new InvalidArgumentError(`${name} must be ${how}; got ${describeValue(value)}`, { [name]: value });
  }
  return value;
}

/** A positive integer token count; else InvalidArgumentError. */
export function checkPositiveInt(value: unknown, name: string): number {
  if (typeof value !== 'number' || !Number.isInteger(value) || value < 1) {
    throw new InvalidArgumentError(`${name} must be a positive integer (tokens); got ${describeValue(value)}`, { [name]: value });
  }
  return value;
}
