/**
 * NumPy .npy reader and header writer. Format: the magic "\x93NUMPY", a major and minor
 * version byte, a little-endian header length (2 bytes in v1, 4 in v2/v3), then a Python
 * dict literal {'descr': '<f4', 'fortran_order': False, 'shape': (n, H, d), } padded with
 * spaces and a newline, then the raw C-order data.
 *
 * Hand-written: the maintained npm parser (npyjs) needs the whole file as one
 * ArrayBuffer and has no bf16; streaming needs only the header and the data offset.
 *
 * NumPy has no bfloat16. bf16 tensors travel as their 16-bit patterns: written with
 * descr '<u2' (what `torch_tensor.view(torch.uint16).numpy()` saves), read back from
 * '<u2' or '<V2' (ml_dtypes' bfloat16 saves as a 2-byte void) when the caller says
 * `uint16As: 'bf16'`.
 *
 * Strict as NumPy's own reader: exactly the keys 'descr', 'fortran_order' and 'shape', a
 * tuple shape of non-negative integers, a bounded header length; and stricter in one
 * place: data bytes beyond what the shape accounts for are refused (a wrong shape).
 */
import type { FileHandle } from 'node:fs/promises';
import { basename } from 'node:path';
import { type DType, InvalidArgumentError, UnsupportedError, assertKnownKeys } from '@crisp/core';
import { assertLittleEndianHost, describeValue, formatError, openForRead, readExactly } from './file-handle.js';
import { OpenTensorFile, type TensorFile, type TensorInfo } from './tensor-file.js';

export const NPY_MAGIC = [0x93, 0x4e, 0x55, 0x4d, 0x50, 0x59]; // \x93NUMPY

/**
 * Largest .npy header read (1 MiB). NumPy itself refuses headers above 10,000 characters
 * by default; a Q/K/V header is under 128 bytes, so anything near this is a corrupt length.
 */
export const MAX_NPY_HEADER = 1 << 20;

export interface NpyOpenOptions {
  /** What '<u2' / '<V2' elements hold: NumPy cannot say bf16 itself. */
  readonly uint16As?: 'bf16';
  /** Tensor name to report (default: the file name without `.npy`). */
  readonly name?: string;
}

export interface NpyHeader {
  readonly descr: string;
  readonly fortranOrder: boolean;
  readonly shape: number[];
  /** Byte offset of the data. */
  readonly dataOffset: number;
}

/** Checks NpyOpenOptions (a typo or a wrong value is an INVALID_ARGUMENT, not ignored). */
export function checkNpyOptions(opts: unknown, what = 'options'): NpyOpenOptions {
  if (opts === undefined || opts === null) return {};
  if (typeof opts !== 'object' || Array.isArray(opts)) {
    throw new InvalidArgumentError(`${what} must be an object like { uint16As: 'bf16' }; got ${describeValue(opts)}`);
  }
  const o = opts as Record<string, unknown>;
  assertKnownKeys(o, ['uint16As', 'name'], what, 'option');
  if (o.uint16As !== undefined && o.uint16As !== 'bf16') {
    throw new InvalidArgumentError(`uint16As must be 'bf16' (the only 16-bit integer reading) or absent; got ${describeValue(o.uint16As)}`);
  }
  if (o.name !== undefined && typeof o.name !== 'string') {
    throw new InvalidArgumentError(`name must be a string; got ${describeValue(o.name)}`);
  }
  return o as NpyOpenOptions;
}

// --- a tiny parser for the Python literals an .npy header uses ----------------------

type PyValue = string | number | boolean | null | PyValue[] | Map<string, PyValue>;

function parsePyLiteral(src: string, path: string): { value: PyValue; tuples: WeakSet<PyValue[]> } {
  let i = 0;
  const tuples = new WeakSet<PyValue[]>();
  const fail = (what: string): never => {
    const shown = src.trim().length > 200 ? `${JSON.stringify(src.trim().slice(0, 200))}...` : JSON.stringify(src.trim());
    throw formatError(`${path}: the .npy header ${shown} is not a valid Python literal (${what} at character ${i}); the file is corrupt`, {
      path,
    });
  };
  const ws = () => {
    while (i < src.length && /\s/.test(src[i])) i++;
  };
  const value = (depth: number): PyValue => {
    if (depth > 16) fail('nesting too deep');
    ws();
    const c = src[i];
    if (c === '{') {
      i++;
      const out = new Map<string, PyValue>();
      for (;;) {
        ws();
        if (src[i] === '}') {
          i++;
          return out;
        }
        const keyAt = i;
        const key = value(depth + 1);
        if (typeof key !== 'string') fail('a non-string dict key');
        if (out.has(key as string)) {
          i = keyAt;
          fail(`a duplicate key '${key}'`);
        }
        ws();
        if (src[i] !== ':') fail("a missing ':'");
        i++;
        out.set(key as string, value(depth + 1));
        ws();
        if (src[i] === ',') i++;
        else if (src[i] !== '}') fail("a missing ',' or '}'");
      }
    }
    if (c === '(' || c === '[') {
      const close = c === '(' ? ')' : ']';
      i++;
      const out: PyValue[] = [];
      if (c === '(') tuples.add(out);
      for (;;) {
        ws();
        if (src[i] === close) {
          i++;
          return out;
        }
        out.push(value(depth + 1));
        ws();
        if (src[i] === ',') i++;
        else if (src[i] !== close) fail(`a missing ',' or '${close}'`);
      }
    }
    if (c === "'" || c === '"') {
      const end = src.indexOf(c, i + 1);
      if (end < 0) fail('an unterminated string');
      const s = src.slice(i + 1, end);
      if (s.includes('\\') || s.includes('\n')) fail('an escape or newline inside a string');
      i = end + 1;
      return s;
    }
    const m = /^(True|False|None|-?\d+L?)/.exec(src.slice(i, i + 40));
    if (m === null) return fail(i >= src.length ? 'an unexpected end' : 'an unexpected token');
    i += m[0].length;
    if (m[0] === 'True') return true;
    if (m[0] === 'False') return false;
    if (m[0] === 'None') return null;
    const n = Number.parseInt(m[0], 10);
    // Too many digits for an exact double: keep it out of range rather than rounded.
    return m[0].replace(/^-|L$/g, '').length > 16 ? Number.POSITIVE_INFINITY : n;
  };
  const v = value(0);
  ws();
  if (i !== src.length) fail('trailing characters');
  return { value: v, tuples };
}

const NUMPY_NAMES = new Map<string, string>([
  ['f8', 'float64'],
  ['f4', 'float32'],
  ['f2', 'float16'],
  ['f16', 'float128'],
  ['f12', 'float96'],
  ['i1', 'int8'],
  ['i2', 'int16'],
  ['i4', 'int32'],
  ['i8', 'int64'],
  ['u1', 'uint8'],
  ['u2', 'uint16'],
  ['u4', 'uint32'],
  ['u8', 'uint64'],
  ['b1', 'bool'],
  ['c8', 'complex64'],
  ['c16', 'complex128'],
  ['c32', 'complex256'],
  ['V2', 'a 2-byte void (ml_dtypes bfloat16?)'],
  ['O', 'Python objects (a pickled array, e.g. a custom dtype saved by np.save)'],
]);

function numpyName(code: string, descr: string): string {
  if (NUMPY_NAMES.has(code)) return NUMPY_NAMES.get(code) as string;
  if (/^[SUa]\d*$/.test(code)) return 'strings';
  if (/^[mM]8/.test(code)) return 'dates/times';
  if (/^V\d+$/.test(code)) return `a ${code.slice(1)}-byte void`;
  return `an unknown type '${descr}'`;
}

/** Maps a descr to a library dtype, or explains why it cannot be read. */
export function npyDescrToDType(descr: string, uint16As: 'bf16' | undefined, path: string): DType {
  const m = /^([<>=|])([a-zA-Z]\d*)(?:\[[^\]]*\])?$/.exec(descr);
  const order = m?.[1];
  const code = m?.[2] ?? descr;
  const name = numpyName(code, descr);
  if (order === '>' && code !== 'u1' && code !== 'i1' && code !== 'b1') {
    throw new UnsupportedError(
      `${path} holds big-endian ${name} ('${descr}'); re-save it little-endian: np.save(path, x.astype(x.dtype.newbyteorder('<')))`,
      { path, descr },
    );
  }
  if (code === 'f4' && order !== '|') return 'f32';
  if (code === 'f2' && order !== '|') {
    if (uint16As === 'bf16') {
      throw new UnsupportedError(`${path} holds float16 ('${descr}') but uint16As: 'bf16' was given; drop that option to read it as f16`, {
        path,
        descr,
      });
    }
    return 'f16';
  }
  if ((code === 'u2' && order !== '|') || code === 'V2' || descr === 'bfloat16') {
    if (uint16As === 'bf16') return 'bf16';
    throw new UnsupportedError(
      `${path} holds ${name} ('${descr}'): if these are bf16 bit patterns (e.g. saved from torch x.view(torch.uint16), or an ml_dtypes bfloat16 array), pass { uint16As: 'bf16' }; otherwise convert with x.astype(np.float32)`,
      { path, descr },
    );
  }
  throw new UnsupportedError(
    `${path} holds ${name} ('${descr}'), which @crisp/io does not read: Q/K/V must be float32 ('<f4'), float16 ('<f2') or bf16 bit patterns ('<u2' with { uint16As: 'bf16' }); convert with x.astype(np.float32)`,
    { path, descr },
  );
}

/** Parses the fixed prefix and header dict of an .npy file held in `bytes`. */
export function parseNpyHeader(bytes: Uint8Array, fileSize: number, path: string): NpyHeader | { needBytes: number } {
  if (bytes.length < 8 || fileSize < 10) {
    throw formatError(`${path} is ${fileSize} bytes: too short for an .npy file; it is truncated or not .npy`, { path });
  }
  for (let j = 0; j < 6; j++) {
    if (bytes[j] !== NPY_MAGIC[j]) throw formatError(`${path} is not an .npy file (no \\x93NUMPY magic)`, { path });
  }
  const major = bytes[6];
  const minor = bytes[7];
  if (major < 1 || major > 3 || minor !== 0) {
    throw new UnsupportedError(`${path} is .npy format version ${major}.${minor}; only versions 1.0, 2.0 and 3.0 are read`, { path });
  }
  const prefix = major === 1 ? 10 : 12;
  if (fileSize < prefix) {
    throw formatError(`${path} is ${fileSize} bytes: too short for an .npy ${major}.0 file; it is truncated`, { path });
  }
  if (bytes.length < prefix) return { needBytes: prefix };
  const dv = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const headerLen = major === 1 ? dv.getUint16(8, true) : dv.getUint32(8, true);
  if (headerLen > MAX_NPY_HEADER) {
    throw formatError(
      `${path}: the .npy header length field says ${headerLen} bytes: header too large (limit ${MAX_NPY_HEADER} bytes; a Q/K/V header is under 200); the file is corrupt`,
      { path, headerLen },
    );
  }
  const dataOffset = prefix + headerLen;
  if (dataOffset > fileSize) {
    throw formatError(
      `${path}: the .npy header claims ${headerLen} bytes but the file is only ${fileSize} bytes: it is truncated; re-save it`,
      { path },
    );
  }
  if (bytes.length < dataOffset) return { needBytes: dataOffset };
  let text: string;
  try {
    text = new TextDecoder(major === 3 ? 'utf-8' : 'latin1', { fatal: true }).decode(bytes.subarray(prefix, dataOffset));
  } catch {
    throw formatError(`${path}: the .npy header is not valid UTF-8; the file is corrupt`, { path });
  }
  const { value: dict, tuples } = parsePyLiteral(text, path);
  if (!(dict instanceof Map)) {
    throw formatError(`${path}: the .npy header is not a dict; the file is corrupt`, { path });
  }
  const keys = [...dict.keys()];
  const missing = ['descr', 'fortran_order', 'shape'].filter((k) => !dict.has(k));
  const extra = keys.filter((k) => k !== 'descr' && k !== 'fortran_order' && k !== 'shape');
  if (missing.length > 0 || extra.length > 0) {
    const list = (ks: string[]) => ks.map((k) => `'${k}'`).join(', ');
    throw formatError(
      `${path}: the .npy header ${missing.length > 0 ? `lacks ${list(missing)}` : 'has more than its three keys'}${extra.length > 0 ? ` and has unexpected keys ${list(extra)}` : ''} (NumPy writes exactly 'descr', 'fortran_order', 'shape'); the file is corrupt`,
      { path },
    );
  }
  const descr = dict.get('descr');
  const fortran = dict.get('fortran_order');
  const shape = dict.get('shape');
  if (Array.isArray(descr)) {
    throw new UnsupportedError(`${path} holds a structured array (descr ${JSON.stringify(descr)}); save plain float arrays`, { path });
  }
  if (typeof descr !== 'string' || typeof fortran !== 'boolean' || !Array.isArray(shape)) {
    throw formatError(
      `${path}: the .npy header lacks 'descr' (a string), 'fortran_order' (True/False) or 'shape' (a tuple); the file is corrupt`,
      { path },
    );
  }
  if (!tuples.has(shape) || shape.some((s) => typeof s !== 'number' || !Number.isSafeInteger(s) || s < 0)) {
    throw formatError(`${path}: the .npy shape ${JSON.stringify(shape)} is not a tuple of non-negative integers; the file is corrupt`, {
      path,
    });
  }
  const dims = shape as number[];
  if (dims.length > 64) {
    throw formatError(`${path}: the .npy shape has ${dims.length} dimensions (NumPy allows at most 64); the file is corrupt`, { path });
  }
  if (!Number.isSafeInteger(dims.reduce((a, s) => a * s, 1))) {
    throw formatError(`${path}: the .npy shape (${dims.join(', ')}) has more elements than any file can hold; the header is corrupt`, {
      path,
    });
  }
  return { descr, fortranOrder: fortran, shape: dims, dataOffset };
}

/** Everything about an .npy file's one tensor, from its header: the checks `openNpy` makes. */
export function npyTensorInfo(header: NpyHeader, fileSize: number, path: string, opts: NpyOpenOptions = {}): TensorInfo {
  const dtype = npyDescrToDType(header.descr, opts.uint16As, path);
  if (header.fortranOrder && header.shape.filter((s) => s !== 1).length > 1) {
    throw new UnsupportedError(`${path} is stored in Fortran (column-major) order; re-save it C-ordered: np.save(path, np.ascontiguousarray(x))`, {
      path,
    });
  }
  const byteLength = header.shape.reduce((a, s) => a * s, 1) * (dtype === 'f32' ? 4 : 2);
  const follow = fileSize - header.dataOffset;
  if (byteLength > follow) {
    throw formatError(
      `${path}: the .npy header says ${header.descr} (${header.shape.join(', ')}) = ${byteLength} data bytes but only ${follow} follow the header: the file is truncated; re-save it`,
      { path },
    );
  }
  if (byteLength < follow) {
    throw formatError(
      `${path}: the .npy header says ${header.descr} (${header.shape.join(', ')}) = ${byteLength} data bytes but ${follow} follow the header: ${follow - byteLength} trailing bytes belong to no array (a wrong shape in the header, or data appended); re-save it with np.save`,
      { path },
    );
  }
  return {
    name: opts.name ?? basename(path).replace(/\.npy$/i, ''),
    fileDtype: header.descr,
    dtype,
    shape: header.shape,
    byteOffset: header.dataOffset,
    byteLength,
  };
}

/** Parses a whole .npy file held in memory (the same checks as `openNpy`). */
export function parseNpyBuffer(bytes: Uint8Array, opts: NpyOpenOptions = {}, path = '<buffer>'): TensorInfo {
  const header = parseNpyHeader(bytes, bytes.length, path);
  if ('needBytes' in header) throw formatError(`${path} is truncated inside the .npy header`, { path });
  return npyTensorInfo(header, bytes.length, path, checkNpyOptions(opts));
}

/** Reads and checks the header of an open .npy file; the caller owns the handle. */
export async function openNpyHandle(handle: FileHandle, size: number, path: string, opts: NpyOpenOptions): Promise<TensorFile> {
  let want = Math.min(size, 4096);
  let header: NpyHeader | { needBytes: number };
  for (;;) {
    const bytes = new Uint8Array(want);
    await readExactly(handle, bytes, 0, path);
    header = parseNpyHeader(bytes, size, path);
    if (!('needBytes' in header)) break;
    want = header.needBytes;
  }
  const info = npyTensorInfo(header, size, path, opts);
  return new OpenTensorFile(handle, path, 'npy', size, [info], {});
}

/** Opens an .npy file, reading only its header. Close it (or `await using`) when done. */
export async function openNpy(path: string, opts: NpyOpenOptions = {}): Promise<TensorFile> {
  assertLittleEndianHost();
  const o = checkNpyOptions(opts);
  const { handle, size } = await openForRead(path);
  try {
    return await openNpyHandle(handle, size, path, o);
  } catch (e) {
    await handle.close().catch(() => undefined);
    throw e;
  }
}

/** The .npy v1.0 prefix + header for a C-order array, padded so data starts 64-byte aligned. */
export function encodeNpyHeader(descr: string, shape: readonly number[]): Uint8Array {
  const shapeText = shape.length === 1 ? `(${shape[0]},)` : `(${shape.join(', ')})`;
  let dict = `{'descr': '${descr}', 'fortran_order': False, 'shape': ${shapeText}, }`;
  const total = 10 + dict.length + 1;
  dict += ' '.repeat((64 - (total % 64)) % 64) + '\n';
  if (dict.length > 0xffff) throw new UnsupportedError(`shape [${shape.join(', ')}] makes an .npy header too long for format 1.0`);
  const out = new Uint8Array(10 + dict.length);
  out.set(NPY_MAGIC, 0);
  out[6] = 1;
  out[7] = 0;
  new DataView(out.buffer).setUint16(8, dict.length, true);
  for (let j = 0; j < dict.length; j++) out[10 + j] = dict.charCodeAt(j);
  return out;
}
