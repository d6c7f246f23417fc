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
import { type DeviceTensor, type MemoryRange, rangesOverlap } from './tensor.js';

const BACKEND_METHODS = ['upload', 'download', 'proxyStats', 'peBlockRows', 'sparseAttention', 'denseAttention', 'synchronize'] as const;
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
 * `out` (when given): a live tensor of `backend` with q's dtype and shape [m, H, d], neither
 * q, k or v themselves nor, on a backend with `memoryRange`, a tensor sharing any of their
 * bytes (the attention reads them while it writes the output).
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
  const rangeOf = typeof backend.memoryRange === 'function' ? (t: DeviceTensor) => backend.memoryRange!(t) : undefined;
  assertOutApart(out, { q: inputs.q, k: inputs.k, v: inputs.v }, rangeOf, { entry, out: 'options.out', inputs: 'inputs.' });
  const { queries: m, heads: H, headDim: d } = shape;
  if (out.dtype !== shape.dtype) {
    throw new DTypeError(`${entry}: options.out must have q's dtype ${shape.dtype}; got ${out.dtype}`);
  }
  const s = out.shape;
  if (s.length !== 3 || s[0] !== m || s[1] !== H || s[2] !== d) {
    throw new ShapeError(`${entry}: options.out must have shape [${m}, ${H}, ${d}] (q's); got [${s}]`);
  }
}

/** How assertOutApart names things: the call, the output, the inputs' prefix (`inputs.`). */
export interface OutApartNames {
  readonly entry?: string;
  readonly out: string;
  readonly inputs?: string;
}

/**
 * Throws INVALID_ARGUMENT (details `{ input }`) when `out` is one of `inputs` (q, k, v by
 * name; undefined ones skipped) or, given `memoryRange` (a backend's `Backend.memoryRange`),
 * shares a byte with one (a second handle or a view over an input's memory, which the
 * attention would overwrite while it still reads it), or lies in the same resource as one
 * whose range says `wholeResource`. The message names the input. Used by the pipeline's
 * entries and by each backend's attention for its own tensors.
 */
export function assertOutApart(
  out: DeviceTensor,
  inputs: Readonly<Record<string, DeviceTensor | undefined>>,
  memoryRange: ((t: DeviceTensor) => MemoryRange) | undefined,
  names: OutApartNames,
): void {
  const at = names.entry ? `${names.entry}: ` : '';
  const fix = 'allocate a separate output (backend.allocate), or pass none';
  let own: MemoryRange | undefined;
  for (const [name, t] of Object.entries(inputs)) {
    if (t === undefined) continue;
    const input = `${names.inputs ?? ''}${name}`;
    if (t === out) {
      throw new InvalidArgumentError(`${at}${names.out} is ${input}: the attention reads ${name} while it writes the output; ${fix}`, { input: name });
    }
    if (!memoryRange) continue;
    own ??= memoryRange(out);
    const theirs = memoryRange(t);
    if (own.resource !== theirs.resource) continue;
    if (rangesOverlap(own, theirs)) {
      const from = Math.max(own.start, theirs.start) - theirs.start;
      const to = Math.min(own.end, theirs.end) - theirs.start;
      throw new InvalidArgumentError(
        `${at}${names.out} shares memory with ${input} (it covers bytes [${from}, ${to}) of ${name}'s ${theirs.end - theirs.start}: a view or a second handle over the same memory): the attention would overwrite ${name} while it still reads it; ${fix}`,
        { input: name },
      );
    }
    if (own.wholeResource || theirs.wholeResource) {
      throw new InvalidArgumentError(
        `${at}${names.out} is in the same buffer as ${input} (bytes [${own.start}, ${own.end}) of it; ${name} holds [${theirs.start}, ${theirs.end})): this backend cannot write a buffer that the attention reads in the same pass, even at other bytes; ${fix}`,
        { input: name },
      );
    }
  }
}
