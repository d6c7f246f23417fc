/**
 * Object fields filled on first read (the CUDA backend's block statistics stay on the device
 * until someone reads them).
 *
 * `deferFields(target, fields, load)` defines each field as an enumerable getter. The first
 * read of any of them, or `materialize()`, calls `load` once and turns every field into a
 * plain read-only value; after that the object is an ordinary one (spread, JSON, identity of
 * its arrays). The handle holds the target weakly, so a registry of handles does not keep the
 * objects alive; `materialize()` on a collected or already loaded target does nothing. A load
 * that fails inside `materialize()` is passed through `wrap`, kept, and thrown again by every
 * later read (the source is gone by then); a failing read-triggered load just throws.
 */
export interface DeferredFields {
  /** Load now if the target is alive and not loaded yet. */
  materialize(): void;
}

export function deferFields<T extends object, K extends keyof T & string>(
  target: T,
  fields: readonly K[],
  load: () => Pick<T, K>,
  wrap: (e: unknown) => Error = (e) => (e instanceof Error ? e : new Error(String(e))),
): DeferredFields {
  const ref = new WeakRef(target);
  let failure: Error | undefined;
  const fill = (t: T): void => {
    if (!fields.some((f) => Object.getOwnPropertyDescriptor(t, f)?.get)) return;
    if (failure) throw failure;
    const values = load();
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
      const t = ref.deref();
      if (!t) return;
      try {
        fill(t);
      } catch (e) {
        failure = failure ?? wrap(e);
        throw failure;
      }
    },
  };
}
