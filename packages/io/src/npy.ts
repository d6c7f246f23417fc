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
 */
import { basename } from 'node:path';
import { type DType, UnsupportedError, numel } from '@crisp/core';
import { assertLittleEndianHost, formatError, openForRead, readExactly } from './file-handle.js';
import { OpenTensorFile, type TensorFile, type TensorInfo } from './tensor-file.js';

export const NPY_MAGIC = [0x93, 0x4e, 0x55, 0x4d, 0x50, 0x59]; // \x93NUMPY

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

// --- a tiny parser for the Python literals an .npy header uses ----------------------

type PyValue = string | number | boolean | null | PyValue[] | { [k: string]: PyValue };

function parsePyLiteral(src: string, path: string): PyValue {
  let i = 0;
  const fail = (what: string): never => {
    throw formatError(`${path}: the .npy header ${JSON.stringify(src.trim())} is not a valid Python literal (${what} at character ${i}); the file is corrupt`, {
      path,
    });
  };
  const ws = () => {
    while (i < src.length && /\s/.test(src[i])) i++;
  };
  const value = (): PyValue => {
    ws();
    const c = src[i];
    if (c === '{') {
      i++;
      const out: Record<string, PyValue> = {};
      for (;;) {
        ws();
        if (src[i] === '}') {
          i++;
          return out;
        }
        const key = value();
        if (typeof key !== 'string') fail('a non-string dict key');
        ws();
        if (src[i] !== ':') fail("a missing ':'");
        i++;
        out[key as string] = value();
        ws();
        if (src[i] === ',') i++;
        else if (src[i] !== '}') fail("a missing ',' or '}'");
      }
    }
    if (c === '(' || c === '[') {
      const close = c === '(' ? ')' : ']';
      i++;
      const out: PyValue[] = [];
      for (;;) {
        ws();
        if (src[i] === close) {
          i++;
          return out;
        }
        out.push(value());
        ws();
        if (src[i] === ',') i++;
        else if (src[i] !== close) fail(`a missing ',' or '${close}'`);
      }
    }
    if (c === "'" || c === '"') {
      const end = src.indexOf(c, i + 1);
      if (end < 0) fail('an unterminated string');
      const s = src.slice(i + 1, end);
      i = end + 1;
      return s;
    }
    const m = /^(True|False|None|-?\d+L?)/.exec(src.slice(i));
    if (m === null) return fail('an unexpected token');
    i += m[0].length;
    if (m[0] === 'True') return true;
    if (m[0] === 'False') return false;
    if (m[0] === 'None') return null;
    return Number.parseInt(m[0], 10);
  };
  const v = value();
  ws();
  if (i !== src.length) fail('trailing characters');
  return v;
}

const NUMPY_NAMES: Readonly<Record<string, string>> = {
  f8: 'float64',
  f4: 'float32',
  f2: 'float16',
  f16: 'float128',
  i1: 'int8',
  i2: 'int16',
  i4: 'int32',
  i8: 'int64',
  u1: 'uint8',
  u2: 'uint16',
  u4: 'uint32',
  u8: 'uint64',
  b1: 'bool',
  c8: 'complex64',
  c16: 'complex128',
  V2: 'a 2-byte void (ml_dtypes bfloat16?)',
};

/** Maps a descr to a library dtype, or explains why it cannot be read. */
export function npyDescrToDType(descr: string, uint16As: 'bf16' | undefined, path: string): DType {
  const m = /^([<>=|])([a-zA-Z]\d*)$/.exec(descr);
  const order = m?.[1];
  const code = m?.[2] ?? descr;
  const name = NUMPY_NAMES[code] ?? descr;
  if (order === '>' && code !== 'u1' && code !== 'i1' && code !== 'b1') {
    throw new UnsupportedError(
      `${path} holds big-endian ${name} ('${descr}'); re-save it little-endian: np.save(path, x.astype(x.dtype.newbyteorder('<')))`,
      { path, descr },
    );
  }
  if (code === 'f4') return 'f32';
  if (code === 'f2') {
    if (uint16As === 'bf16') {
      throw new UnsupportedError(`${path} holds float16 ('${descr}') but uint16As: 'bf16' was given; drop that option to read it as f16`, {
        path,
        descr,
      });
    }
    return 'f16';
  }
  if (code === 'u2' || code === 'V2' || descr === 'bfloat16') {
    if (uint16As === 'bf16') return 'bf16';
    throw new UnsupportedError(
      `${path} holds ${name} ('${descr}'): if these are bf16 bit patterns (e.g. saved from torch x.view(torch.uint16)), pass { uint16As: 'bf16' }; otherwise convert with x.astype(np.float32)`,
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
  for (let j = 0; j < 6; j++) {
    if (bytes[j] !== NPY_MAGIC[j]) throw formatError(`${path} is not an .npy file (no \\x93NUMPY magic)`, { path });
  }
  const major = bytes[6];
  const minor = bytes[7];
  if (major < 1 || major > 3) {
    throw new UnsupportedError(`${path} is .npy format version ${major}.${minor}; only versions 1.0 to 3.0 are read`, { path });
  }
  const dv = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const prefix = major === 1 ? 10 : 12;
  if (bytes.length < prefix) return { needBytes: prefix };
  const headerLen = major === 1 ? dv.getUint16(8, true) : dv.getUint32(8, true);
  const dataOffset = prefix + headerLen;
  if (dataOffset > fileSize) {
    throw formatError(
      `${path}: the .npy header claims ${headerLen} bytes but the file is only ${fileSize} bytes: it is truncated; re-save it`,
      { path },
    );
  }
  if (bytes.length < dataOffset) return { needBytes: dataOffset };
  const text = new TextDecoder(major === 3 ? 'utf-8' : 'latin1').decode(bytes.subarray(prefix, dataOffset));
  const dict = parsePyLiteral(text, path);
  if (dict === null || typeof dict !== 'object' || Array.isArray(dict)) {
    throw formatError(`${path}: the .npy header is not a dict; the file is corrupt`, { path });
  }
  const { descr, fortran_order: fortran, shape } = dict as Record<string, PyValue>;
  if (Array.isArray(descr)) {
    throw new UnsupportedError(`${path} holds a structured array (descr ${JSON.stringify(descr)}); save plain float arrays`, { path });
  }
  if (typeof descr !== 'string' || typeof fortran !== 'boolean' || !Array.isArray(shape)) {
    throw formatError(`${path}: the .npy header lacks 'descr', 'fortran_order' or 'shape'; the file is corrupt`, { path });
  }
  if (shape.some((s) => typeof s !== 'number' || !Number.isSafeInteger(s) || s < 0)) {
    throw formatError(`${path}: the .npy shape ${JSON.stringify(shape)} is not a tuple of non-negative integers`, { path });
  }
  return { descr, fortranOrder: fortran, shape: shape as number[], dataOffset };
}

/** Opens an .npy file, reading only its header. Close it (or `await using`) when done. */
export async function openNpy(path: string, opts: NpyOpenOptions = {}): Promise<TensorFile> {
  assertLittleEndianHost();
  const { handle, size } = await openForRead(path);
  try {
    let want = Math.min(size, 4096);
    let header: NpyHeader | { needBytes: number };
    for (;;) {
      if (size < 10) {
        throw formatError(`${path} is ${size} bytes: too short for an .npy file; it is truncated or not .npy`, { path });
      }
      const bytes = new Uint8Array(want);
      await readExactly(handle, bytes, 0, path);
      header = parseNpyHeader(bytes, size, path);
      if (!('needBytes' in header)) break;
      want = header.needBytes;
    }
    const dtype = npyDescrToDType(header.descr, opts.uint16As, path);
    if (header.fortranOrder && header.shape.filter((s) => s !== 1).length > 1) {
      throw new UnsupportedError(
        `${path} is stored in Fortran (column-major) order; re-save it C-ordered: np.save(path, np.ascontiguousarray(x))`,
        { path },
      );
    }
    const byteLength = numel(header.shape) * (dtype === 'f32' ? 4 : 2);
    if (header.dataOffset + byteLength > size) {
      throw formatError(
        `${path}: the .npy header says ${header.descr} [${header.shape.join(', ')}] = ${byteLength} data bytes but only ${size - header.dataOffset} follow the header: the file is truncated; re-save it`,
        { path },
      );
    }
    const info: TensorInfo = {
      name: opts.name ?? basename(path).replace(/\.npy$/i, ''),
      fileDtype: header.descr,
      dtype,
      shape: header.shape,
      byteOffset: header.dataOffset,
      byteLength,
    };
    return new OpenTensorFile(handle, path, 'npy', size, [info], {});
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
