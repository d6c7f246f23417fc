// Test helpers: an object (a backend) whose method calls are counted, for tests that check a
// call was refused before the backend did any work, and the typed error a call ends with.
// No package imports, so every package's tests can use it.

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
