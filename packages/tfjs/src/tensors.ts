/**
 * What @crisp/tfjs accepts from TF.js: q [n, H, d] or [batch, n, H, d], k and v
 * [n, Hkv, d] or [batch, n, Hkv, d], float32, not disposed, all on one TF.js backend. Every
 * refusal is the core's typed error, raised before anything is read or allocated.
 */
import { CrispError, DTypeError, InvalidArgumentError, ShapeError, describeValue } from '@crisp/core';
import type * as tfc from '@tensorflow/tfjs-core';

export type Tf = typeof tfc;
export type TfTensor = tfc.Tensor;

/** The checked layout of one call. */
export interface TfInputs {
  /** 1 for rank-3 inputs */
  readonly batch: number;
  /** whether the inputs carry a leading batch axis */
  readonly batched: boolean;
  readonly n: number;
  readonly heads: number;
  readonly kvHeads: number;
  readonly headDim: number;
  /** key rows of k and v per sequence (= n, except in a packed varlen call) */
  readonly keys: number;
  /** the TF.js backend the tensors live on (its registered name) */
  readonly tfBackend: string;
}

/** How a call takes its tensors: its name for errors, and packed (rank 3, q and k rows free). */
export interface InputMode {
  readonly what: string;
  readonly packed: boolean;
}
const WHOLE: InputMode = { what: 'crispAttention', packed: false };

/** Duck-typed: a tf.Tensor from any copy of @tensorflow/tfjs-core. */
export function isTfTensor(x: unknown): x is TfTensor {
  const t = x as Partial<TfTensor> | null;
  return (
    t !== null &&
    typeof t === 'object' &&
    Array.isArray(t.shape) &&
    typeof t.dtype === 'string' &&
    typeof t.dataId === 'object' &&
    typeof (t as { data?: unknown }).data === 'function' &&
    typeof (t as { dataToGPU?: unknown }).dataToGPU === 'function'
  );
}

/**
 * The registered name of the TF.js backend holding `t`'s data (TF.js moves data between
 * backends lazily, so a tensor made before a setBackend() still lives on the old one).
 * Undefined when this TF.js build does not say.
 */
export function tfBackendOf(tf: Tf, t: TfTensor): string | undefined {
  const engine = tf.engine() as unknown as {
    state?: { tensorInfo?: { get(id: object): { backend?: unknown } | undefined } };
    registry?: Record<string, unknown>;
  };
  const owner = engine.state?.tensorInfo?.get(t.dataId)?.backend;
  if (owner === undefined || !engine.registry) return undefined;
  for (const [name, b] of Object.entries(engine.registry)) if (b === owner) return name;
  return undefined;
}

const NAMES = ['q', 'k', 'v'] as const;

/**
 * Check q, k, v as crispAttention takes them (or, `packed`, as crispAttentionVarlen does:
 * rank 3, q's and k's rows the packed sequences'); the first problem found is thrown.
 */
export function checkInputs(tf: Tf, q: unknown, k: unknown, v: unknown, mode: InputMode = WHOLE): TfInputs {
  const what = mode.what;
  const ts = [q, k, v];
  ts.forEach((t, i) => {
    if (!isTfTensor(t)) throw new InvalidArgumentError(`${what}: ${NAMES[i]} must be a tf.Tensor; got ${describeValue(t)}`);
    if (t.isDisposed) throw new CrispError('DISPOSED', `${what}: ${NAMES[i]} was disposed`);
    if (t.dtype !== 'float32') {
      throw new DTypeError(
        `${what}: ${NAMES[i]} is ${t.dtype}; CRISP takes float32 tensors (attention inputs are real-valued: cast with tf.cast(x, 'float32'))`,
        { tensor: NAMES[i], dtype: t.dtype },
      );
    }
  });
  const [tq, tk, tv] = ts as TfTensor[];
  const rank = tq.rank;
  if (mode.packed && rank !== 3) {
    throw new ShapeError(`${what}: q must be the packed sequences [total rows, H, d]; got shape [${tq.shape}]`);
  }
  if (rank !== 3 && rank !== 4) {
    throw new ShapeError(`${what}: q must be [n, H, d] or [batch, n, H, d]; got shape [${tq.shape}]`);
  }
  for (const [name, t] of [['k', tk], ['v', tv]] as const) {
    if (t.rank !== rank) throw new ShapeError(`${what}: ${name} has rank ${t.rank} (shape [${t.shape}]) but q has rank ${rank}`);
  }
  if (tk.shape.some((s, i) => s !== tv.shape[i])) {
    throw new ShapeError(`${what}: k and v must have the same shape; got [${tk.shape}] and [${tv.shape}]`);
  }
  const off = rank - 3;
  const batch = rank === 4 ? tq.shape[0] : 1;
  const [n, H, d] = tq.shape.slice(off);
  const [nk, Hkv, dk] = tk.shape.slice(off);
  if (rank === 4 && tk.shape[0] !== batch) throw new ShapeError(`${what}: q has batch ${batch}, k has ${tk.shape[0]}`);
  if (nk !== n && !mode.packed) {
    throw new ShapeError(`${what}: q has ${n} positions, k and v ${nk}; crispAttention prefills whole sequences (q and k of one length)`);
  }
  if (dk !== d) throw new ShapeError(`${what}: q has head dim ${d}, k ${dk}`);
  if (batch < 1 || n < 1 || nk < 1 || H < 1 || Hkv < 1 || d < 1) throw new ShapeError(`${what}: empty input (q [${tq.shape}], k [${tk.shape}])`);
  if (H % Hkv !== 0) throw new ShapeError(`${what}: q's ${H} heads are not a multiple of k's ${Hkv} (GQA needs H % Hkv == 0)`);
  const where = ts.map((t) => tfBackendOf(tf, t as TfTensor));
  const known = where.filter((w): w is string => w !== undefined);
  if (known.some((w) => w !== known[0])) {
    throw new InvalidArgumentError(
      `${what}: q, k and v live on different TF.js backends (${NAMES.map((x, i) => `${x}: ${where[i] ?? '?'}`).join(', ')}); move them to one (tf.setBackend, then tf.clone)`,
    );
  }
  return { batch, batched: rank === 4, n, keys: nk, heads: H, kvHeads: Hkv, headDim: d, tfBackend: known[0] ?? tf.getBackend() };
}
