/**
 * safetensors reader. The format is an 8-byte little-endian header length N, N bytes of
 * JSON ({name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}}), then
 * the data section; offsets are relative to the data section's start.
 *
 * Strict, as the format's specification and reference parser are: the header is at most
 * 100 MB, is UTF-8 JSON starting with '{' (trailing whitespace padding allowed), has no
 * duplicate keys, names only known dtypes, gives shapes and offsets as plain non-negative
 * integers, and its tensors cover the data section exactly: in offset order, each begins
 * where the previous ended, the first at 0 and the last at the end of the file (no holes,
 * no overlap, no trailing bytes).
 *
 * Hand-written rather than taken from npm: the packages there either parse a whole
 * in-memory buffer or fetch over HTTP with a browser cache, and none reads the header
 * alone and then tensor byte ranges at offsets from a file handle, which is what
 * streaming a 6 GB file needs.
 */
import type { FileHandle } from 'node:fs/promises';
import type { DType } from '@crisp/core';
import { assertLittleEndianHost, formatError, openForRead, readExactly } from './file-handle.js';
import { type JsonValue, JsonNumber, JsonSyntaxError, isJsonObject, parseStrictJson } from './strict-json.js';
import { OpenTensorFile, type TensorFile, type TensorInfo } from './tensor-file.js';

/** The reference implementation refuses headers above 100 MB; so do we (a corrupt length field). */
export const MAX_SAFETENSORS_HEADER = 100_000_000;

function table<T>(entries: Record<string, T>): Readonly<Record<string, T>> {
  return Object.freeze(Object.assign(Object.create(null) as Record<string, T>, entries));
}

/** Bits per element of every dtype the safetensors specification lists. */
export const SAFETENSORS_DTYPE_BITS: Readonly<Record<string, number>> = table({
  BOOL: 8,
  F4: 4,
  F6_E2M3: 6,
  F6_E3M2: 6,
  U8: 8,
  I8: 8,
  F8_E5M2: 8,
  F8_E4M3: 8,
  F8_E8M0: 8,
  F8_E4M3FNUZ: 8,
  F8_E5M2FNUZ: 8,
  I16: 16,
  U16: 16,
  F16: 16,
  BF16: 16,
  I32: 32,
  U32: 32,
  F32: 32,
  C64: 64,
  F64: 64,
  I64: 64,
  U64: 64,
});

/** Bytes per element for every safetensors dtype whose size is whole bytes. */
export const SAFETENSORS_DTYPE_BYTES: Readonly<Record<string, number>> = table(
  Object.fromEntries(
    Object.entries(SAFETENSORS_DTYPE_BITS)
      .filter(([, bits]) => bits % 8 === 0)
      .map(([k, bits]) => [k, bits / 8]),
  ),
);

const TO_DTYPE = new Map<string, DType>([
  ['F32', 'f32'],
  ['F16', 'f16'],
  ['BF16', 'bf16'],
]);
export const DTYPE_TO_SAFETENSORS: Readonly<Record<DType, string>> = { f32: 'F32', f16: 'F16', bf16: 'BF16' };

const has = (o: object, k: string) => Object.hasOwn(o, k);

/** What a file that is not safetensors probably is, from its first bytes. */
export function sniffForeign(head: Uint8Array): string | undefined {
  const ascii = (from: number, to: number) => String.fromCharCode(...head.subarray(from, to));
  if (head.length >= 6 && head[0] === 0x93 && ascii(1, 6) === 'NUMPY') return 'a NumPy .npy file';
  if (head.length >= 4 && head[0] === 0x50 && head[1] === 0x4b && head[2] === 3 && head[3] === 4) {
    return 'a zip archive (a PyTorch .pt/.bin checkpoint or an .npz): convert it with safetensors.torch.save_file or numpy.save';
  }
  if (head.length >= 2 && head[0] === 0x80 && head[1] >= 2 && head[1] <= 5) {
    return 'a Python pickle (torch.save of the legacy format): convert it with safetensors.torch.save_file';
  }
  if (head.length >= 4 && ascii(0, 4) === 'GGUF') return 'a GGUF model file';
  if (head.length >= 8 && head[0] === 0x89 && ascii(1, 4) === 'PNG') return 'a PNG image';
  if (head.length >= 2 && head[0] === 0x1f && head[1] === 0x8b) return 'a gzip archive: decompress it first';
  return undefined;
}

function hex(bytes: Uint8Array): string {
  return Array.from(bytes, (b) => b.toString(16).padStart(2, '0')).join(' ');
}

/**
 * Checks the fixed prefix (the first up to 16 bytes of a `fileSize`-byte file) and returns
 * the header length N. Too short, foreign, too large and truncated are told apart.
 */
export function safetensorsHeaderLength(head: Uint8Array, fileSize: number, path: string): number {
  if (fileSize < 8 || head.length < 8) {
    throw formatError(
      `${path} is ${fileSize} bytes: too short for a safetensors file (8-byte header length, then a JSON header); it is truncated or not safetensors`,
      { path, size: fileSize },
    );
  }
  const headerLen = new DataView(head.buffer, head.byteOffset, head.byteLength).getBigUint64(0, true);
  const foreign = sniffForeign(head);
  const looksJson = head.length > 8 && head[8] === 0x7b; // '{'
  if (foreign !== undefined && !looksJson) {
    throw formatError(`${path} is not a safetensors file: it looks like ${foreign}`, { path });
  }
  if (!looksJson) {
    throw formatError(
      `${path} is not a safetensors file: its header does not start with '{' (first bytes ${hex(head)}, header length field ${headerLen})`,
      { path },
    );
  }
  if (headerLen > BigInt(MAX_SAFETENSORS_HEADER)) {
    throw formatError(
      `${path}: the safetensors header length field says ${headerLen} bytes: header too large (limit 100 MB, as in the reference implementation); the length field is corrupt or the file is not safetensors`,
      { path, size: fileSize, headerLen: Number(headerLen) },
    );
  }
  const n = Number(headerLen);
  if (n > fileSize - 8) {
    throw formatError(
      `${path}: the safetensors header claims ${n} bytes but only ${fileSize - 8} follow the length field: the file is truncated; re-copy or re-export it`,
      { path, size: fileSize, headerLen: n },
    );
  }
  if (n < 2) {
    throw formatError(`${path}: the safetensors header length field says ${n} bytes, too short for a JSON object; the file is corrupt`, {
      path,
      headerLen: n,
    });
  }
  return n;
}

/** The header bytes as text: valid UTF-8, or a FORMAT_ERROR. */
export function decodeSafetensorsHeader(bytes: Uint8Array, path: string): string {
  try {
    return new TextDecoder('utf-8', { fatal: true, ignoreBOM: true }).decode(bytes);
  } catch {
    throw formatError(`${path}: the safetensors header is not valid UTF-8; the file is corrupt`, { path });
  }
}

/** A plain non-negative integer below 2^53 (as written, not after rounding), or undefined. */
function uint(v: JsonValue | undefined): number | undefined {
  if (!(v instanceof JsonNumber) || v.integer === undefined) return undefined;
  return v.integer >= 0n && v.integer <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(v.integer) : undefined;
}

function show(v: JsonValue | undefined): string {
  if (v === undefined) return 'nothing';
  if (v instanceof JsonNumber) return v.text;
  if (v instanceof Map) return `an object of ${v.size} keys`;
  if (Array.isArray(v)) return `[${v.slice(0, 8).map(show).join(', ')}${v.length > 8 ? ', ...' : ''}]`;
  const s = JSON.stringify(v);
  return s.length > 60 ? `${s.slice(0, 60)}...` : s;
}

const KNOWN_DTYPES = Object.keys(SAFETENSORS_DTYPE_BITS).join(', ');

/**
 * Validates a header against the data section's size and returns tensors in data order.
 * Every check the specification makes: known dtypes, integer shapes and offsets, byte
 * length = numel · element bits / 8, tensors contiguous from 0 to the end of the data.
 */
export function parseSafetensorsHeader(
  json: string,
  dataStart: number,
  dataSize: number,
  path: string,
): { tensors: TensorInfo[]; metadata: Record<string, string> } {
  let parsed: JsonValue;
  try {
    parsed = parseStrictJson(json);
  } catch (e) {
    const why = e instanceof JsonSyntaxError ? e.message : String(e);
    const dup = /duplicate key (.*) at/.exec(why);
    throw formatError(
      dup !== null
        ? `${path}: the safetensors header has a duplicate key '${JSON.parse(dup[1])}' (${why}); the format forbids duplicate keys, and readers disagree on which copy wins: re-export the file`
        : `${path}: the ${json.length}-character safetensors header is not valid JSON (${why}); the file is corrupt or not safetensors`,
      { path },
    );
  }
  if (!isJsonObject(parsed)) {
    throw formatError(`${path}: the safetensors header must be a JSON object of tensors; the file is corrupt`, { path });
  }
  const metadata: Record<string, string> = Object.create(null);
  const tensors: (TensorInfo & { begin: number; end: number })[] = [];
  for (const [name, entry] of parsed) {
    if (name === '__metadata__') {
      if (entry === null) continue;
      if (!isJsonObject(entry)) throw formatError(`${path}: __metadata__ must be an object of strings; got ${show(entry)}`, { path });
      for (const [k, v] of entry) {
        if (typeof v !== 'string') {
          throw formatError(`${path}: __metadata__['${k}'] is ${show(v)}, not a string (the format allows only string values)`, { path });
        }
        metadata[k] = v;
      }
      continue;
    }
    const bad = (what: string) => formatError(`${path}: tensor '${name}' has ${what} in the header; the file is corrupt`, { path, name });
    if (!isJsonObject(entry)) throw bad(`no {dtype, shape, data_offsets} entry (got ${show(entry)})`);
    const dtypeV = entry.get('dtype');
    if (typeof dtypeV !== 'string') throw bad(dtypeV === undefined ? 'no dtype' : `a dtype of ${show(dtypeV)} (no dtype string)`);
    if (!has(SAFETENSORS_DTYPE_BITS, dtypeV)) {
      throw formatError(
        `${path}: tensor '${name}' has unknown dtype ${JSON.stringify(dtypeV).replace(/^"|"$/g, "'")}; safetensors dtypes are ${KNOWN_DTYPES}: the file is corrupt or from an unknown writer`,
        { path, name, dtype: dtypeV },
      );
    }
    const shapeV = entry.get('shape');
    const shape = Array.isArray(shapeV) ? shapeV.map(uint) : undefined;
    if (shape === undefined || shape.some((s) => s === undefined)) {
      throw bad(`an invalid shape ${show(shapeV)} (need a list of non-negative integers)`);
    }
    const offV = entry.get('data_offsets');
    const off = Array.isArray(offV) && offV.length === 2 ? offV.map(uint) : undefined;
    if (off === undefined || off[0] === undefined || off[1] === undefined || off[1] < off[0]) {
      throw bad(`invalid data_offsets ${show(offV)} (need [begin, end] with integers 0 <= begin <= end)`);
    }
    const [begin, end] = off as [number, number];
    const dims = shape as number[];
    const bits = dims.reduce((a, s) => a * BigInt(s), 1n) * BigInt(SAFETENSORS_DTYPE_BITS[dtypeV]);
    if (bits % 8n !== 0n) {
      throw formatError(
        `${path}: tensor '${name}' is ${dtypeV} [${dims.join(', ')}], ${bits} bits: not a whole number of bytes; the header is corrupt`,
        { path, name },
      );
    }
    if (bits / 8n !== BigInt(end - begin)) {
      throw formatError(
        `${path}: tensor '${name}' is ${dtypeV} [${dims.join(', ')}] = ${bits / 8n} bytes but its data_offsets [${begin}, ${end}) span ${end - begin}; the header is corrupt`,
        { path, name },
      );
    }
    if (end > dataSize) {
      throw formatError(
        `${path}: tensor '${name}' needs data bytes [${begin}, ${end}) but the file holds only ${dataSize} bytes after its header (file size ${dataStart + dataSize}): the file is truncated or its offsets are out of range; re-copy or re-export it`,
        { path, name, end, dataSize },
      );
    }
    tensors.push({
      name,
      fileDtype: dtypeV,
      dtype: TO_DTYPE.get(dtypeV),
      shape: dims,
      byteOffset: dataStart + begin,
      byteLength: end - begin,
      begin,
      end,
    });
  }
  tensors.sort((a, b) => a.begin - b.begin || a.end - b.end);
  let cursor = 0;
  let prev: (typeof tensors)[number] | undefined;
  for (const t of tensors) {
    if (t.begin < cursor) {
      throw formatError(
        `${path}: tensors '${prev?.name}' [${prev?.begin}, ${prev?.end}) and '${t.name}' [${t.begin}, ${t.end}) overlap in the data section; the header is corrupt`,
        { path, names: [prev?.name, t.name] },
      );
    }
    if (t.begin > cursor) {
      throw formatError(
        `${path}: data bytes [${cursor}, ${t.begin}) belong to no tensor (${prev === undefined ? 'before the first tensor' : `between '${prev.name}' and '${t.name}'`}); the format requires tensors to cover the data section with no holes: the header is corrupt`,
        { path, gap: [cursor, t.begin] },
      );
    }
    cursor = t.end;
    if (t.end > t.begin) prev = t;
  }
  if (cursor !== dataSize) {
    throw formatError(
      `${path}: the file has ${dataSize - cursor} bytes after the last tensor that no tensor covers (data section ${dataSize} bytes, tensors end at ${cursor}); the format forbids trailing bytes: the file is corrupt or was appended to`,
      { path, trailing: dataSize - cursor },
    );
  }
  return { tensors: tensors.map(({ begin: _b, end: _e, ...info }) => info), metadata: { ...metadata } };
}

/** Parses a whole safetensors file held in memory (the same checks as `openSafetensors`). */
export function parseSafetensorsBuffer(
  bytes: Uint8Array,
  path = '<buffer>',
): { tensors: TensorInfo[]; metadata: Record<string, string>; dataStart: number } {
  const n = safetensorsHeaderLength(bytes.subarray(0, 16), bytes.length, path);
  const json = decodeSafetensorsHeader(bytes.subarray(8, 8 + n), path);
  return { ...parseSafetensorsHeader(json, 8 + n, bytes.length - 8 - n, path), dataStart: 8 + n };
}

/** Reads and checks the header of an open file; the caller owns the handle. */
export async function openSafetensorsHandle(handle: FileHandle, size: number, path: string): Promise<TensorFile> {
  const head = new Uint8Array(Math.min(size, 16));
  await readExactly(handle, head, 0, path);
  const n = safetensorsHeaderLength(head, size, path);
  const headerBytes = new Uint8Array(n);
  await readExactly(handle, headerBytes, 8, path);
  const json = decodeSafetensorsHeader(headerBytes, path);
  const { tensors, metadata } = parseSafetensorsHeader(json, 8 + n, size - 8 - n, path);
  return new OpenTensorFile(handle, path, 'safetensors', size, tensors, metadata);
}

/** Opens a safetensors file and reads only its header. Close it (or `await using`) when done. */
export async function openSafetensors(path: string): Promise<TensorFile> {
  assertLittleEndianHost();
  const { handle, size } = await openForRead(path);
  try {
    return await openSafetensorsHandle(handle, size, path);
  } catch (e) {
    await handle.close().catch(() => undefined);
    throw e;
  }
}
