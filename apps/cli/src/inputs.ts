/**
 * The inputs of a run: a generated scenario (@crisp/synth) or a Q/K/V dump (@crisp/io), on
 * the chosen backend. Everything a user passes is checked before any generation, read or
 * allocation: the path's kind (regular files only, so a FIFO never blocks the command),
 * tensor names, dtypes, shapes under --layout (with a hint when they look transposed), and
 * the sizes against the backend and the machine (limits.ts).
 *
 * Shape legend: q [n, H, d], k and v [n, Hkv, d].
 */
import { readdir, stat } from 'node:fs/promises';
import { join } from 'node:path';
import {
  CrispError,
  type DType,
  type DeviceTensor,
  type HostData,
  type HostTensor,
  ShapeError,
  bf16BitsToF32,
  f16BitsToF32,
} from '@crisp/core';
import {
  type Layout,
  type QkvDims,
  type TensorFile,
  type TensorInfo,
  dimsFromFileShape,
  openNpy,
  openTensorFile,
  parseLayout,
  readTensor,
  resolveQkvNames,
  uploadTensor,
} from '@crisp/io';
import { type Scenario, type ScenarioTensors, scenario, uploadScenario } from '@crisp/synth';
import { synthThreads, synthWorkerEntry, uploadScenarioParallel } from '@crisp/synth/node';
import type { SelectedBackend } from './backends.js';
import { type CliIo, UsageError } from './cli-io.js';
import { type ProblemSize, checkProblem, slowRunNote } from './limits.js';
import type { QkvNameFlags } from './options.js';
import { progressBar } from './progress.js';

/** The synthetic scenario a command generates when no `--qkv` is given (and the flags beside it). */
export interface ScenarioFlags {
  readonly profile: string;
  readonly n?: number;
  readonly heads?: number;
  readonly kvHeads?: number;
  readonly headDim?: number;
  readonly dtype?: DType;
  readonly seed: number;
  /** host threads generating the scenario (default: cores less one, at most 16, for large scenarios) */
  readonly threads?: number;
}

/**
 * One layer of a model dump (`--qkv DIR`, layers.ts): where its q, k and v are in files the
 * layer set opened (and closes), checked before any backend work.
 */
export interface DumpLayer {
  readonly layer: number;
  /** how messages name the layer: 'DIR/layer_03.safetensors' or 'FILE (layer 3)' */
  readonly source: string;
  readonly tensors: Readonly<Record<'q' | 'k' | 'v', { readonly file: TensorFile; readonly name: string }>>;
}

export interface InputRequest extends ScenarioFlags {
  readonly qkv?: string;
  readonly dumpLayer?: DumpLayer;
  readonly layout?: string;
  readonly names?: QkvNameFlags;
  readonly npyUint16?: 'bf16';
  readonly blockSize: number;
  readonly sampleRows: number;
  /** policies run after dense */
  readonly policies: number;
}

export interface Inputs {
  readonly q: DeviceTensor;
  readonly k: DeviceTensor;
  readonly v: DeviceTensor;
  readonly n: number;
  readonly H: number;
  readonly Hkv: number;
  readonly d: number;
  readonly dtype: DType;
  /** f32 values of query row i, [H * d] */
  qRow(i: number): Promise<Float32Array>;
  readonly scenario?: Scenario;
  readonly source: string;
  /** the dump's dtype, when --dtype converted it */
  readonly convertedFrom?: DType;
  /** releases host resources (open files) */
  close(): Promise<void>;
  /** ms generating the scenario (null for a dump) and writing it onto the backend; threads that generated */
  readonly timing: { readonly generateMs: number | null; readonly uploadMs: number; readonly threads: number };
}

/** Scenarios of this many q values or more are generated on worker threads by default. */
export const PARALLEL_MIN_VALUES = 2 ** 24;

function decodeInto(dtype: DType, src: HostData, out: Float32Array): void {
  if (dtype === 'f32') out.set(src as Float32Array);
  else {
    const conv = dtype === 'bf16' ? bf16BitsToF32 : f16BitsToF32;
    for (let i = 0; i < src.length; i++) out[i] = conv(src[i]);
  }
}

export function toF32(t: HostTensor): Float32Array {
  const out = new Float32Array(t.data.length);
  decodeInto(t.dtype, t.data, out);
  return out;
}

// ------------------------------------------------------------------------ scenarios

export interface ScenarioDims {
  readonly n: number;
  readonly heads: number;
  readonly kvHeads: number;
  readonly headDim: number;
}

/** The scenario's sizes: the flags, else the backend's defaults; contradictions are usage errors. */
export function scenarioDims(
  o: Pick<InputRequest, 'n' | 'heads' | 'kvHeads' | 'headDim'>,
  defaults: SelectedBackend['defaults'],
  minHeads = 1,
): ScenarioDims {
  const heads = o.heads ?? Math.max(minHeads, defaults.heads);
  const kvHeads = o.kvHeads ?? (o.heads !== undefined || heads !== defaults.heads ? Math.max(1, Math.floor(heads / 4)) : defaults.kvHeads);
  if (kvHeads > heads) {
    throw new UsageError(`--kv-heads (${kvHeads}) cannot exceed the query heads (${heads}${o.heads === undefined ? ', the default' : ''}); pass --heads as a multiple of it`);
  }
  if (heads % kvHeads !== 0) {
    throw new UsageError(
      `the query heads (${heads}${o.heads === undefined ? ', the default' : ''}) must be a multiple of --kv-heads (${kvHeads}); pass --heads and --kv-heads with H % Hkv == 0`,
    );
  }
  const headDim = o.headDim ?? defaults.headDim;
  if (headDim % 2 !== 0) throw new UsageError(`--head-dim must be even (rotary pairs); got ${headDim}`);
  return { n: o.n ?? defaults.n, heads, kvHeads, headDim };
}

async function loadScenario(sel: SelectedBackend, o: InputRequest, io: CliIo): Promise<Inputs> {
  const dims = scenarioDims(o, sel.defaults);
  const dtype = o.dtype ?? sel.dtype;
  const size: ProblemSize = { n: dims.n, H: dims.heads, Hkv: dims.kvHeads, d: dims.headDim, dtype, blockSize: o.blockSize, sampleRows: o.sampleRows, policies: o.policies };
  checkProblem(sel.backend, size, { kind: 'flags' });
  const slow = slowRunNote(size, sel.name === 'reference');
  if (slow) io.stderr.write(`note: ${slow}\n`);
  const t0 = performance.now();
  const sc = scenario(o.profile, { ...dims, dtype, seed: o.seed });
  const setupMs = performance.now() - t0;
  const threads = o.threads ?? synthThreads();
  const entry = synthWorkerEntry();
  const parallel = threads > 1 && (o.threads !== undefined || dims.n * dims.heads * dims.headDim >= PARALLEL_MIN_VALUES);
  if (parallel && !entry) io.stderr.write('note: generating the scenario on one thread (this entry of crisp cannot start worker threads)\n');
  const bar = progressBar(io.stderr, `generating + upload${parallel && entry ? ` (${threads} threads)` : ''}`, sc.n);
  let t: ScenarioTensors | undefined;
  let used = 1;
  try {
    if (parallel && entry) {
      const spec = { profile: sc.profile, n: sc.n, heads: sc.heads, kvHeads: sc.kvHeads, headDim: sc.headDim, seed: sc.seed, dtype: sc.dtype };
      try {
        t = await uploadScenarioParallel(sel.backend, spec, { threads, workerUrl: entry, onProgress: (r) => bar.update(r) });
        used = threads;
      } catch (e) {
        io.stderr.write(`note: worker threads failed (${e instanceof Error ? e.message : String(e)}); generating on one thread\n`);
      }
    }
    t ??= await uploadScenario(sel.backend, sc, { onProgress: (r) => bar.update(r) });
  } finally {
    bar.stop();
  }
  return {
    q: t.q,
    k: t.k,
    v: t.v,
    timing: { generateMs: setupMs + (t.timing?.generateMs ?? 0), uploadMs: t.timing?.writeMs ?? 0, threads: used },
    n: sc.n,
    H: sc.heads,
    Hkv: sc.kvHeads,
    d: sc.headDim,
    dtype: sc.dtype,
    qRow: async (i) => toF32(sc.rows(i, i + 1).q),
    scenario: sc,
    source: `scenario ${sc.profile} (seed ${sc.seed})`,
    close: async () => {},
  };
}

// ------------------------------------------------------------------------ dumps

/**
 * @crisp/io's advice names its options ({ uint16As }, names: {...}, layout '...'); the
 * command's user passes flags instead. Same code, same details, the flag in the words.
 */
export function inFlagWords(e: unknown): unknown {
  if (!(e instanceof CrispError)) return e;
  const m = e.message
    .replace(/pass \{ ?uint16As: '?bf16'? ?\}/g, 'pass --npy-uint16 bf16')
    .replace(/uint16As: '?bf16'? was given; drop that option/g, '--npy-uint16 bf16 was given; drop that flag')
    .replace(/\{ ?uint16As: '?bf16'? ?\}/g, '--npy-uint16 bf16')
    .replace(/pick one with names: \{ ?([qkv]): '[^']*' ?\}/g, 'pick one with --names $1=NAME')
    .replace(/(pass|give) names: \{[^}]*\}/g, '$1 --names q=NAME,k=NAME,v=NAME')
    .replace(/pass layout '(\w+)'/g, 'pass --layout $1')
    .replace(/pass dtype to convert/g, 'pass --dtype to convert');
  if (m === e.message) return e;
  const out = new CrispError(e.code, m, e.details);
  out.stack = `${out.name}: ${m}`;
  return out;
}

const KIND_OF = (st: Awaited<ReturnType<typeof stat>>): string =>
  st.isDirectory()
    ? 'a directory'
    : st.isFIFO()
      ? 'a FIFO (named pipe)'
      : st.isCharacterDevice()
        ? 'a character device'
        : st.isBlockDevice()
          ? 'a block device'
          : st.isSocket()
            ? 'a socket'
            : 'not a regular file';

export async function statOrThrow(path: string, what: string): Promise<Awaited<ReturnType<typeof stat>>> {
  try {
    return await stat(path);
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    const why =
      code === 'ENOENT'
        ? 'no such file or directory: check the path'
        : code === 'EACCES' || code === 'EPERM'
          ? 'permission denied: check the permissions'
          : code === 'ENOTDIR'
            ? 'a part of the path is not a directory'
            : code === 'ELOOP'
              ? 'too many symbolic links (a loop?)'
              : String((e as Error).message);
    throw new CrispError('IO_ERROR', `cannot open ${path} (${what}): ${why}`, { path, errno: code });
  }
}

/** Opens a file only when it is a regular file: a FIFO or device would block or stream forever. */
export async function openRegular(path: string, what: string, open: () => Promise<TensorFile>): Promise<TensorFile> {
  const st = await statOrThrow(path, what);
  if (!st.isFile()) {
    throw new CrispError('IO_ERROR', `cannot read ${path} (${what}): it is ${KIND_OF(st)}, not a regular file; give a safetensors or .npy file`, { path });
  }
  try {
    return await open();
  } catch (e) {
    throw inFlagWords(e);
  }
}

export interface Role {
  readonly file: TensorFile;
  readonly name: string;
  readonly info: TensorInfo;
}

const FILE_DTYPE_NAMES: Readonly<Record<string, string>> = {
  F64: 'float64',
  F32: 'float32',
  F16: 'float16',
  BF16: 'bfloat16',
  I64: 'int64',
  I32: 'int32',
  I16: 'int16',
  I8: 'int8',
  U64: 'uint64',
  U32: 'uint32',
  U16: 'uint16',
  U8: 'uint8',
  BOOL: 'bool',
  F8_E4M3: 'float8 e4m3',
  F8_E5M2: 'float8 e5m2',
};

export function roleOf(file: TensorFile, name: string, role: string): Role {
  const info = file.tensor(name);
  if (info.dtype === undefined) {
    const friendly = FILE_DTYPE_NAMES[info.fileDtype];
    throw new CrispError(
      'UNSUPPORTED',
      `${file.path}: ${role} tensor '${name}' is ${info.fileDtype}${friendly ? ` (${friendly})` : ''}; Q/K/V must be F32, F16 or BF16: convert before saving (torch: x.to(torch.float32), numpy: x.astype(np.float32))`,
      { path: file.path, name, dtype: info.fileDtype },
    );
  }
  return { file, name, info };
}

const LAYOUT_TEXT: Readonly<Record<Layout, string>> = { nhd: '[n, H, d]', '1nhd': '[1, n, H, d]', hnd: '[H, n, d]' };

function dimsOrNull(shape: readonly number[], layout: Layout): QkvDims | null {
  if (shape.length !== (layout === '1nhd' ? 4 : 3)) return null;
  if (layout === '1nhd' && shape[0] !== 1) return null;
  try {
    return dimsFromFileShape(shape, layout, 'tensor');
  } catch {
    return null;
  }
}

function fits(q: QkvDims, k: QkvDims, v: QkvDims): boolean {
  return q.n === k.n && k.n === v.n && k.H === v.H && k.d === v.d && q.d === k.d && q.H % k.H === 0;
}

/** n, H, Hkv, d of q/k/v under the layout, or a SHAPE_MISMATCH that names the flag to pass. */
export function qkvDims(
  shapes: { readonly q: readonly number[]; readonly k: readonly number[]; readonly v: readonly number[] },
  layout: Layout,
  where: string,
): { q: QkvDims; k: QkvDims; v: QkvDims } {
  const text = `q [${shapes.q.join(', ')}], k [${shapes.k.join(', ')}], v [${shapes.v.join(', ')}]`;
  const others = (['nhd', '1nhd', 'hnd'] as const).filter((l) => l !== layout);
  const alt = others.find((l) => {
    const [a, b, c] = [dimsOrNull(shapes.q, l), dimsOrNull(shapes.k, l), dimsOrNull(shapes.v, l)];
    return a !== null && b !== null && c !== null && fits(a, b, c) && a.n >= a.H;
  });
  const hint = alt ? `; they fit as ${LAYOUT_TEXT[alt]}: pass --layout ${alt}` : '';
  for (const [role, shape] of Object.entries(shapes)) {
    const want = layout === '1nhd' ? 4 : 3;
    if (shape.length !== want || (layout === '1nhd' && shape[0] !== 1)) {
      const batch = shape.length === 4 && shape[0] !== 1 ? `; the leading (batch) dim is ${shape[0]}: only a batch of one is supported, save one batch element` : '';
      throw new ShapeError(
        `${where}: ${role} has shape [${shape.join(', ')}], but --layout ${layout} means ${LAYOUT_TEXT[layout]}${hint || batch || '; Q/K/V must be stored as [n, H, d] (--layout nhd), [1, n, H, d] (--layout 1nhd) or [H, n, d] (--layout hnd)'}`,
        { ...shapes, layout },
      );
    }
  }
  const q = dimsFromFileShape(shapes.q, layout, `${where}: q`);
  const k = dimsFromFileShape(shapes.k, layout, `${where}: k`);
  const v = dimsFromFileShape(shapes.v, layout, `${where}: v`);
  if (!fits(q, k, v)) {
    if (alt) throw new ShapeError(`${where}: ${text} do not fit together as ${LAYOUT_TEXT[layout]}${hint}`, { ...shapes, layout });
    if (q.n !== k.n && k.n === v.n && q.d === k.d) {
      throw new CrispError('UNSUPPORTED', `${where}: q has ${q.n} rows and k ${k.n}; crisp run needs full prefill (q and k of equal length)`, { ...shapes });
    }
    if (q.H % k.H !== 0 && k.n === v.n && k.H === v.H && q.d === k.d && q.n === k.n) {
      throw new ShapeError(`${where}: q's ${q.H} heads are not a multiple of k's ${k.H} (GQA needs H % Hkv == 0)`, { ...shapes });
    }
    throw new ShapeError(
      `${where}: ${text} read as ${LAYOUT_TEXT[layout]} do not fit together (k and v must be equal, q and k of equal length and head dim, q's heads a multiple of k's)`,
      { ...shapes, layout },
    );
  }
  if (q.H > q.n && alt) {
    throw new ShapeError(`${where}: ${text} read as ${LAYOUT_TEXT[layout]} give ${q.n} tokens and ${q.H} heads, which looks transposed${hint}`, { ...shapes, layout });
  }
  return { q, k, v };
}

/** The q/k/v tensors a --qkv path names: one safetensors file, or three .npy files of a directory. */
async function openRoles(o: InputRequest): Promise<{ roles: Record<'q' | 'k' | 'v', Role>; files: TensorFile[] }> {
  const path = o.qkv!;
  const st = await statOrThrow(path, '--qkv');
  const files: TensorFile[] = [];
  const npyOpts = { uint16As: o.npyUint16 };
  try {
    if (st.isDirectory()) {
      let entries: string[];
      try {
        entries = (await readdir(path)).filter((f) => f.toLowerCase().endsWith('.npy'));
      } catch (e) {
        throw new CrispError('IO_ERROR', `cannot list ${path} (--qkv): ${(e as Error).message}`, { path });
      }
      if (entries.length === 0) {
        throw new CrispError('FORMAT_ERROR', `--qkv ${path} is a directory with no .npy files; give a directory holding q.npy, k.npy and v.npy, or a safetensors file`, { path });
      }
      const stems = entries.map((f) => f.slice(0, -4));
      let names: ReturnType<typeof resolveQkvNames>;
      try {
        names = resolveQkvNames(stems, `directory ${path}`, o.names);
      } catch (e) {
        throw inFlagWords(e);
      }
      const byStem = new Map<string, TensorFile>();
      const roles = {} as Record<'q' | 'k' | 'v', Role>;
      for (const role of ['q', 'k', 'v'] as const) {
        const stem = names[role];
        let file = byStem.get(stem);
        if (!file) {
          const full = join(path, entries[stems.indexOf(stem)]);
          file = await openRegular(full, `${role} of --qkv`, () => openNpy(full, { ...npyOpts, name: stem }));
          files.push(file);
          byStem.set(stem, file);
        }
        roles[role] = roleOf(file, stem, role);
      }
      return { roles, files };
    }
    const file = await openRegular(path, '--qkv', () => openTensorFile(path, npyOpts));
    files.push(file);
    if (file.format === 'npy') {
      throw new CrispError(
        'INVALID_ARGUMENT',
        `--qkv ${path} is a single .npy array; give the directory holding q.npy, k.npy and v.npy, or a safetensors file with all three`,
        { path },
      );
    }
    let names: ReturnType<typeof resolveQkvNames>;
    try {
      names = resolveQkvNames(
        file.tensors.map((t) => t.name),
        path,
        o.names,
      );
    } catch (e) {
      throw inFlagWords(e);
    }
    const roles = { q: roleOf(file, names.q, 'q'), k: roleOf(file, names.k, 'k'), v: roleOf(file, names.v, 'v') };
    return { roles, files };
  } catch (e) {
    for (const f of files) await f.close().catch(() => undefined);
    throw e;
  }
}

/**
 * A Q/K/V dump: sizes checked from the headers, then q, k, v stream onto the backend in row
 * chunks (@crisp/io's uploadTensor), so a multi-gigabyte dump never sits in one JS array; the
 * sampled q rows for mass recall are read back from the file one row at a time.
 */
async function loadDump(sel: SelectedBackend, o: InputRequest, io: CliIo): Promise<Inputs> {
  const layer = o.dumpLayer;
  const path = layer?.source ?? o.qkv!;
  let layout: Layout;
  try {
    layout = parseLayout(o.layout ?? 'nhd');
  } catch {
    throw new UsageError(`--layout must be one of nhd ([n,H,d]), 1nhd ([1,n,H,d]) or hnd ([H,n,d]); got '${o.layout}'`);
  }
  // (a layer's files belong to its layer set, which closes them)
  const { roles, files } = layer
    ? { roles: { q: roleOf(layer.tensors.q.file, layer.tensors.q.name, 'q'), k: roleOf(layer.tensors.k.file, layer.tensors.k.name, 'k'), v: roleOf(layer.tensors.v.file, layer.tensors.v.name, 'v') }, files: [] as TensorFile[] }
    : await openRoles(o);
  const made: DeviceTensor[] = [];
  try {
    const dims = qkvDims({ q: roles.q.info.shape, k: roles.k.info.shape, v: roles.v.info.shape }, layout, path);
    const fileDtypes = [roles.q.info.dtype!, roles.k.info.dtype!, roles.v.info.dtype!];
    const dtype = o.dtype ?? fileDtypes[0];
    if (!o.dtype && (fileDtypes[1] !== dtype || fileDtypes[2] !== dtype)) {
      throw new CrispError('DTYPE_MISMATCH', `${path}: q, k, v dtypes differ (${fileDtypes.join(', ')}); pass --dtype to convert them`);
    }
    const size: ProblemSize = { n: dims.q.n, H: dims.q.H, Hkv: dims.k.H, d: dims.q.d, dtype, blockSize: o.blockSize, sampleRows: o.sampleRows, policies: o.policies };
    checkProblem(sel.backend, size, { kind: 'file', path });
    const slow = slowRunNote(size, sel.name === 'reference');
    if (slow) io.stderr.write(`note: ${slow}\n`);
    const t0 = performance.now();
    for (const role of ['q', 'k', 'v'] as const) {
      const r = roles[role];
      const bar = progressBar(io.stderr, `upload ${role}`, dims.q.n);
      try {
        made.push(await uploadTensor(sel.backend, r.file, r.name, { layout, dtype, onProgress: (x) => bar.update(x) }));
      } catch (e) {
        throw inFlagWords(e);
      } finally {
        bar.stop();
      }
    }
    const uploadMs = performance.now() - t0;
    return {
      q: made[0],
      k: made[1],
      v: made[2],
      timing: { generateMs: null, uploadMs, threads: 1 },
      n: dims.q.n,
      H: dims.q.H,
      Hkv: dims.k.H,
      d: dims.q.d,
      dtype,
      qRow: async (i) => toF32(await readTensor(roles.q.file, roles.q.name, { layout, dtype, rows: [i, i + 1] })),
      source: path,
      convertedFrom: fileDtypes.find((x) => x !== dtype),
      close: async () => {
        for (const f of files) await f.close().catch(() => undefined);
      },
    };
  } catch (e) {
    for (const t of made) t.dispose();
    for (const f of files) await f.close().catch(() => undefined);
    throw e;
  }
}

export async function loadInputs(sel: SelectedBackend, o: InputRequest, io: CliIo): Promise<Inputs> {
  return o.qkv !== undefined || o.dumpLayer !== undefined ? loadDump(sel, o, io) : loadScenario(sel, o, io);
}
