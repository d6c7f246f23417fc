/**
 * Q/K/V for a run: a @crisp/synth scenario (seeded, with ground truth) streamed onto the
 * backend, or, where a backend can fill a structured layer on the device (CUDA's
 * fillLlamaLike), that fill: host generation of 512k x 32 heads would take longer than the
 * attention it feeds.
 */
import { type Backend, type DeviceTensor, type DType, type HostTensor, castHost, type ProxyStats, type ProxyStatsOptions, type PeRowsOptions, type BlockRows } from '@crisp/core';
import { type ProfileName, type Scenario, scenario, uploadScenario } from '@crisp/synth';
import type { Shape } from './config.js';
import { uploadLlamaFill } from './llama-fill.js';
import { synthThreads, synthWorkerEntry, uploadScenarioParallel } from '@crisp/synth/node';

/** Scenarios this long or longer are generated on worker threads (shorter ones take seconds). */
const PARALLEL_SYNTH_MIN_N = 32768;

export interface DeviceInputs {
  readonly q: DeviceTensor;
  readonly k: DeviceTensor;
  readonly v: DeviceTensor;
  /** where the values came from, for the report */
  readonly source: string;
  dispose(): void;
}

/** q, k, v with where they came from, disposed together. */
function deviceInputs(t: { readonly q: DeviceTensor; readonly k: DeviceTensor; readonly v: DeviceTensor }, source: string): DeviceInputs {
  const { q, k, v } = t;
  return {
    q,
    k,
    v,
    source,
    dispose: () => {
      for (const x of [q, k, v]) x.dispose();
    },
  };
}

interface DeviceFill {
  fillLlamaLike(q: DeviceTensor, k: DeviceTensor, v: DeviceTensor, seed: number): void;
}

function hasDeviceFill(b: Backend): b is Backend & DeviceFill {
  return typeof (b as Partial<DeviceFill>).fillLlamaLike === 'function';
}

/** Values in q, k and v together. */
export function inputValues(n: number, s: Shape): number {
  return n * (s.heads + 2 * s.kvHeads) * s.headDim;
}

export function makeScenario(profile: ProfileName, n: number, s: Shape, seed: number, dtype: DType = 'f32'): Scenario {
  return scenario(profile, { n, heads: s.heads, kvHeads: s.kvHeads, headDim: s.headDim, seed, dtype });
}

/**
 * Latency inputs: the device fill when the backend has one and the profile is llama-like,
 * else the scenario streamed from the host, or above maxHostValues the fast host port of the
 * same fill.
 */
export async function latencyInputs(
  b: Backend,
  profile: ProfileName,
  n: number,
  s: Shape,
  dtype: DType,
  seed: number,
  maxHostValues: number,
  kind: 'auto' | 'fill' | 'synth' = 'auto',
  onProgress?: (rowsDone: number, n: number) => void,
  threads: number = synthThreads(),
): Promise<DeviceInputs> {
  if (profile === 'llama-like' && kind !== 'synth' && hasDeviceFill(b)) {
    const q = b.allocate(dtype, [n, s.heads, s.headDim]);
    const k = b.allocate(dtype, [n, s.kvHeads, s.headDim]);
    const v = b.allocate(dtype, [n, s.kvHeads, s.headDim]);
    b.fillLlamaLike(q, k, v, seed);
    await b.synchronize();
    return deviceInputs({ q, k, v }, `${b.name} device fill (fillLlamaLike, seed ${seed})`);
  }
  const values = inputValues(n, s);
  if (kind === 'synth' && values > maxHostValues) {
    throw new SkipError(`host generation of ${(values / 1e6).toFixed(0)}M values is over --max-host-values ${maxHostValues}`);
  }
  if (kind === 'fill' || (kind === 'auto' && values > maxHostValues)) {
    if (s.headDim < 48) {
      throw new SkipError(
        `host generation of ${(values / 1e6).toFixed(0)}M values is over --max-host-values ${maxHostValues}, and the fast llama fill needs d >= 48`,
      );
    }
    // The scenario generator is too slow at this size: the fast port of CUDA's fill instead.
    const t = await uploadLlamaFill(b, n, s.heads, s.kvHeads, s.headDim, dtype, seed, onProgress);
    return deviceInputs(t, `llama fill (TypeScript port of kernels-cuda's fillLlamaLike, seed ${seed})`);
  }
  // Long scenarios on worker threads where the entry supports them (the bench's bundle and
  // build do): the same values, generated in parallel.
  const workerUrl = synthWorkerEntry();
  let how = '';
  if (workerUrl && threads > 1 && n >= PARALLEL_SYNTH_MIN_N) {
    const spec = { profile, n, heads: s.heads, kvHeads: s.kvHeads, headDim: s.headDim, seed, dtype };
    try {
      const t = await uploadScenarioParallel(b, spec, { threads, workerUrl, onProgress });
      return deviceInputs(t, `@crisp/synth ${profile} (seed ${seed}), generated on ${threads} host threads`);
    } catch (e) {
      how = ` on one thread (worker threads failed: ${e instanceof Error ? e.message : String(e)})`;
    }
  }
  const sc = makeScenario(profile, n, s, seed, dtype);
  const t = await uploadScenario(b, sc, { onProgress });
  return deviceInputs(t, `@crisp/synth ${profile} (seed ${seed}), streamed from the host${how}`);
}

/**
 * Progress of a long input generation as log lines (the bench's output is often a file, so no
 * bar): one line each time `everyMs` more has passed, none for inputs made quicker than that
 * (512k synth streams from the host for ~2 minutes).
 */
export function inputsProgress(
  log: (message: string) => void,
  label: string,
  everyMs = 10_000,
  now: () => number = () => performance.now(),
): (rowsDone: number, n: number) => void {
  const t0 = now();
  let next = t0 + everyMs;
  return (rowsDone, n) => {
    const t = now();
    if (t < next || rowsDone >= n) return;
    next = t + everyMs;
    log(`${label}: inputs ${Math.floor((100 * rowsDone) / n)}% (${rowsDone} of ${n} rows, ${((t - t0) / 1000).toFixed(0)} s)`);
  };
}

/** A size skipped for a stated reason (budget, memory, generation limit): reported, not fatal. */
export class SkipError extends Error {}

/** Host q, k, v of a scenario, in f32, plus the same cast to the dtype a backend needs. */
export function hostInputs(sc: Scenario): { q: HostTensor; k: HostTensor; v: HostTensor } {
  const c = sc.rows(0, sc.n);
  return { q: c.q, k: c.k, v: c.v };
}

export function uploadHost(b: Backend, t: { q: HostTensor; k: HostTensor; v: HostTensor }, dtype: DType): DeviceInputs {
  const up = (x: HostTensor) => b.upload(x.dtype === dtype ? x : castHost(x, dtype));
  const q = up(t.q);
  const k = up(t.k);
  const v = up(t.v);
  return deviceInputs({ q, k, v }, 'host');
}

/**
 * A backend whose proxy statistics and PE rows are computed once and reused: every policy
 * compared on the same inputs sees the very same statistics (as in one model run), and the
 * O(n) statistics pass runs once instead of once per policy. Token scores are always asked
 * for, so selectors that need them (γ coverage) and those that do not share one pass.
 */
export function cachingBackend(b: Backend): Backend {
  let stats: Promise<ProxyStats> | undefined;
  let statsKey = '';
  const rows = new Map<string, Promise<BlockRows>>();
  return new Proxy(b, {
    get(target, prop, receiver) {
      if (prop === 'proxyStats') {
        return (q: DeviceTensor, k: DeviceTensor, o: ProxyStatsOptions) => {
          const key = `${o.blockSize}/${o.wSink}/${o.wLocal}/${o.scale}`;
          if (!stats || key !== statsKey) {
            statsKey = key;
            rows.clear();
            // shared by every policy: all the statistics, whatever the first one's router reads
            const { optionalStats: _first, ...all } = o;
            stats = target.proxyStats(q, k, { ...all, tokenScores: true });
          }
          return stats;
        };
      }
      if (prop === 'peBlockRows') {
        return (q: DeviceTensor, k: DeviceTensor, o: PeRowsOptions) => {
          const key = `${o.blockSize}/${o.gamma}/${o.scale}/${o.heads.join(',')}`;
          let r = rows.get(key);
          if (!r) {
            r = target.peBlockRows(q, k, o);
            rows.set(key, r);
          }
          return r;
        };
      }
      const v = Reflect.get(target, prop, receiver);
      return typeof v === 'function' ? v.bind(target) : v;
    },
  });
}
