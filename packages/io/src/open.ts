/**
 * Opening a file of unknown kind, and the Q/K/V convenience reader.
 */
import { readdir, stat } from 'node:fs/promises';
import { join } from 'node:path';
import { CrispError, type DType, type HostTensor, InvalidArgumentError, ShapeError, assertDType, bytesPerElement } from '@crisp/core';
import { assertLittleEndianHost, assertPath, describeValue, formatError, ioError, kindOf, openForRead, readExactly } from './file-handle.js';
import { type Layout, type QkvDims, parseLayout } from './layout.js';
import { NPY_MAGIC, type NpyOpenOptions, checkNpyOptions, openNpy, openNpyHandle } from './npy.js';
import { openSafetensorsHandle, sniffForeign } from './safetensors.js';
import { DEFAULT_MAX_BYTES, checkLimitOptions, checkOptionKeys, planStream, readTensor } from './stream.js';
import { type TensorFile, listNames } from './tensor-file.js';

/** Opens a safetensors or .npy file, told apart by content (not by extension). */
export async function openTensorFile(path: string, opts: NpyOpenOptions = {}): Promise<TensorFile> {
  assertLittleEndianHost();
  const o = checkNpyOptions(opts);
  const { handle, size } = await openForRead(path);
  try {
    const head = new Uint8Array(Math.min(size, 16));
    await readExactly(handle, head, 0, path);
    if (head.length >= 6 && NPY_MAGIC.every((b, i) => head[i] === b)) return await openNpyHandle(handle, size, path, o);
    if (head.length > 8 && head[8] === 0x7b) return await openSafetensorsHandle(handle, size, path);
    const foreign = sniffForeign(head);
    if (size < 9) {
      throw formatError(`${path} is ${size} bytes: too short to be a safetensors or .npy file; it is truncated or empty`, {
        path,
      });
    }
    throw formatError(
      `${path} is neither a safetensors file (8-byte length, then a JSON header) nor an .npy file (\\x93NUMPY magic)${foreign === undefined ? '' : `: it looks like ${foreign}`}`,
      { path },
    );
  } catch (e) {
    await handle.close().catch(() => undefined);
    throw e;
  }
}

/** Names tried, in order, for each of q, k, v when none are given. */
export const QKV_NAME_ALIASES: Readonly<Record<'q' | 'k' | 'v', readonly string[]>> = {
  q: ['q', 'query', 'queries', 'query_states', 'q_states', 'xq', 'q_proj'],
  k: ['k', 'key', 'keys', 'key_states', 'k_states', 'xk', 'k_proj'],
  v: ['v', 'value', 'values', 'value_states', 'v_states', 'xv', 'v_proj'],
};

export interface QkvNames {
  readonly q: string;
  readonly k: string;
  readonly v: string;
}

/** Checks a `names` option: an object of q/k/v strings (each optional). */
function checkNames(names: unknown): Partial<QkvNames> | undefined {
  if (names === undefined) return undefined;
  if (names === null || typeof names !== 'object' || Array.isArray(names)) {
    throw new InvalidArgumentError(`names must be an object like { q: 'query', k: 'key', v: 'value' }; got ${describeValue(names)}`);
  }
  for (const [role, given] of Object.entries(names)) {
    if (role !== 'q' && role !== 'k' && role !== 'v') {
      throw new InvalidArgumentError(`names has an unknown key '${role}'; give names for q, k and v only`);
    }
    if (given !== undefined && (typeof given !== 'string' || given.length === 0)) {
      throw new InvalidArgumentError(`names.${role} must be a non-empty tensor name; got ${describeValue(given)}`);
    }
  }
  return names as Partial<QkvNames>;
}

/**
 * Picks the q/k/v tensor names among `available`: explicit names must exist; otherwise
 * the first alias (in QKV_NAME_ALIASES order) that some name equals, exactly, then in any
 * case; otherwise an alias as the last dotted/slashed segment of exactly one name
 * ('model.layers.3.attn.q'). Two names equally good are an error, never a silent pick.
 * Errors list the names the file has.
 */
export function resolveQkvNames(available: readonly string[], where: string, names?: Partial<QkvNames>): QkvNames {
  if (!Array.isArray(available) || available.some((a) => typeof a !== 'string')) {
    throw new InvalidArgumentError(`available must be an array of tensor names; got ${describeValue(available)}`);
  }
  const given = checkNames(names);
  const out: Record<string, string> = {};
  const ambiguous = (role: string, found: readonly string[]) =>
    new InvalidArgumentError(
      `${where}: several tensors could be ${role} (${listNames(found)}); pick one with names: { ${role}: '...' }`,
      { candidates: [...found] },
    );
  for (const role of ['q', 'k', 'v'] as const) {
    const name = given?.[role];
    if (name !== undefined) {
      if (!available.includes(name)) {
        throw new InvalidArgumentError(`${where} has no tensor '${name}' (given for ${role}); it has ${listNames(available)}`);
      }
      out[role] = name;
      continue;
    }
    const aliases = QKV_NAME_ALIASES[role];
    let picked: string | undefined;
    for (const match of [(a: string, alias: string) => a === alias, (a: string, alias: string) => a.toLowerCase() === alias]) {
      for (const alias of aliases) {
        const hits = available.filter((a) => match(a, alias));
        if (hits.length > 1) throw ambiguous(role, hits);
        if (hits.length === 1) {
          picked = hits[0];
          break;
        }
      }
      if (picked !== undefined) break;
    }
    if (picked !== undefined) {
      out[role] = picked;
      continue;
    }
    const bySegment = available.filter((a) => aliases.includes((a.split(/[./:]/).pop() as string).toLowerCase()));
    if (bySegment.length === 1) {
      out[role] = bySegment[0];
      continue;
    }
    if (bySegment.length > 1) throw ambiguous(role, bySegment);
    throw new CrispError(
      'FORMAT_ERROR',
      `${where} has no ${role} tensor: looked for ${aliases.map((a) => `'${a}'`).join(', ')} and found ${listNames(available)}; pass names: { q, k, v } to say which is which`,
      { available: [...available] },
    );
  }
  return out as unknown as QkvNames;
}

/**
 * A layer index inside a tensor name: a dotted, slashed or colon-separated part 'layers',
 * 'layer', 'blocks', 'block', 'blk' or 'h' followed by a number ('model.layers.3.self_attn.q',
 * 'transformer.h.3.attn.k'), or such a word joined to it ('layer_03.v', 'blocks-3/q').
 */
const LAYER_IN_NAME = /(?:^|[./:])(?:layers?|blocks?|blk|h)(?:[./:_-]?)(\d+)(?=[./:]|$)/i;

/**
 * The layer a tensor name carries and the name without it ('model.layers.3.self_attn.q' ->
 * { layer: 3, rest: 'model.self_attn.q' }), or undefined for a name without a layer.
 */
export function splitLayerName(name: string): { readonly layer: number; readonly rest: string } | undefined {
  if (typeof name !== 'string') throw new InvalidArgumentError(`name must be a string; got ${describeValue(name)}`);
  const m = LAYER_IN_NAME.exec(name);
  if (m === null) return undefined;
  const layer = Number(m[1]);
  if (!Number.isSafeInteger(layer)) return undefined;
  const rest = (name.slice(0, m.index) + name.slice(m.index + m[0].length)).replace(/^[./:]+/, '');
  return { layer, rest };
}

/** One layer's q/k/v tensor names (full names, as the file has them). */
export interface QkvLayer {
  readonly layer: number;
  readonly names: QkvNames;
}

/**
 * The layers of a model dump whose tensor names carry the layer ('model.layers.0.q', ...):
 * names grouped by `splitLayerName`, then each layer's q, k and v picked as
 * `resolveQkvNames` picks them among the names without the layer part (so `names` gives
 * those: { q: 'self_attn.q' }). Layers ascending; names without a layer are ignored; an
 * empty result means no name carries a layer. A layer without one of q, k, v is the
 * FORMAT_ERROR of `resolveQkvNames`, naming the layer.
 */
export function resolveQkvLayers(available: readonly string[], where: string, names?: Partial<QkvNames>): QkvLayer[] {
  if (!Array.isArray(available) || available.some((a) => typeof a !== 'string')) {
    throw new InvalidArgumentError(`available must be an array of tensor names; got ${describeValue(available)}`);
  }
  const groups = new Map<number, Map<string, string>>();
  for (const full of available) {
    const hit = splitLayerName(full);
    if (hit === undefined) continue;
    let g = groups.get(hit.layer);
    if (g === undefined) groups.set(hit.layer, (g = new Map()));
    g.set(hit.rest, full);
  }
  return [...groups.keys()]
    .sort((a, b) => a - b)
    .map((layer) => {
      const g = groups.get(layer)!;
      const picked = resolveQkvNames([...g.keys()], `${where}, layer ${layer},`, names);
      return { layer, names: { q: g.get(picked.q)!, k: g.get(picked.k)!, v: g.get(picked.v)! } };
    });
}

export interface ReadQkvOptions {
  /** How the file stores each tensor: 'nhd' [n,H,d], '1nhd' [1,n,H,d] or 'hnd' [H,n,d]. */
  readonly layout: Layout | string;
  /** Tensor names (safetensors) or file stems (a directory of .npy files). */
  readonly names?: Partial<QkvNames>;
  /** Convert all three to this dtype (round to nearest even). */
  readonly dtype?: DType;
  /** For .npy: what '<u2' elements hold. */
  readonly uint16As?: 'bf16';
  /** Refuse tensors larger than this as one array (default 1 GiB): stream those instead. */
  readonly maxBytes?: number;
  /** Refuse more tokens than this, from the headers alone (pass the backend's `capabilities.maxSequence`). */
  readonly maxSequence?: number;
  /** Refuse head dims not in this list, from the headers alone (pass `capabilities.headDims`). */
  readonly headDims?: readonly number[];
}

const READ_QKV_KEYS = ['layout', 'names', 'dtype', 'uint16As', 'maxBytes', 'maxSequence', 'headDims'];

export interface Qkv {
  /** [m, H, d] canonical */
  readonly q: HostTensor;
  /** [n, Hkv, d] canonical */
  readonly k: HostTensor;
  /** [n, Hkv, d] canonical */
  readonly v: HostTensor;
  readonly names: QkvNames;
  readonly layout: Layout;
}

/** q, k, v must fit together: checked on the header dims, before any data is read. */
function checkQkv(q: QkvDims, k: QkvDims, v: QkvDims, dtypes: readonly DType[], layout: Layout, where: string): void {
  const shape = (x: QkvDims) => [x.n, x.H, x.d];
  const swapHint =
    layout === 'hnd'
      ? " (if the file is [n, H, d], pass layout 'nhd')"
      : layout === 'nhd'
        ? " (if the file is [H, n, d], pass layout 'hnd')"
        : '';
  const fail = (msg: string) =>
    new ShapeError(`${where}: ${msg}${swapHint}`, { q: shape(q), k: shape(k), v: shape(v), layout });
  if (shape(k).join() !== shape(v).join()) throw fail(`k [${shape(k)}] and v [${shape(v)}] must have the same shape`);
  if (k.d !== q.d) throw fail(`q's head dim ${q.d} differs from k's ${k.d}`);
  if (q.n > k.n) throw fail(`q has ${q.n} tokens but k has only ${k.n}; q may cover at most k's tokens`);
  if (q.H % k.H !== 0) throw fail(`q's ${q.H} heads are not a multiple of k's ${k.H} heads (GQA needs H % Hkv == 0)`);
  if (dtypes[0] !== dtypes[1] || dtypes[1] !== dtypes[2]) {
    throw new CrispError('DTYPE_MISMATCH', `${where}: q, k, v dtypes differ (${dtypes.join(', ')}); pass dtype to convert them`);
  }
}

/** Checks q/k/v headers together (names resolved, shapes, dtypes, limits), then reads all three. */
async function readChecked(
  files: Readonly<Record<'q' | 'k' | 'v', TensorFile>>,
  names: QkvNames,
  layout: Layout,
  opts: ReadQkvOptions,
  where: string,
): Promise<Qkv> {
  const streamOpts = { layout, dtype: opts.dtype, maxSequence: opts.maxSequence, headDims: opts.headDims };
  const plans = (['q', 'k', 'v'] as const).map((role) => planStream(files[role], names[role], streamOpts));
  const [qp, kp, vp] = plans;
  checkQkv(qp.dims, kp.dims, vp.dims, plans.map((p) => p.fileDtype), layout, where);
  const maxBytes = opts.maxBytes ?? DEFAULT_MAX_BYTES;
  for (const p of plans) {
    const bytes = p.dims.n * p.dims.H * p.dims.d * bytesPerElement(p.dtype);
    if (bytes > maxBytes) {
      throw new CrispError(
        'LIMIT_EXCEEDED',
        `${where}: tensor '${p.info.name}' is ${bytes} bytes as one array, above maxBytes ${maxBytes}; stream it onto a backend with uploadTensor instead`,
        { bytes, maxBytes },
      );
    }
  }
  const readOpts = { ...streamOpts, maxBytes };
  const q = await readTensor(files.q, names.q, readOpts);
  const k = await readTensor(files.k, names.k, readOpts);
  const v = await readTensor(files.v, names.v, readOpts);
  return { q, k, v, names, layout };
}

/**
 * Reads q, k, v into canonical [n, H, d] host tensors: from a safetensors file, or a
 * directory of .npy files (q.npy, k.npy, v.npy or aliases). All three headers are checked
 * (names, shapes, dtypes, limits) before any data is read. For small files; stream large
 * ones with `uploadTensor`.
 */
export async function readQkv(path: string, opts: ReadQkvOptions): Promise<Qkv> {
  assertPath(path);
  if (opts === undefined || opts === null) {
    throw new InvalidArgumentError(
      "readQkv(path, options) needs options with a layout, e.g. { layout: 'nhd' } for [n, H, d] files ('1nhd' for [1, n, H, d], 'hnd' for [H, n, d])",
    );
  }
  checkOptionKeys(opts, READ_QKV_KEYS, 'readQkv options');
  const layout = parseLayout(opts.layout);
  if (opts.dtype !== undefined) assertDType(opts.dtype, 'dtype');
  checkNames(opts.names);
  const npyOpts = checkNpyOptions({ uint16As: opts.uint16As });
  if (opts.maxBytes !== undefined && (typeof opts.maxBytes !== 'number' || !(opts.maxBytes >= 0))) {
    throw new InvalidArgumentError(`maxBytes must be a non-negative number of bytes; got ${describeValue(opts.maxBytes)}`);
  }
  checkLimitOptions(opts);
  let st: Awaited<ReturnType<typeof stat>>;
  try {
    st = await stat(path);
  } catch (e) {
    throw ioError(e, 'open', path);
  }
  if (!st.isDirectory()) {
    if (!st.isFile()) {
      throw new CrispError('IO_ERROR', `cannot read ${path}: it is ${kindOf(st)}; give a safetensors file or a directory of .npy files`, {
        path,
      });
    }
    await using file = await openTensorFile(path, npyOpts);
    if (file.format === 'npy') {
      throw new InvalidArgumentError(
        `${path} is a single .npy array; for Q/K/V give a directory holding q.npy, k.npy and v.npy, or a safetensors file with all three`,
      );
    }
    const names = resolveQkvNames(
      file.tensors.map((t) => t.name),
      path,
      opts.names,
    );
    return await readChecked({ q: file, k: file, v: file }, names, layout, opts, path);
  }
  let entries: string[];
  try {
    entries = (await readdir(path)).filter((f) => f.toLowerCase().endsWith('.npy') && f.length > 4).sort();
  } catch (e) {
    throw ioError(e, 'list', path);
  }
  const stems = entries.map((f) => f.slice(0, -4));
  const names = resolveQkvNames(stems, `directory ${path}`, opts.names);
  const opened: TensorFile[] = [];
  try {
    const open = async (stem: string) => {
      const f = await openNpy(join(path, entries[stems.indexOf(stem)]), { ...npyOpts, name: stem });
      opened.push(f);
      return f;
    };
    const files = { q: await open(names.q), k: await open(names.k), v: await open(names.v) };
    return await readChecked(files, names, layout, opts, `directory ${path}`);
  } finally {
    await Promise.allSettled(opened.map((f) => f.close()));
  }
}
