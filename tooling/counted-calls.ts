// Test helpers: an object (a backend) whose method calls are counted, for tests that check a
// call was refused before the backend did any work, the typed error a call ends with, and
// every entry that takes an attention `out`, called with one. No package imports, so every
// package's tests can use it.

/** `target` with its method calls counted, except those of the methods named in `quiet`. */
export function countedCalls<T extends object>(target: T, quiet: readonly string[] = []): { readonly proxy: T; calls(): number } {
  let calls = 0;
  const skip = new Set(quiet);
  const proxy = new Proxy(target, {
    get(t, key) {
      const f = Reflect.get(t, key);
      if (typeof f !== 'function') return f;
      return (...a: unknown[]) => {
        if (!skip.has(String(key))) calls++;
        return (f as (...x: unknown[]) => unknown).apply(t, a);
      };
    },
  });
  return { proxy, calls: () => calls };
}

/** A Backend's tensor calls and its memoryRange: what a call refused before any primitive may still have made. */
export const TENSOR_CALLS: readonly string[] = ['memoryRange', 'upload', 'allocate', 'download', 'read', 'write'];

/** What a typed error (a CrispError) carries. */
export interface TypedError {
  readonly code: string;
  readonly message: string;
  readonly details?: Readonly<Record<string, unknown>>;
}

/**
 * The typed error (one with a string `code`) `fn` throws or its promise rejects with;
 * undefined when it succeeds. Any other exception is thrown on.
 */
export async function typedErrorOf(fn: () => unknown): Promise<TypedError | undefined> {
  try {
    await fn();
  } catch (e) {
    if (e instanceof Error && typeof (e as { code?: unknown }).code === 'string') return e as Error & TypedError;
    throw e;
  }
  return undefined;
}

/** Each call's outcome, in order: `CODE: message` for a typed error, `ok` for a success. */
export async function outcomesOf(calls: readonly (() => unknown)[]): Promise<string[]> {
  const out: string[] = [];
  for (const call of calls) {
    const e = await typedErrorOf(call);
    out.push(e ? `${e.code}: ${e.message}` : 'ok');
  }
  return out;
}

/** A backend's attention entries that take `opts.out` (any backend here, by its methods). */
export interface OutEntries {
  denseAttention(q: unknown, k: unknown, v: unknown, opts?: { out?: unknown }): unknown;
  sparseAttention(q: unknown, k: unknown, v: unknown, mask: unknown, opts?: { out?: unknown }): unknown;
  varlenAttention?(q: unknown, k: unknown, v: unknown, batch: unknown, opts?: { out?: unknown }): unknown;
}

/** The pipeline's entries that take `opts.out` (@crisp/core's, passed in: this file imports no package). */
export interface OutPipeline {
  sparsePrefill(backend: unknown, inputs: unknown, policy: unknown, opts?: { minSparseLength?: number; out?: unknown }): unknown;
  runPlan(backend: unknown, plan: unknown, inputs: unknown, opts?: { out?: unknown }): unknown;
  varlenPrefill(backend: unknown, inputs: unknown, layout: { cuSeqlensQ: number[] }, policy: unknown, opts?: { minSparseLength?: number; out?: unknown }): unknown;
}

/** q, k, v (their first axis: rows) and what the calls need: a mask over them, a plan of them, a policy. */
export interface OutCase {
  readonly inputs: { readonly q: { readonly shape: readonly number[] }; readonly k: { readonly shape: readonly number[] }; readonly v: unknown };
  readonly mask: unknown;
  readonly blockSize: number;
  readonly plan: unknown;
  readonly policy: unknown;
}

/**
 * Every entry that writes an attention output, each called with `out`: the backend's
 * denseAttention, sparseAttention and varlenAttention (one segment, all of q against all of
 * k), then the pipeline's sparsePrefill, runPlan and varlenPrefill (minSparseLength 0).
 */
export function callsWithOut(backend: OutEntries, pipeline: OutPipeline, c: OutCase, out: unknown): (() => unknown)[] {
  const { q, k, v } = c.inputs;
  const [m, n] = [q.shape[0], k.shape[0]];
  const batch = { blockSize: c.blockSize, segments: [{ qStart: 0, queries: m, kStart: 0, keys: n }], masks: [c.mask] };
  return [
    () => backend.denseAttention(q, k, v, { out }),
    () => backend.sparseAttention(q, k, v, c.mask, { out }),
    () => {
      if (!backend.varlenAttention) throw new Error('the backend has no varlenAttention');
      return backend.varlenAttention(q, k, v, batch, { out });
    },
    () => pipeline.sparsePrefill(backend, c.inputs, c.policy, { minSparseLength: 0, out }),
    () => pipeline.runPlan(backend, c.plan, c.inputs, { out }),
    () => pipeline.varlenPrefill(backend, c.inputs, { cuSeqlensQ: [0, m] }, c.policy, { minSparseLength: 0, out }),
  ];
}
