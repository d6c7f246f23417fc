// Corrupted and foreign files, generated here from valid ones: each must give a typed
// CrispError with the right code and a message naming the problem and what to do.
import { readFile, readdir, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { type CrispErrorCode, type HostTensor, isCrispError } from '@crisp/core';
import { describe, expect, it } from 'vitest';
import { SEED, randomTensor, reportSeedOnFailure, rng, tempDir } from '../test/helpers.js';
import {
  encodeNpyHeader,
  openNpy,
  openSafetensors,
  openTensorFile,
  readQkv,
  readTensor,
  streamTensor,
  writeNpy,
  writeSafetensors,
} from './index.js';

reportSeedOnFailure('errors');
const dir = await tempDir('errors');
const rand = rng(SEED);
let counter = 0;

async function caught(p: Promise<unknown> | (() => unknown)): Promise<unknown> {
  try {
    await (typeof p === 'function' ? p() : p);
  } catch (e) {
    return e;
  }
  return undefined;
}

async function expectError(p: Promise<unknown> | (() => unknown), code: CrispErrorCode, message: RegExp): Promise<void> {
  const e = await caught(p);
  expect(isCrispError(e, code), `expected ${code}, got ${String(e)} (seed ${SEED})`).toBe(true);
  expect((e as Error).message).toMatch(message);
}

async function put(bytes: Uint8Array | string, ext = 'safetensors'): Promise<string> {
  const path = join(dir, `f${counter++}.${ext}`);
  await writeFile(path, bytes);
  return path;
}

const q = randomTensor('bf16', [9, 4, 8], rand);
const k = randomTensor('bf16', [9, 2, 8], rand);
const v = randomTensor('bf16', [9, 2, 8], rand);
const validPath = join(dir, 'valid.safetensors');
await writeSafetensors(validPath, { q, k, v });
const valid = new Uint8Array(await readFile(validPath));
const headerLen = Number(Buffer.from(valid).readBigUInt64LE(0));
const validHeader = JSON.parse(Buffer.from(valid.subarray(8, 8 + headerLen)).toString('utf8'));
const validData = valid.subarray(8 + headerLen);

/** A safetensors file with a rewritten header (its length field recomputed) over `data`. */
function craft(header: unknown, data: Uint8Array = validData): Uint8Array {
  const json = Buffer.from(typeof header === 'string' ? header : JSON.stringify(header), 'utf8');
  const out = new Uint8Array(8 + json.length + data.length);
  Buffer.from(out.buffer).writeBigUInt64LE(BigInt(json.length), 0);
  out.set(json, 8);
  out.set(data, 8 + json.length);
  return out;
}
type HeaderEntry = { dtype?: string; shape: number[]; data_offsets: number[] };
const edited = (f: (h: Record<string, HeaderEntry> & { __metadata__?: unknown }) => void) => {
  const h = structuredClone(validHeader);
  f(h);
  return craft(h);
};

describe('safetensors: truncated and corrupt files', () => {
  it('the valid file opens (the corruptions below start from it)', async () => {
    await using f = await openSafetensors(validPath);
    expect(f.tensors.map((t) => t.name)).toEqual(['q', 'k', 'v']);
  });
  it('empty and tiny files', async () => {
    await expectError(openSafetensors(await put(new Uint8Array(0))), 'FORMAT_ERROR', /0 bytes: too short.*truncated/);
    await expectError(openSafetensors(await put(valid.subarray(0, 5))), 'FORMAT_ERROR', /too short/);
  });
  it('truncated inside the data section names the tensor that is cut', async () => {
    const cut = 1 + Math.floor(rand() * (v.data.length * 2 - 1));
    await expectError(openSafetensors(await put(valid.subarray(0, valid.length - cut))), 'FORMAT_ERROR', /tensor 'v'.*truncated/);
  });
  it('truncated inside the header', async () => {
    const at = 9 + Math.floor(rand() * (headerLen - 2));
    await expectError(openSafetensors(await put(valid.subarray(0, at))), 'FORMAT_ERROR', /header claims \d+ bytes.*truncated/);
  });
  it('header length beyond any sane size or the file', async () => {
    const bytes = valid.slice();
    Buffer.from(bytes.buffer).writeBigUInt64LE(2n ** 60n, 0);
    await expectError(openSafetensors(await put(bytes)), 'FORMAT_ERROR', /header too large \(limit 100 MB/);
    Buffer.from(bytes.buffer).writeBigUInt64LE(BigInt(valid.length), 0);
    await expectError(openSafetensors(await put(bytes)), 'FORMAT_ERROR', /header claims \d+ bytes.*truncated/);
  });
  it('invalid JSON, a non-object header, invalid UTF-8', async () => {
    // Any structural JSON character replaced by '#' breaks the JSON; pick one at random.
    const structural: number[] = [];
    for (let i = 9; i < 8 + headerLen; i++) if ('{}[]:,"'.includes(String.fromCharCode(valid[i]))) structural.push(i);
    const broken = valid.slice();
    broken[structural[Math.floor(rand() * structural.length)]] = 0x23;
    await expectError(openSafetensors(await put(broken)), 'FORMAT_ERROR', /not valid JSON/);
    await expectError(
      openSafetensors(await put(craft('{"q": {"dtype": "BF16", "shape": [9, 4, 8], "data_offsets": [0, 576]'))),
      'FORMAT_ERROR',
      /not valid JSON/,
    );
    await expectError(openSafetensors(await put(craft([1, 2]))), 'FORMAT_ERROR', /not a safetensors file/);
    await expectError(openSafetensors(await put(craft({ q: [1, 2] }))), 'FORMAT_ERROR', /'q' has no \{dtype, shape, data_offsets\}/);
    const bad = craft(JSON.stringify(validHeader));
    bad[9] = 0xff;
    await expectError(openSafetensors(await put(bad)), 'FORMAT_ERROR', /UTF-8|JSON/);
  });
  it('offsets out of range, overlapping, inconsistent with the shape, malformed', async () => {
    await expectError(
      openSafetensors(await put(edited((h) => (h.v.data_offsets = [h.v.data_offsets[0], h.v.data_offsets[1] + 2])))),
      'FORMAT_ERROR',
      /'v' is BF16 \[9, 2, 8\] = 288 bytes but its data_offsets/,
    );
    await expectError(
      openSafetensors(
        await put(
          edited((h) => {
            h.v.data_offsets = [h.v.data_offsets[0] + 64, h.v.data_offsets[1] + 64];
          }),
        ),
      ),
      'FORMAT_ERROR',
      /'v' needs data bytes .* out of range/,
    );
    await expectError(
      openSafetensors(await put(edited((h) => (h.k.data_offsets = [h.k.data_offsets[0] - 2, h.k.data_offsets[1] - 2])))),
      'FORMAT_ERROR',
      /'q' .* and 'k' .* overlap/,
    );
    await expectError(openSafetensors(await put(edited((h) => (h.q.data_offsets = [10, 5])))), 'FORMAT_ERROR', /invalid data_offsets/);
    await expectError(openSafetensors(await put(edited((h) => (h.q.shape = [9, -4, 8])))), 'FORMAT_ERROR', /invalid shape/);
    await expectError(openSafetensors(await put(edited((h) => delete h.q.dtype))), 'FORMAT_ERROR', /no dtype/);
    await expectError(openSafetensors(await put(edited((h) => (h.__metadata__ = { a: 1 })))), 'FORMAT_ERROR', /__metadata__\['a'\]/);
  });
  it('unsupported dtypes open (the header is fine) but are refused by name when read', async () => {
    for (const [dtype, size] of [['F64', 8], ['I8', 1], ['I32', 4]] as const) {
      const data = new Uint8Array(6 * 4 * size).map(() => Math.floor(rand() * 256));
      const path = await put(craft({ x: { dtype, shape: [6, 1, 4], data_offsets: [0, data.length] } }, data));
      await using f = await openSafetensors(path);
      expect(f.tensor('x').dtype).toBeUndefined();
      await expectError(() => streamTensor(f, 'x', { layout: 'nhd' }), 'UNSUPPORTED', new RegExp(`'x' is ${dtype}.*F32, F16 or BF16`));
    }
  });
  it('files that are not safetensors or npy at all', async () => {
    const png = Uint8Array.of(0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0, 0, 0, 13, 73, 72, 68, 82, 1, 2, 3);
    const zip = Uint8Array.of(0x50, 0x4b, 3, 4, 20, 0, 0, 0, 8, 0, 1, 2, 3, 4, 5, 6, 7, 8);
    const text = 'hello, this is a text file and not a tensor file at all\n';
    await expectError(openTensorFile(await put(png, 'bin')), 'FORMAT_ERROR', /neither a safetensors .* nor an \.npy.*PNG/);
    await expectError(openTensorFile(await put(zip, 'pt')), 'FORMAT_ERROR', /zip archive .*safetensors\.torch\.save_file/);
    await expectError(openTensorFile(await put(text, 'txt')), 'FORMAT_ERROR', /neither a safetensors/);
    await expectError(openSafetensors(await put(text, 'txt')), 'FORMAT_ERROR', /not a safetensors file/);
    await expectError(openSafetensors(await put(zip, 'pt')), 'FORMAT_ERROR', /not a safetensors file: it looks like a zip/);
    await expectError(openNpy(validPath), 'FORMAT_ERROR', /not an \.npy file/);
  });
  it('missing files, directories and missing tensor names', async () => {
    await expectError(openTensorFile(join(dir, 'nope.safetensors')), 'IO_ERROR', /no such file/);
    await expectError(openSafetensors(dir), 'IO_ERROR', /not a regular file|directory/);
    await using f = await openSafetensors(validPath);
    await expectError(() => f.tensor('query'), 'FORMAT_ERROR', /no tensor named 'query'; it has 'q', 'k', 'v'/);
    await f.close();
    await expectError(f.read(new Uint8Array(4), 0), 'DISPOSED', /closed/);
  });
});

describe('layouts: wrong rank and layout mismatches', () => {
  it('rank and batch errors say which layout to pass', async () => {
    const x = randomTensor('f16', [1, 9, 4, 8], rand);
    const y = randomTensor('f16', [2, 9, 4, 8], rand);
    const path = join(dir, 'ranks.safetensors');
    await writeSafetensors(path, { x, y, q });
    await using f = await openSafetensors(path);
    await expectError(() => streamTensor(f, 'x', { layout: 'nhd' }), 'SHAPE_MISMATCH', /rank 4.*pass layout '1nhd'/);
    await expectError(() => streamTensor(f, 'y', { layout: '1nhd' }), 'SHAPE_MISMATCH', /leading dim of 1.*batch.*is 2/);
    await expectError(() => streamTensor(f, 'q', { layout: '1nhd' }), 'SHAPE_MISMATCH', /rank 3.*pass layout 'nhd'.*'hnd'/);
    await expectError(() => streamTensor(f, 'q', { layout: 'nhd', rows: [3, 99] }), 'INVALID_ARGUMENT', /rows/);
    await expectError(() => streamTensor(f, 'q', { layout: 'nhd', chunkRows: 0 }), 'INVALID_ARGUMENT', /chunkRows/);
    await expectError(() => streamTensor(f, 'q', { layout: 'nhw' }), 'INVALID_ARGUMENT', /layout must be one of/);
    await expectError(readTensor(f, 'q', { layout: 'nhd', maxBytes: 100 }), 'LIMIT_EXCEEDED', /streamTensor\/uploadTensor/);
  });
  it('a GQA file stored [H, n, d] but read as [n, H, d] is caught with a hint', async () => {
    const path = join(dir, 'gqa-hnd.safetensors');
    await writeSafetensors(path, { q, k, v }, { layout: 'hnd' });
    await expectError(readQkv(path, { layout: 'nhd' }), 'SHAPE_MISMATCH', /q has 4 tokens but k has only 2.*pass layout 'hnd'/);
    const ok = await readQkv(path, { layout: 'hnd' });
    expect(ok.q.shape).toEqual([9, 4, 8]);
  });
  it('Fortran-order .npy is refused with how to fix it', async () => {
    const header = encodeNpyHeader('<f4', [3, 2, 2]);
    const text = Buffer.from(header).toString('latin1').replace("'fortran_order': False", "'fortran_order': True ");
    const data = new Float32Array(12).map(() => rand() + 0.5);
    const path = await put(Buffer.concat([Buffer.from(text, 'latin1'), Buffer.from(data.buffer)]), 'npy');
    await expectError(openNpy(path), 'UNSUPPORTED', /Fortran.*np\.ascontiguousarray/);
  });
});

describe('npy: corrupt headers', () => {
  const data = new Float32Array(12).map(() => rand() + 0.5);
  const good = Buffer.concat([Buffer.from(encodeNpyHeader('<f4', [3, 2, 2])), Buffer.from(data.buffer)]);
  it('truncated data, truncated header, bad literal, bad version, missing keys, other descrs', async () => {
    await expectError(openNpy(await put(good.subarray(0, good.length - 3), 'npy')), 'FORMAT_ERROR', /only 45 follow the header: the file is truncated/);
    await expectError(openNpy(await put(good.subarray(0, 40), 'npy')), 'FORMAT_ERROR', /header claims .* truncated/);
    await expectError(openNpy(await put(good.subarray(0, 7), 'npy')), 'FORMAT_ERROR', /too short/);
    const swap = (from: string, to: string) => put(Buffer.from(good.toString('latin1').replace(from, to), 'latin1'), 'npy');
    await expectError(openNpy(await swap("'shape': (3, 2, 2)", "'shape': [3, 2, 2")), 'FORMAT_ERROR', /not a valid Python literal/);
    await expectError(openNpy(await swap("'descr'", "'dtype'")), 'FORMAT_ERROR', /lacks 'descr'/);
    await expectError(openNpy(await swap("'<f4'", "'<c8'")), 'UNSUPPORTED', /complex64/);
    await expectError(openNpy(await swap("'<f4'", "'>f4'")), 'UNSUPPORTED', /big-endian/);
    const v9 = Buffer.from(good);
    v9[6] = 9;
    await expectError(openNpy(await put(v9, 'npy')), 'UNSUPPORTED', /version 9/);
  });
  it('readQkv on a lone .npy explains what to give instead', async () => {
    await expectError(readQkv(await put(good, 'npy'), { layout: 'nhd' }), 'INVALID_ARGUMENT', /single \.npy.*directory/);
  });
});

describe('writers refuse bad sources and leave no file behind', () => {
  const t: HostTensor = randomTensor('f32', [5, 2, 3], rand);
  it('too few / too many / misaligned chunks, wrong array type, missing directory', async () => {
    const target = join(dir, 'never.safetensors');
    const few = { dtype: 'f32' as const, shape: [5, 2, 3], chunks: () => [t.data.subarray(0, 12) as Float32Array] };
    await expectError(writeSafetensors(target, { q: few }), 'SHAPE_MISMATCH', /holds 30 values but its chunks yielded 12/);
    const many = { dtype: 'f32' as const, shape: [5, 2, 3], chunks: () => [t.data, t.data] as Float32Array[] };
    await expectError(writeNpy(target, many), 'SHAPE_MISMATCH', /yield more/);
    const odd = { dtype: 'f32' as const, shape: [5, 2, 3], chunks: () => [t.data.subarray(0, 7), t.data.subarray(7)] as Float32Array[] };
    await expectError(writeNpy(target, odd, { layout: 'hnd' }), 'SHAPE_MISMATCH', /not whole rows/);
    const wrong = { dtype: 'bf16' as const, shape: [5, 2, 3], chunks: () => [t.data] as never };
    await expectError(writeNpy(target, wrong), 'DTYPE_MISMATCH', /chunk is a Float32Array/);
    await expectError(writeSafetensors(target, { q: { dtype: 'f32', shape: [5, 2], data: t.data } }), 'SHAPE_MISMATCH', /30 values/);
    await expectError(writeNpy(target, randomTensor('f16', [2, 2], rand), { layout: 'nhd' }), 'SHAPE_MISMATCH', /canonical \[n, H, d\] \(rank 3\)/);
    await expectError(writeNpy(join(dir, 'no', 'such', 'dir.npy'), t), 'IO_ERROR', /no such file or directory/);
    expect((await readdir(dir)).filter((f) => f.includes('.partial') || f.startsWith('never'))).toEqual([]);
  });
  it('a failed rewrite keeps the previous file intact', async () => {
    const target = join(dir, 'keep.npy');
    await writeNpy(target, t);
    const before = await readFile(target);
    const few = { dtype: 'f32' as const, shape: [5, 2, 3], chunks: () => [t.data.subarray(0, 6) as Float32Array] };
    await expectError(writeNpy(target, few), 'SHAPE_MISMATCH', /yielded 6/);
    expect(Buffer.compare(before, await readFile(target))).toBe(0);
  });
});

