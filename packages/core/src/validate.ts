/**
 * Up-front checks of the pipeline's public entries (sparsePrefill, planPrefill, runPlan,
 * releasePlan): the backend, the input tensors, the options and `out`, each a typed CrispError
 * naming what was wrong and what to do, before any statistic is computed or any buffer
 * allocated.
 *
 * Shape legend: q [m, H, d], k and v [n, Hkv, d].
 */
import type { AttentionShape } from './attention.js';
import type { Backend } from './backend.js';
import { CrispError, DTypeError, InvalidArgumentError, ShapeError, checkOptions, describeValue } from './errors.js';
import type { DeviceTensor } from './tensor.js';

const BACKEND_METHODS = ['upload', 'download', 'proxyStats', 'peBlockRows', 'sparseAttention', 'denseAttention', 'synchronize'] as const;
const INPUT_NAMES = ['q', 'k', 'v'] as const;
/** backends that passed assertBackend (a backend's shape does not change after creation) */
const checkedBackends = new WeakSet<object>();

/** Throws INVALID_ARGUMENT unless `backend` looks like a Backend (a name, capabilities, the primitives). */
export function assertBackend(backend: unknown, entry: string): asserts backend is Backend {
  if (typeof backend === 'object' && backend !== null && checkedBackends.has(backend)) return;
  if (!backend || typeof backend !== 'object') {
    throw new InvalidArgumentError(
      `${entry}: the first argument must be a backend (createReferenceBackend() from @crisp/reference, or a GPU backend); got ${describeValue(backend)}`,
    );
  }
  const b = backend as Record<string, unknown>;
  if (typeof b.name !== 'string' || !b.capabilities || typeof b.capabilities !== 'object') {
    throw new InvalidArgumentError(`${entry}: the backend needs a string name and a capabilities object; pass a backend a create…Backend() call returned`);
  }
  for (const m of BACKEND_METHODS) {
    if (typeof b[m] !== 'function') {
      throw new InvalidArgumentError(`${entry}: backend ${b.name} has no ${m}() method; pass a backend a create…Backend() call returned`);
    }
  }
  checkedBackends.add(backend);
}

/**
 * Throws unless `t` is a live device tensor of `backend`: INVALID_ARGUMENT for something that is
 * not a device tensor (a host tensor, a missing one), WRONG_BACKEND for another backend's,
 * DISPOSED after dispose().
 */
export function assertDeviceTensor(t: unknown, what: string, backend: Backend, entry: string): asserts t is DeviceTensor {
  if (!t || typeof t !== 'object') {
    throw new InvalidArgumentError(`${entry}: ${what} is ${describeValue(t)}; pass a device tensor (backend.upload(hostTensor(...)))`);
  }
  const x = t as Partial<DeviceTensor> & { data?: unknown };
  if (typeof x.backend !== 'string' || typeof x.disposed !== 'boolean' || !Array.isArray(x.shape)) {
    const hint = x.data !== undefined ? ': this looks like a host tensor; upload it first (backend.upload(t))' : '';
    throw new InvalidArgumentError(`${entry}: ${what} is not a device tensor${hint}`);
  }
  if (x.backend !== backend.name) {
    throw new CrispError(
      'WRONG_BACKEND',
      `${entry}: ${what} belongs to backend '${x.backend}', not to '${backend.name}'; download it and upload it to this backend`,
    );
  }
  if (x.disposed) {
    throw new CrispError('DISPOSED', `${entry}: ${what} was disposed; upload it again before using it`);
  }
}

/** The input tensors of a plan or run: an object holding q, k (and v where needed), each a live tensor of `backend`. */
export function assertInputs(inputs: unknown, backend: Backend, entry: string, needV: boolean): void {
  if (!inputs || typeof inputs !== 'object') {
    throw new InvalidArgumentError(`${entry}: inputs must be an object { q, k, v } of device tensors; got ${describeValue(inputs)}`);
  }
  const x = inputs as Record<string, unknown>;
  assertDeviceTensor(x.q, 'inputs.q', backend, entry);
  assertDeviceTensor(x.k, 'inputs.k', backend, entry);
  if (needV || x.v !== undefined) assertDeviceTensor(x.v, 'inputs.v', backend, entry);
}

/** The options sparsePrefill, planPrefill, runPlan and varlenPrefill take. */
export const CALL_OPTIONS: readonly string[] = ['scale', 'minSparseLength', 'returnLse', 'out'];

/**
 * The options of sparsePrefill / planPrefill / runPlan: an object (or undefined) whose known
 * fields have the right types. `scale` a positive finite number, `minSparseLength` a finite
 * number >= 0, `returnLse` a boolean; `prepared` is the plan's own, never the caller's. Any
 * other key (outside `known`) is INVALID_ARGUMENT.
 */
export function assertCallOptions(opts: unknown, entry: string, known: readonly string[] = CALL_OPTIONS): void {
  const o = checkOptions(opts as Record<string, unknown> | undefined, entry, [...known, 'prepared']);
  if (o.scale !== undefined && !(typeof o.scale === 'number' && Number.isFinite(o.scale) && o.scale > 0)) {
    throw new InvalidArgumentError(`${entry}: scale must be a positive finite number (default 1/sqrt(d)); got ${describeValue(o.scale)}`);
  }
  if (o.minSparseLength !== undefined && !(typeof o.minSparseLength === 'number' && Number.isFinite(o.minSparseLength) && o.minSparseLength >= 0)) {
    throw new InvalidArgumentError(
      `${entry}: minSparseLength must be a finite number >= 0 (keys; 0 always takes the sparse path); got ${describeValue(o.minSparseLength)}`,
    );
  }
  if (o.returnLse !== undefined && typeof o.returnLse !== 'boolean') {
    throw new InvalidArgumentError(`${entry}: returnLse must be true or false; got ${describeValue(o.returnLse)}`);
  }
  if (o.prepared !== undefined) {
    throw new InvalidArgumentError(
      `${entry}: options.prepared is not taken here: a plan carries its own prepared mask (plan.prepared), which runPlan uses`,
    );
  }
}

/**
 * `out` (when given): a live tensor of `backend` with q's dtype and shape [m, H, d], and not
 * q, k or v themselves (the attention reads them while it writes the output).
 */
export function assertOut(
  out: unknown,
  inputs: { readonly q: DeviceTensor; readonly k: DeviceTensor; readonly v?: DeviceTensor },
  shape: AttentionShape,
  backend: Backend,
  entry: string,
): void {
  if (out === undefined) return;
  assertDeviceTensor(out, 'options.out', backend, entry);
  for (const name of INPUT_NAMES) {
    if (out === inputs[name]) {
      throw new InvalidArgumentError(
        `${entry}: options.out is inputs.${name}: the attention reads ${name} while it writes out; allocate a separate output (backend.allocate)`,
      );
    }
  }
  const { queries: m, heads: H, headDim: d } = shape;
  if (out.dtype !== shape.dtype) {
    throw new DTypeError(`${entry}: options.out must have q's dtype ${shape.dtype}; got ${out.dtype}`);
  }
  const s = out.shape;
  if (s.length !== 3 || s[0] !== m || s[1] !== H || s[2] !== d) {
    throw new ShapeError(`${entry}: options.out must have shape [${m}, ${H}, ${d}] (q's); got [${s}]`);
  }
}
