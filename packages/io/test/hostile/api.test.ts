// The public API under careless or hostile arguments: every wrong option is a typed error
// naming it, and limits are enforced from the header alone, before any data is read.
import { open as openFile } from 'node:fs/promises';
import { join } from 'node:path';
import { type DType, DeviceTensorBase } from '@crisp/core';
import { describe, expect, it } from 'vitest';
import {
  openNpy,
  openSafetensors,
  openTensorFile,
  readQkv,
  readTensor,
  resolveQkvNames,
  streamTensor,
  tensorSource,
  uploadTensor,
  writeNpy,
  writeSafetensors,
} from '../../src/index.js';
import { randomTensor, rng, tempDir } from '../helpers.js';
import { safetensorsOf } from './corpus.js';
import { expectCode } from './util.js';

const dir = await tempDir('api');
const rand = rng(5);
const q = randomTensor('bf16', [16, 4, 8], rand);
const k = randomTensor('bf16', [16, 2, 8], rand);
const path = join(dir, 'qkv.safetensors');
await writeSafetensors(path, { q, k, v: k });

/** A safetensors file announcing q/k/v of n = 4M tokens (12 GB of bf16 data, sparse on disk). */
async function hugeFile(): Promise<string> {
  const n = 4 * 1024 * 1024;
  const [H, d] = [8, 64];
  const bytes = n * H * d * 2;
  const kb = n * 2 * d * 2;
  const header = {
    q: { dtype: 'BF16', shape: [n, H, d], data_offsets: [0, bytes] },
    k: { dtype: 'BF16', shape: [n, 2, d], data_offsets: [bytes, bytes + kb] },
    v: { dtype: 'BF16', shape: [n, 2, d], data_offsets: [bytes + kb, bytes + 2 * kb] },
  };
  const head = safetensorsOf(header);
  const p = join(dir, 'huge.safetensors');
  const fh = await openFile(p, 'w');
  await fh.write(head, 0, head.length, 0);
  await fh.truncate(head.length + bytes + 2 * kb);
  await fh.close();
  return p;
}

class SpyTensor extends DeviceTensorBase {
  readonly backend = 'spy';
  protected release(): void {}
}

describe('limits come from the header, before any read or allocation', () => {
  it('a header announcing n = 4M: LIMIT_EXCEEDED from maxSequence and from maxBytes, at once', async () => {
    const p = await hugeFile();
    const t0 = performance.now();
    await expectCode(readQkv(p, { layout: 'nhd', maxSequence: 65536 }), 'LIMIT_EXCEEDED', /n = 4194304 tokens, above the limit of 65536/);
    await expectCode(readQkv(p, { layout: 'nhd' }), 'LIMIT_EXCEEDED', /above maxBytes 1073741824; stream it/);
    let allocations = 0;
    const backend = {
      allocate: (dtype: DType, shape: readonly number[]) => {
        allocations++;
        return new SpyTensor(dtype, shape);
      },
      write: () => undefined,
    };
    await using f = await openTensorFile(p);
    await expectCode(uploadTensor(backend, f, 'k', { layout: 'nhd', maxSequence: 65536 }), 'LIMIT_EXCEEDED', /maxSequence|above the limit/);
    await expectCode(() => streamTensor(f, 'q', { layout: 'nhd', headDims: [128] }), 'UNSUPPORTED', /head dim d = 64; the backend takes only 128/);
    expect(allocations).toBe(0);
    expect(performance.now() - t0).toBeLessThan(5000);
  });

  it('chunks and rows beyond host memory are LIMIT_EXCEEDED, not a RangeError', async () => {
    const p = await hugeFile();
    await using f = await openSafetensors(p);
    await expectCode(() => streamTensor(f, 'q', { layout: 'nhd', chunkRows: 1e9 }), 'LIMIT_EXCEEDED', /chunkRows 1000000000 makes chunks/);
    // 2 TiB announced (sparse on disk): even with no maxBytes limit, never allocated.
    const tera = join(dir, 'tera.safetensors');
    const [n, H, dd] = [2 ** 20, 64, 2 ** 14];
    const teraHead = safetensorsOf({ x: { dtype: 'BF16', shape: [n, H, dd], data_offsets: [0, n * H * dd * 2] } });
    const th = await openFile(tera, 'w');
    await th.write(teraHead, 0, teraHead.length, 0);
    await th.truncate(teraHead.length + n * H * dd * 2);
    await th.close();
    await using tf = await openSafetensors(tera);
    await expectCode(readTensor(tf, 'x', { layout: 'nhd', maxBytes: Number.POSITIVE_INFINITY }), 'LIMIT_EXCEEDED', /more than this machine's/);
    const wide = join(dir, 'wide.safetensors');
    const d = 2 ** 29;
    const head = safetensorsOf({ x: { dtype: 'F32', shape: [1, 1, d], data_offsets: [0, d * 4] } });
    const fh = await openFile(wide, 'w');
    await fh.write(head, 0, head.length, 0);
    await fh.truncate(head.length + d * 4);
    await fh.close();
    await using g = await openSafetensors(wide);
    await expectCode(() => streamTensor(g, 'x', { layout: 'nhd' }), 'LIMIT_EXCEEDED', /rows .* above the 1073741824-byte chunk limit/);
  });
});

describe('readQkv arguments', () => {
  const cases: [string, unknown, RegExp][] = [
    ['no options', undefined, /needs options with a layout/],
    ['options null', null, /needs options with a layout/],
    ['options a string', 'nhd', /must be an object/],
    ['no layout', {}, /layout must be one of/],
    ['a wrong layout', { layout: 'nhw' }, /layout must be one of/],
    ['a misspelt key', { layout: 'nhd', name: { q: 'q' } }, /unknown option 'name'/],
    ['names not an object', { layout: 'nhd', names: 'q' }, /names must be an object/],
    ['an unknown role in names', { layout: 'nhd', names: { x: 'q' } }, /unknown key 'x'/],
    ['an empty name', { layout: 'nhd', names: { q: '' } }, /names\.q must be a non-empty/],
    ['uint16As f16', { layout: 'nhd', uint16As: 'f16' }, /uint16As must be 'bf16'/],
    ['maxBytes negative', { layout: 'nhd', maxBytes: -1 }, /maxBytes must be a non-negative/],
    ['maxBytes a string', { layout: 'nhd', maxBytes: '1e9' }, /maxBytes must be/],
    ['maxSequence 0', { layout: 'nhd', maxSequence: 0 }, /maxSequence must be a positive/],
    ['maxSequence NaN', { layout: 'nhd', maxSequence: Number.NaN }, /maxSequence must be a positive/],
    ['headDims empty', { layout: 'nhd', headDims: [] }, /headDims must be a non-empty array/],
  ];
  for (const [name, opts, message] of cases) {
    it(`${name}: INVALID_ARGUMENT`, async () => {
      await expectCode(readQkv(path, opts as never), 'INVALID_ARGUMENT', message);
    });
  }
  it('a bad dtype: DTYPE_MISMATCH', async () => {
    await expectCode(readQkv(path, { layout: 'nhd', dtype: 'f64' as never }), 'DTYPE_MISMATCH', /dtype must be one of/);
  });
  it('an [H, n, d] GQA file read as [n, H, d] gets the layout hint, not a vague failure', async () => {
    const p = join(dir, 'hnd.safetensors');
    await writeSafetensors(p, { q, k, v: k }, { layout: 'hnd' });
    await expectCode(readQkv(p, { layout: 'nhd' }), 'SHAPE_MISMATCH', /pass layout 'hnd'/);
  });
  it('an F64 or I32 k is named as such before anything is read', async () => {
    for (const [dtype, size] of [['F64', 8], ['I32', 4]] as const) {
      const p = join(dir, `k-${dtype}.safetensors`);
      const qb = 16 * 4 * 8 * 2;
      const kb = 16 * 2 * 8 * size;
      const header = {
        q: { dtype: 'BF16', shape: [16, 4, 8], data_offsets: [0, qb] },
        k: { dtype, shape: [16, 2, 8], data_offsets: [qb, qb + kb] },
        v: { dtype, shape: [16, 2, 8], data_offsets: [qb + kb, qb + 2 * kb] },
      };
      const fh = await openFile(p, 'w');
      const head = safetensorsOf(header);
      await fh.write(head, 0, head.length, 0);
      await fh.truncate(head.length + qb + 2 * kb);
      await fh.close();
      await expectCode(readQkv(p, { layout: 'nhd' }), 'UNSUPPORTED', new RegExp(`tensor 'k' is ${dtype}; CRISP reads F32, F16 or BF16.*convert`));
    }
  });
  it('two names equally good for a role are an error, never a silent pick', async () => {
    await expectCode(() => resolveQkvNames(['Query', 'QUERY', 'k', 'v'], 'f'), 'INVALID_ARGUMENT', /several tensors could be q \('Query', 'QUERY'\)/);
    expect(resolveQkvNames(['query', 'q', 'k', 'v'], 'f').q).toBe('q'); // the first alias wins, whatever the file order
    await expectCode(() => resolveQkvNames(null as never, 'f'), 'INVALID_ARGUMENT', /array of tensor names/);
  });
});

describe('stream, read, upload and open arguments', () => {
  it('options and files of the wrong kind', async () => {
    await using f = await openSafetensors(path);
    await expectCode(() => streamTensor(null as never, 'q', { layout: 'nhd' }), 'INVALID_ARGUMENT', /open TensorFile/);
    await expectCode(() => streamTensor(f, 'q', null as never), 'INVALID_ARGUMENT', /must be an object/);
    await expectCode(() => streamTensor(f, 'q', { layout: 'nhd', chunkrows: 4 } as never), 'INVALID_ARGUMENT', /unknown option 'chunkrows' \(did you mean 'chunkRows'\?\)/);
    await expectCode(() => streamTensor(f, 7 as never, { layout: 'nhd' }), 'INVALID_ARGUMENT', /name must be a string/);
    await expectCode(() => streamTensor(f, 'q', { layout: 'nhd', chunkRows: 1.5 }), 'INVALID_ARGUMENT', /chunkRows must be a positive integer/);
    await expectCode(() => streamTensor(f, 'q', { layout: 'nhd', rows: [4] as never }), 'INVALID_ARGUMENT', /rows must be/);
    await expectCode(() => streamTensor(f, 'q', { layout: 'nhd', rows: [5, 2] }), 'INVALID_ARGUMENT', /rows must be/);
    await expectCode(() => streamTensor(f, 'q', { layout: 'nhd', dtype: 'int8' as never }), 'DTYPE_MISMATCH', /dtype must be one of/);
    await expectCode(() => tensorSource(f, 'nope', { layout: 'nhd' }), 'FORMAT_ERROR', /no tensor named 'nope'/);
    await expectCode(readTensor(f, 'q', { layout: 'nhd', maxBytes: -5 }), 'INVALID_ARGUMENT', /maxBytes/);
    await expectCode(openNpy(path, { uint16as: 'bf16' } as never), 'INVALID_ARGUMENT', /unknown option 'uint16as' \(did you mean 'uint16As'\?\)/);
    await expectCode(openTensorFile(path, 'bf16' as never), 'INVALID_ARGUMENT', /must be an object/);
    await expectCode(f.read(new Uint8Array(4), -1), 'INVALID_ARGUMENT', /not inside/);
    await expectCode(f.read(new Uint8Array(4), f.fileSize - 2), 'INVALID_ARGUMENT', /not inside/);
    await expectCode(f.read([1, 2] as never, 0), 'INVALID_ARGUMENT', /Uint8Array/);
  });

  it('uploadTensor: a bad backend, a backend that throws (BACKEND_ERROR, tensor freed), a bad onProgress', async () => {
    await using f = await openSafetensors(path);
    await expectCode(uploadTensor(null as never, f, 'q', { layout: 'nhd' }), 'INVALID_ARGUMENT', /CRISP backend/);
    await expectCode(uploadTensor({ allocate: 1 } as never, f, 'q', { layout: 'nhd' }), 'INVALID_ARGUMENT', /CRISP backend/);
    let freed = 0;
    class Counted extends DeviceTensorBase {
      readonly backend = 'spy';
      protected release(): void {
        freed++;
      }
    }
    const throwing = {
      allocate: (dtype: DType, shape: readonly number[]) => new Counted(dtype, shape),
      write: () => {
        throw new TypeError('device write failed');
      },
    };
    await expectCode(uploadTensor(throwing, f, 'q', { layout: 'nhd' }), 'BACKEND_ERROR', /device write failed/);
    expect(freed).toBe(1);
    const noAlloc = {
      allocate: () => {
        throw new Error('no memory');
      },
      write: () => undefined,
    };
    await expectCode(uploadTensor(noAlloc, f, 'q', { layout: 'nhd' }), 'BACKEND_ERROR', /no memory/);
    await expectCode(uploadTensor(throwing, f, 'q', { layout: 'nhd', onProgress: 3 as never }), 'INVALID_ARGUMENT', /onProgress must be a function/);
  });

  it('close while reads are under way: they finish; reads after close are DISPOSED; close twice is fine', async () => {
    const big = randomTensor('f32', [4096, 4, 64], rand);
    const p = join(dir, 'close.npy');
    await writeNpy(p, big);
    const f = await openNpy(p);
    const reads = Array.from({ length: 8 }, (_, i) => {
      const target = new Uint8Array(256 * 1024);
      return f.read(target, 128 + i * 256 * 1024).then(() => target);
    });
    const closing = f.close();
    const done = await Promise.all(reads);
    await closing;
    await f.close();
    expect(Buffer.compare(done[0].subarray(0, 64), Buffer.from(big.data.buffer, 0, 64))).toBe(0);
    await expectCode(f.read(new Uint8Array(4), 128), 'DISPOSED', /was closed; open it again/);
    await expectCode(readTensor(f, undefined, { layout: 'nhd' }), 'DISPOSED', /was closed/);
  });
});
