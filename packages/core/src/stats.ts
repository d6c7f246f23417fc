/**
 * Proxy statistics: what a backend reduces from the proxy attention map
 * Â[h] = softmax_j(Q̂ K_hᵀ · scale), Q̂ = the last b = min(B, n) queries, causal, fp32 or
 * better. Backends compute these in fused passes and never materialise Â.
 *
 * Shape legend: H heads, n keys, B block size, Nb = ceil(n / B).
 */
import { InvalidArgumentError, NonFiniteError } from './errors.js';

/**
 * The statistics a router may read that only some routers need: the row entropy (the entropy
 * router) and the pooled estimate (FlexPrefill's JSD router; it needs the key block means).
 */
export type OptionalStat = 'rowEntropy' | 'pooledEstimate';
export const OPTIONAL_STATS: readonly OptionalStat[] = Object.freeze(['rowEntropy', 'pooledEstimate']);

/**
 * The optional statistics asked for (`ProxyStatsOptions.optionalStats`; all of them when
 * absent), checked: anything but a list of OptionalStat names is an InvalidArgumentError.
 * `what` names the setting in the message.
 */
export function wantedOptionalStats(given: unknown, what = 'optionalStats'): readonly OptionalStat[] {
  if (given === undefined) return OPTIONAL_STATS;
  if (!Array.isArray(given) || given.some((x) => !OPTIONAL_STATS.includes(x))) {
    throw new InvalidArgumentError(`${what} must list some of ${OPTIONAL_STATS.join(', ')}; got ${JSON.stringify(given)}`);
  }
  return given;
}

/**
 * proxyStats' sink and local windows: non-negative integer token counts, else an
 * InvalidArgumentError (every backend checks its options with this before any work).
 */
export function assertStatsWindows(opts: { readonly wSink: unknown; readonly wLocal: unknown }): void {
  // (two calls, no loop over pairs: this runs on a prefill's host path before its first launch)
  assertWindow('wSink', opts.wSink);
  assertWindow('wLocal', opts.wLocal);
}

function assertWindow(key: string, w: unknown): void {
  if (typeof w !== 'number' || !Number.isInteger(w) || w < 0) {
    throw new InvalidArgumentError(`${key} must be a non-negative integer number of tokens; got ${String(w)}`);
  }
}

export interface ProxyStatsOptions {
  readonly blockSize: number;
  /** tokens counted as the sink for C_struct (default 128) */
  readonly wSink: number;
  /** tokens counted as the local window for C_struct (default 128) */
  readonly wLocal: number;
  /** softmax scale, default 1/sqrt(d) */
  readonly scale?: number;
  /**
   * Also compute the token-level scores a_v and a_s (O(H n) floats; FlexPrefill's coverage
   * needs them). `'device'`: for a device plan whose selection reads them where they are
   * (`deferRead`); a backend whose reads are asynchronous (WebGPU) then does not copy them to
   * the host, and the statistics hold no `verticalTokens` / `slashTokens`. Other backends
   * treat it as `true`.
   */
  readonly tokenScores?: boolean | 'device';
  /**
   * Queue the work and return without waiting for it: `cStruct`, `rowEntropy` and `finite`
   * (and the block statistics) are read from the device on first access, which waits for the
   * device. For plans routed on the device (`Backend.planner`), which read them only
   * at the end; a non-finite statistic then shows as `finite: false` instead of a throw.
   * A backend whose reads are asynchronous (WebGPU) cannot read on first access: its
   * deferred statistics have `settle()`, which must resolve before any field is read.
   * Backends that cannot defer ignore it.
   */
  readonly deferRead?: boolean;
  /**
   * The optional statistics (OptionalStat) the caller will read; default all of them. A
   * backend may skip the others in its passes (the CUDA backend's proxy pass skips the key
   * block means and the entropy sums when neither is asked for), and then computes them when
   * first read, which costs another pass over the keys and needs q and k unchanged. Every
   * field is always there.
   */
  readonly optionalStats?: readonly OptionalStat[];
}

export interface ProxyStats {
  readonly n: number;
  readonly heads: number;
  readonly blockSize: number;
  readonly numBlocks: number;
  /** b, the number of proxy query rows */
  readonly proxyRows: number;
  /** [H] anchor mass C_struct = mean_i(Σ_{j<wSink} Â[i,j] + Σ_{j>=n-wLocal} Â[i,j]) */
  readonly cStruct: Float64Array;
  /** [H * Nb] vertical block scores p_v[J] = Σ_{j in J} mean_i Â[i,j] (each head sums to 1) */
  readonly verticalBlocks: Float64Array;
  /** [H * Nb] slash block scores p_s[O] by offset block O (O = 0: the diagonal / local window) */
  readonly slashBlocks: Float64Array;
  /** [H * Nb] FlexPrefill's pooled estimate ā = softmax_J(mean_i(Q̂_i) · K̄_J · scale) */
  readonly pooledEstimate: Float64Array;
  /** [H] mean over proxy rows of the Shannon entropy (nats) of Â's rows; exp() is the effective support */
  readonly rowEntropy: Float64Array;
  /** [H * n] a_v[j], only when asked for */
  readonly verticalTokens?: Float32Array;
  /** [H * n] a_s[o] by offset o, only when asked for */
  readonly slashTokens?: Float32Array;
  /**
   * true when the backend has checked on the device that every statistic above is finite
   * (the CUDA backend does, in a kernel): assertFiniteStats then skips its host scan, which
   * at 512k reads 2H + 3H·Nb = 393k values. Selectors still check the scores they read.
   */
  readonly finite?: boolean;
  /**
   * Present on statistics queued with `deferRead` by a backend whose reads can only be
   * asynchronous (WebGPU): copies the statistics to the host, after which every field above
   * holds its value; reading a field before throws INVALID_ARGUMENT. Rejects with NON_FINITE
   * when q or k held NaN or Inf. Calling it again returns the same promise. A device plan
   * (`Backend.planner`) reads the statistics where they are on the device, and the pipeline
   * settles them once the plan is read back.
   */
  readonly settle?: () => Promise<void>;
}

/** Policies read these; NaN here means the inputs held NaN/Inf or overflowed. */
export function assertFiniteStats(s: ProxyStats): void {
  if (s.finite === true) return;
  const check = (a: ArrayLike<number>, name: string) => {
    for (let i = 0; i < a.length; i++) {
      if (!Number.isFinite(a[i])) {
        throw new NonFiniteError(
          `proxy statistic ${name} is ${a[i]} at index ${i}: q or k holds NaN/Inf (or values so large the softmax overflowed)`,
          { statistic: name, index: i },
        );
      }
    }
  };
  check(s.cStruct, 'cStruct');
  check(s.verticalBlocks, 'verticalBlocks');
  check(s.slashBlocks, 'slashBlocks');
  check(s.pooledEstimate, 'pooledEstimate');
  check(s.rowEntropy, 'rowEntropy');
}

/** One head's slice of an [H * len] array. */
export function headSlice<T extends Float64Array | Float32Array>(a: T, h: number, len: number): T {
  return a.subarray(h * len, (h + 1) * len) as T;
}
