/**
 * Opening a file of unknown kind, and the Q/K/V convenience reader.
 */
import { readdir, stat } from 'node:fs/promises';
import { join } from 'node:path';
import { CrispError, type DType, type HostTensor, InvalidArgumentError, ShapeError } from '@crisp/core';
import { formatError, ioError, openForRead, readExactly } from './file-handle.js';
import { type Layout, parseLayout } from './layout.js';
import { NPY_MAGIC, type NpyOpenOptions, openNpy } from './npy.js';
import { openSafetensors, sniffForeign } from './safetensors.js';
import { type TensorFile, listNames } from './tensor-file.js';
import { readTensor } from './stream.js';

/** Opens a safetensors or .npy file, told apart by content (not by extension). */
export async function openTensorFile(path: string, opts: NpyOpenOptions = {}): Promise<TensorFile> {
  const { handle, size } = await openForRead(path);
  const head = new Uint8Array(Math.min(size, 16));
  try {
    await readExactly(handle, head, 0, path);
  } finally {
    await handle.close().catch(() => undefined);
  }
  if (head.length >= 6 && NPY_MAGIC.every((b, i) => head[i] === b)) return openNpy(path, opts);
  if (head.length > 8 && head[8] === 0x7b) return openSafetensors(path);
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

/**
 * Picks the q/k/v tensor names among `available`: explicit names must exist; otherwise
 * an alias matches exactly (any case), or as the last dotted/slashed segment of exactly
 * one name ('model.layers.3.attn.q'). Errors list the names the file has.
 */
export function resolveQkvNames(available: readonly string[], where: string, names?: Partial<QkvNames>): QkvNames {
  const out: Record<string, string> = {};
  for (const role of ['q', 'k', 'v'] as const) {
    const given = names?.[role];
    if (given !== undefined) {
      if (!available.includes(given)) {
        throw new InvalidArgumentError(`${where} has no tensor '${given}' (given for ${role}); it has ${listNames(available)}`);
      }
      out[role] = given;
      continue;
    }
    const aliases = QKV_NAME_ALIASES[role];
    const exact = available.find((a) => aliases.includes(a)) ?? available.find((a) => aliases.includes(a.toLowerCase()));
    if (exact !== undefined) {
      out[role] = exact;
      continue;
    }
    const bySegment = available.filter((a) => aliases.includes(a.split(/[./:]/).pop()!.toLowerCase()));
    if (bySegment.length === 1) {
      out[role] = bySegment[0];
      continue;
    }
    if (bySegment.length > 1) {
      throw new InvalidArgumentError(
        `${where}: several tensors could be ${role} (${listNames(bySegment)}); pick one with names: { ${role}: '...' }`,
      );
    }
    throw new CrispError(
      'FORMAT_ERROR',
      `${where} has no ${role} tensor: looked for ${aliases.map((a) => `'${a}'`).join(', ')} and found ${listNames(available)}; pass names: { q, k, v } to say which is which`,
      { available: [...available] },
    );
  }
  return out as unknown as QkvNames;
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
}

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

function checkQkv(q: HostTensor, k: HostTensor, v: HostTensor, layout: Layout, where: string): void {
  const [m, H, d] = q.shape;
  const [n, Hkv, dk] = k.shape;
  const swapHint =
    layout === 'hnd'
      ? " (if the file is [n, H, d], pass layout 'nhd')"
      : layout === 'nhd'
        ? " (if the file is [H, n, d], pass layout 'hnd')"
        : '';
  const fail = (msg: string) =>
    new ShapeError(`${where}: ${msg}${swapHint}`, { q: [...q.shape], k: [...k.shape], v: [...v.shape], layout });
  if (k.shape.join() !== v.shape.join()) throw fail(`k [${k.shape}] and v [${v.shape}] must have the same shape`);
  if (dk !== d) throw fail(`q's head dim ${d} differs from k's ${dk}`);
  if (m > n) throw fail(`q has ${m} tokens but k has only ${n}; q may cover at most k's tokens`);
  if (H % Hkv !== 0) throw fail(`q's ${H} heads are not a multiple of k's ${Hkv} heads (GQA needs H % Hkv == 0)`);
  if (q.dtype !== k.dtype || k.dtype !== v.dtype) {
    throw new CrispError('DTYPE_MISMATCH', `${where}: q, k, v dtypes differ (${q.dtype}, ${k.dtype}, ${v.dtype}); pass dtype to convert them`);
  }
}

/**
 * Reads q, k, v into canonical [n, H, d] host tensors: from a safetensors file, or a
 * directory of .npy files (q.npy, k.npy, v.npy or aliases). For small files; stream
 * large ones with `uploadTensor`.
 */
export async function readQkv(path: string, opts: ReadQkvOptions): Promise<Qkv> {
  const layout = parseLayout(opts.layout);
  let isDir: boolean;
  try {
    isDir = (await stat(path)).isDirectory();
  } catch (e) {
    throw ioError(e, 'open', path);
  }
  const readOpts = { layout, dtype: opts.dtype, maxBytes: opts.maxBytes };
  if (!isDir) {
    await using file = await openTensorFile(path, { uint16As: opts.uint16As });
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
    const q = await readTensor(file, names.q, readOpts);
    const k = await readTensor(file, names.k, readOpts);
    const v = await readTensor(file, names.v, readOpts);
    checkQkv(q, k, v, layout, path);
    return { q, k, v, names, layout };
  }
  let entries: string[];
  try {
    entries = (await readdir(path)).filter((f) => f.toLowerCase().endsWith('.npy'));
  } catch (e) {
    throw ioError(e, 'list', path);
  }
  const stems = entries.map((f) => f.slice(0, -4));
  const names = resolveQkvNames(stems, `directory ${path}`, opts.names);
  const load = async (stem: string) => {
    await using file = await openNpy(join(path, `${entries[stems.indexOf(stem)]}`), { uint16As: opts.uint16As, name: stem });
    return readTensor(file, stem, readOpts);
  };
  const q = await load(names.q);
  const k = await load(names.k);
  const v = await load(names.v);
  checkQkv(q, k, v, layout, path);
  return { q, k, v, names, layout };
}
