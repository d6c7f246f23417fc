/**
 * Object fields filled on first read (the CUDA backend's block statistics stay on the device
 * until someone reads them).
 *
 * `deferFields(target, fields, load)` defines each field as an enumerable getter. The first
 * read of any of them calls `load` once (unless `materialize()` did) and turns every field
 * into a plain read-only value; after that the object is an ordinary one (spread, JSON,
 * identity of its arrays). `materialize()` calls `load` now and keeps the values for the
 * getters (the device buffer behind them can go); it does nothing once loaded. A load that
 * fails inside `materialize()` is passed through `wrap`, kept, and thrown again by every later
 * read and materialize (the source is gone by then); a failing read-triggered load just throws.
 *
 * The handle holds no reference to the target, not even a WeakRef: a WeakRef keeps its target
 * alive to the end of the job that made it, and a loop of awaited prefills is one job, so
 * every statistics object of such a loop stayed alive (with what materialize downloaded into
 * it: 0.8 MB a plan at 128k) until the loop returned.
 */
export interface DeferredFields {
  /** Load now unless loaded already; the values wait in the handle for the first read. */
  materialize(): void;
}

export function deferFields<T extends object, K extends keyof T & string>(
  target: T,
  fields: readonly K[],
  load: () => Pick<T, K>,
  wrap: (e: unknown) => Error = (e) => (e instanceof Error ? e : new Error(String(e))),
): DeferredFields {
  let values: Pick<T, K> | undefined;
  let failure: Error | undefined;
  const fill = (t: T): void => {
    if (!fields.some((f) => Object.getOwnPropertyDescriptor(t, f)?.get)) return;
    if (failure) throw failure;
    values ??= load();
    for (const f of fields) {
      Object.defineProperty(t, f, { value: values[f], enumerable: true, writable: false, configurable: false });
    }
  };
  for (const f of fields) {
    Object.defineProperty(target, f, {
      enumerable: true,
      configurable: true,
      // `this`, not `target`: a closure over the parameter would put the object in the
      // context the handle's closures share, and the handle would keep it alive
      get(this: T) {
        fill(this);
        return this[f];
      },
    });
  }
  return {
    materialize(): void {
      if (values !== undefined) return;
      if (failure) throw failure;
      try {
        values = load();
      } catch (e) {
        failure = wrap(e);
        throw failure;
      }
    },
  };
}
