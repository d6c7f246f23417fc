// Device tensors out to files: the bytes a file gets are the tensor's, read in bounded
// chunks; a failed read leaves no file and no temporary file; a backend without `read` is
// read through `download`.
import { readdir, readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import type { Backend, DeviceTensor, HostData } from '@crisp/core';
import { createReferenceBackend } from '@crisp/reference';
import { describe, expect, it } from 'vitest';
import { SEED, firstDiff, randomTensor, reportSeedOnFailure, rng, tempDir } from '../test/helpers.js';
import { deviceTensorSource, openTensorFile, readTensor, writeSafetensors, writeTensor } from './index.js';

reportSeedOnFailure('device-source');
const dir = await tempDir('device-source');
const rand = rng(SEED);

/** The reference backend, its reads counted and sized (and failing from read number `failAt` on). */
function spied(failAt = Number.POSITIVE_INFINITY) {
  const be = createReferenceBackend();
  const reads: { offset: number; count: number }[] = [];
  let downloads = 0;
  const backend: Pick<Backend, 'download' | 'read'> = {
    download: (t) => {
      downloads++;
      return be.download(t);
    },
    read: async (t, offset, count) => {
      reads.push({ offset, count });
      if (reads.length >= failAt) throw new Error('the device fell off the bus');
      return be.read!(t, offset, count);
    },
  };
  return { be, backend, reads, downloads: () => downloads };
}

const leftovers = async () => (await readdir(dir)).filter((f) => f.includes('.partial'));

describe('writeTensor and deviceTensorSource', () => {
  for (const dtype of ['f32', 'f16', 'bf16'] as const) {
    it(`writes a ${dtype} device tensor bit-exactly in chunks no larger than chunkBytes`, async () => {
      const { be, backend, reads, downloads } = spied();
      const host = randomTensor(dtype, [37, 3, 8], rand);
      const t = be.upload(host);
      const path = join(dir, `out-${dtype}.safetensors`);
      const chunkBytes = 5 * 3 * 8 * (dtype === 'f32' ? 4 : 2) + 3; // five rows and a bit
      const progress: number[] = [];
      await writeTensor(backend, t, path, { name: 'output', chunkBytes, onProgress: (done) => progress.push(done) });
      // whole rows, five at a time: the peak host buffer is the chunk, never the tensor
      expect(reads.map((r) => r.count)).toEqual([...Array(7).fill(120), 2 * 24]);
      expect(reads.map((r) => r.offset)).toEqual(reads.map((_, i) => i * 120));
      expect(Math.max(...reads.map((r) => r.count * (dtype === 'f32' ? 4 : 2)))).toBeLessThanOrEqual(chunkBytes);
      expect(downloads()).toBe(0);
      expect(progress.at(-1)).toBe(37 * 24);
      await using f = await openTensorFile(path);
      expect(f.tensors.map((x) => [x.name, x.shape])).toEqual([['output', [37, 3, 8]]]);
      const back = await readTensor(f, 'output', { layout: 'nhd' });
      expect(firstDiff(back.data, host.data), `seed ${SEED}`).toBe(-1);
      be.dispose();
    });
  }

  it('writes several device tensors of other ranks into one file, with metadata (an LSE [H, n], a 1-D list)', async () => {
    const { be, backend } = spied();
    const out = randomTensor('bf16', [20, 4, 16], rand);
    const lse = randomTensor('f32', [4, 20], rand);
    const list = randomTensor('f32', [7], rand);
    const [a, b, c] = [be.upload(out), be.upload(lse), be.upload(list)];
    const path = join(dir, 'several.safetensors');
    await writeSafetensors(
      path,
      { output: deviceTensorSource(backend, a, { chunkBytes: 64 }), lse: deviceTensorSource(backend, b, { chunkBytes: 8 }), list: deviceTensorSource(backend, c) },
      { metadata: { what: 'a test' } },
    );
    await using f = await openTensorFile(path);
    expect(f.metadata).toEqual({ what: 'a test' });
    const raw = async (name: string) => {
      const info = f.tensor(name);
      const bytes = new Uint8Array(info.byteLength);
      await f.read(bytes, info.byteOffset);
      return bytes;
    };
    expect(Buffer.from(await raw('output')).equals(Buffer.from(out.data.buffer))).toBe(true);
    expect(Buffer.from(await raw('lse')).equals(Buffer.from(lse.data.buffer))).toBe(true);
    expect(Buffer.from(await raw('list')).equals(Buffer.from(list.data.buffer))).toBe(true);
    be.dispose();
  });

  it('writes int32 and int8 index tensors (empty ones too) beside them, as I32 and I8', async () => {
    const path = join(dir, 'index.safetensors');
    const cols = Int32Array.from([0, 3, 2 ** 31 - 1, -5]);
    await writeSafetensors(path, {
      'plan.cols': { dtype: 'i32', shape: [4], data: cols },
      'plan.routes': { dtype: 'i8', shape: [3], data: Int8Array.from([0, 1, 0]) },
      'plan.empty': { dtype: 'i32', shape: [0], data: new Int32Array(0) },
    });
    await using f = await openTensorFile(path);
    expect(f.tensors.map((t) => [t.name, t.fileDtype, t.shape])).toEqual([
      ['plan.cols', 'I32', [4]],
      ['plan.routes', 'I8', [3]],
      ['plan.empty', 'I32', [0]],
    ]);
    const bytes = new Uint8Array(16);
    await f.read(bytes, f.tensor('plan.cols').byteOffset);
    expect(Array.from(new Int32Array(bytes.buffer))).toEqual(Array.from(cols));
    await expect(writeSafetensors(join(dir, 'bad.safetensors'), { x: { dtype: 'i32', shape: [2], data: new Float32Array(2) } as never })).rejects.toMatchObject({
      code: 'DTYPE_MISMATCH',
    });
  });

  it('splits a row larger than chunkBytes into pieces, and writes .npy in any layout', async () => {
    const { be, backend, reads } = spied();
    const host = randomTensor('f16', [6, 2, 8], rand);
    const t = be.upload(host);
    await writeTensor(backend, t, join(dir, 'pieces.npy'), { chunkBytes: 10 });
    expect(reads.every((r) => r.count === 5 || r.offset + r.count === 96)).toBe(true);
    reads.length = 0;
    await writeTensor(backend, t, join(dir, 'hnd.npy'), { layout: 'hnd', chunkBytes: 64 });
    for (const [name, layout] of [
      ['pieces.npy', 'nhd'],
      ['hnd.npy', 'hnd'],
    ] as const) {
      await using f = await openTensorFile(join(dir, name));
      expect(firstDiff((await readTensor(f, undefined, { layout })).data, host.data)).toBe(-1);
    }
    be.dispose();
  });

  it('falls back to one download on a backend without read', async () => {
    const be = createReferenceBackend();
    let downloads = 0;
    const backend = {
      download: (t: DeviceTensor) => {
        downloads++;
        return be.download(t);
      },
    };
    const host = randomTensor('bf16', [9, 2, 4], rand);
    const path = join(dir, 'fallback.safetensors');
    await writeTensor(backend, be.upload(host), path, { chunkBytes: 16 });
    expect(downloads).toBe(1);
    await using f = await openTensorFile(path);
    expect(firstDiff((await readTensor(f, 'tensor', { layout: 'nhd' })).data, host.data)).toBe(-1);
    be.dispose();
  });

  it('leaves no file and no temporary file when a read fails mid-write, and keeps an old file as it was', async () => {
    const { be, backend, reads } = spied(3);
    const t = be.upload(randomTensor('f32', [16, 2, 4], rand));
    const path = join(dir, 'failing.safetensors');
    await expect(writeTensor(backend, t, path, { chunkBytes: 64 })).rejects.toThrow(/fell off the bus/);
    expect(reads).toHaveLength(3);
    expect((await readdir(dir)).includes('failing.safetensors')).toBe(false);
    expect(await leftovers()).toEqual([]);
    await writeFile(path, 'the old file');
    reads.length = 0;
    await expect(writeTensor(backend, t, path, { chunkBytes: 64 })).rejects.toThrow(/fell off the bus/);
    expect(await readFile(path, 'utf8')).toBe('the old file');
    expect(await leftovers()).toEqual([]);
    be.dispose();
  });

  it('refuses a read that returns the wrong data, a disposed tensor and bad options, with typed errors', async () => {
    const be = createReferenceBackend();
    const t = be.upload(randomTensor('f32', [4, 2, 4], rand));
    const short = { download: be.download.bind(be), read: async (): Promise<HostData> => new Float32Array(1) };
    const path = join(dir, 'short.safetensors');
    await expect(writeTensor(short, t, path)).rejects.toMatchObject({ code: 'BACKEND_ERROR' });
    expect(await leftovers()).toEqual([]);
    expect(() => deviceTensorSource(be, t, { chunkBytes: 0 })).toThrow(expect.objectContaining({ code: 'INVALID_ARGUMENT' }));
    expect(() => deviceTensorSource(be, t, { chunk: 1 } as never)).toThrow(/unknown option 'chunk'/);
    expect(() => deviceTensorSource({} as never, t)).toThrow(expect.objectContaining({ code: 'INVALID_ARGUMENT' }));
    await expect(writeTensor(be, t, join(dir, 'x.npy'), { name: 'q' })).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
    t.dispose();
    expect(() => deviceTensorSource(be, t)).toThrow(expect.objectContaining({ code: 'DISPOSED' }));
    be.dispose();
  });
});
