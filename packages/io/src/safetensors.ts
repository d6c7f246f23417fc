/**
 * safetensors reader. The format is an 8-byte little-endian header length N, N bytes of
 * JSON ({name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}}), then
 * the data section; offsets are relative to the data section's start.
 *
 * Hand-written rather than taken from npm: the packages there either parse a whole
 * in-memory buffer or fetch over HTTP with a browser cache, and none reads the header
 * alone and then tensor byte ranges at offsets from a file handle, which is what
 * streaming a 6 GB file needs. The header is a length and JSON, so the parser is short.
 */
import { type DType, numel } from '@crisp/core';
import { assertLittleEndianHost, formatError, openForRead, readExactly } from './file-handle.js';
import { OpenTensorFile, type TensorFile, type TensorInfo } from './tensor-file.js';

/** The reference implementation refuses headers above 100 MB; so do we (a corrupt length field). */
export const MAX_SAFETENSORS_HEADER = 100_000_000;

/** Bytes per element for every safetensors dtype whose size is whole bytes. */
export const SAFETENSORS_DTYPE_BYTES: Readonly<Record<string, number>> = {
  F64: 8,
  F32: 4,
  F16: 2,
  BF16: 2,
  I64: 8,
  U64: 8,
  I32: 4,
  U32: 4,
  I16: 2,
  U16: 2,
  I8: 1,
  U8: 1,
  BOOL: 1,
  F8_E4M3: 1,
  F8_E5M2: 1,
  F8_E8M0: 1,
  C64: 8,
};

const TO_DTYPE: Readonly<Record<string, DType>> = { F32: 'f32', F16: 'f16', BF16: 'bf16' };
export const DTYPE_TO_SAFETENSORS: Readonly<Record<DType, string>> = { f32: 'F32', f16: 'F16', bf16: 'BF16' };

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
  return undefined;
}

function hex(bytes: Uint8Array): string {
  return Array.from(bytes, (b) => b.toString(16).padStart(2, '0')).join(' ');
}

/**
 * Validates a parsed header against the data section's size and returns tensors in
 * data order. Checks: dtype/shape/offset types, byte length = numel · element size,
 * ranges inside the data section (else truncated), no two tensors sharing bytes.
 */
export function parseSafetensorsHeader(
  json: string,
  dataStart: number,
  dataSize: number,
  path: string,
): { tensors: TensorInfo[]; metadata: Record<string, string> } {
  let parsed: unknown;
  try {
    parsed = JSON.parse(json);
  } catch (e) {
    throw formatError(
      `${path}: the ${json.length}-byte safetensors header is not valid JSON (${(e as Error).message}); the file is corrupt or not safetensors`,
      { path },
    );
  }
  if (parsed === null || typeof parsed !== 'object' || Array.isArray(parsed)) {
    throw formatError(`${path}: the safetensors header must be a JSON object of tensors; the file is corrupt`, { path });
  }
  const metadata: Record<string, string> = {};
  const tensors: (TensorInfo & { begin: number; end: number })[] = [];
  for (const [name, entry] of Object.entries(parsed as Record<string, unknown>)) {
    if (name === '__metadata__') {
      if (entry === null || typeof entry !== 'object' || Array.isArray(entry)) {
        throw formatError(`${path}: __metadata__ must be an object of strings`, { path });
      }
      for (const [k, v] of Object.entries(entry as Record<string, unknown>)) {
        if (typeof v !== 'string') throw formatError(`${path}: __metadata__['${k}'] is not a string`, { path });
        metadata[k] = v;
      }
      continue;
    }
    const e = entry as { dtype?: unknown; shape?: unknown; data_offsets?: unknown } | null;
    const bad = (what: string) =>
      formatError(`${path}: tensor '${name}' has ${what} in the header; the file is corrupt`, { path, name });
    if (e === null || typeof e !== 'object' || Array.isArray(e)) throw bad('no {dtype, shape, data_offsets} entry');
    if (typeof e.dtype !== 'string') throw bad('no dtype string');
    if (!Array.isArray(e.shape) || e.shape.some((s) => !Number.isSafeInteger(s) || s < 0)) {
      throw bad(`an invalid shape ${JSON.stringify(e.shape)}`);
    }
    const off = e.data_offsets;
    if (
      !Array.isArray(off) ||
      off.length !== 2 ||
      !Number.isSafeInteger(off[0]) ||
      !Number.isSafeInteger(off[1]) ||
      off[0] < 0 ||
      off[1] < off[0]
    ) {
      throw bad(`invalid data_offsets ${JSON.stringify(off)} (need [begin, end] with 0 <= begin <= end)`);
    }
    const [begin, end] = off as [number, number];
    const shape = e.shape as number[];
    const size = SAFETENSORS_DTYPE_BYTES[e.dtype];
    // Sub-byte or unknown dtypes: their size cannot be checked, only their range.
    if (size !== undefined && numel(shape) * size !== end - begin) {
      throw formatError(
        `${path}: tensor '${name}' is ${e.dtype} [${shape.join(', ')}] = ${numel(shape) * size} bytes but its data_offsets [${begin}, ${end}) span ${end - begin}; the header is corrupt`,
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
      fileDtype: e.dtype,
      dtype: TO_DTYPE[e.dtype],
      shape: [...shape],
      byteOffset: dataStart + begin,
      byteLength: end - begin,
      begin,
      end,
    });
  }
  tensors.sort((a, b) => a.begin - b.begin || a.end - b.end);
  let prev: (typeof tensors)[number] | undefined;
  for (const t of tensors) {
    if (t.begin === t.end) continue; // empty tensors own no bytes
    if (prev !== undefined && t.begin < prev.end) {
      throw formatError(
        `${path}: tensors '${prev.name}' [${prev.begin}, ${prev.end}) and '${t.name}' [${t.begin}, ${t.end}) overlap in the data section; the header is corrupt`,
        { path, names: [prev.name, t.name] },
      );
    }
    prev = t;
  }
  return { tensors: tensors.map(({ begin: _b, end: _e, ...info }) => info), metadata };
}

/** Opens a safetensors file and reads only its header. Close it (or `await using`) when done. */
export async function openSafetensors(path: string): Promise<TensorFile> {
  assertLittleEndianHost();
  const { handle, size } = await openForRead(path);
  try {
    if (size < 8) {
      throw formatError(
        `${path} is ${size} bytes: too short for a safetensors file (8-byte header length, then a JSON header); it is truncated or not safetensors`,
        { path, size },
      );
    }
    const head = new Uint8Array(Math.min(size, 16));
    await readExactly(handle, head, 0, path);
    const headerLen = new DataView(head.buffer).getBigUint64(0, true);
    const foreign = sniffForeign(head);
    const looksJson = head.length > 8 && head[8] === 0x7b; // '{'
    if (foreign !== undefined && !looksJson) {
      throw formatError(`${path} is not a safetensors file: it looks like ${foreign}`, { path });
    }
    if (headerLen > BigInt(size - 8) || headerLen > BigInt(MAX_SAFETENSORS_HEADER)) {
      throw formatError(
        looksJson
          ? `${path}: the safetensors header claims ${headerLen} bytes but only ${size - 8} follow the length field: the file is truncated; re-copy or re-export it`
          : `${path} is not a safetensors file (its first 8 bytes ${hex(head.subarray(0, 8))} give a header length of ${headerLen} for a ${size}-byte file)`,
        { path, size, headerLen: Number(headerLen) },
      );
    }
    const n = Number(headerLen);
    if (!looksJson || n < 2) {
      throw formatError(
        `${path} is not a safetensors file: its header does not start with '{' (first bytes ${hex(head)})`,
        { path },
      );
    }
    const headerBytes = new Uint8Array(n);
    await readExactly(handle, headerBytes, 8, path);
    let json: string;
    try {
      json = new TextDecoder('utf-8', { fatal: true }).decode(headerBytes);
    } catch {
      throw formatError(`${path}: the safetensors header is not valid UTF-8; the file is corrupt`, { path });
    }
    const { tensors, metadata } = parseSafetensorsHeader(json, 8 + n, size - 8 - n, path);
    return new OpenTensorFile(handle, path, 'safetensors', size, tensors, metadata);
  } catch (e) {
    await handle.close().catch(() => undefined);
    throw e;
  }
}
