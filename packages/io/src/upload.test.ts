// Streaming onto a backend: allocate once, write chunk by chunk, never the whole file in
// one host array; offsets past 4 GiB (sparse files, so nothing large is really written).
import { open } from 'node:fs/promises';
import { join } from 'node:path';
import { type DType, type DeviceTensor, DeviceTensorBase, type HostData, bytesPerElement } from '@crisp/core';
import { createReferenceBackend } from '@crisp/reference';
import { describe, expect, it } from 'vitest';
import { SEED, bitsOf, firstDiff, randomBits, randomTensor, reportSeedOnFailure, rng, tempDir } from '../test/helpers.js';
import { DEFAULT_CHUNK_BYTES, openSafetensors, openTensorFile, streamTensor, uploadTensor, writeNpy, writeSafetensors } from './index.js';

reportSeedOnFailure('upload');
const dir = await tempDir('upload');
const rand = rng(SEED);

describe('uploadTensor', () => {
  for (const layout of ['nhd', 'hnd'] as const) {
    it(`puts a file's tensor on the reference backend bit-exactly (${layout}, f16 and bf16)`, async () => {
      const be = createReferenceBackend();
      for (const dtype of ['bf16', 'f16'] as const) {
        const t = randomTensor(dtype, [41, 4, 16], rand);
        const path = join(dir, `up-${dtype}-${layout}.npy`);
        await writeNpy(path, t, { layout });
        await using file = await openTensorFile(path, { uint16As: dtype === 'bf16' ? 'bf16' : undefined });
        const progress: number[] = [];
        const dev = await uploadTensor(be, file, undefined, { layout, chunkRows: 6, onProgress: (r) => progress.push(r) });
        expect(dev.shape).toEqual([41, 4, 16]);
        expect(dev.dtype).toBe(dtype);
        expect(progress).toEqual([6, 12, 18, 24, 30, 36, 41]);
        const back = await be.download(dev);
        expect(firstDiff(back.data, t.data), `seed ${SEED}`).toBe(-1);
        dev.dispose();
      }
    });
  }

  it('writes chunk by chunk at row offsets and disposes the tensor when a read fails', async () => {
    const writes: { offset: number; length: number }[] = [];
    let disposed = 0;
    class FakeTensor extends DeviceTensorBase {
      readonly backend = 'fake';
      readonly store: HostData;
      constructor(dtype: DType, shape: readonly number[]) {
        super(dtype, shape);
        const count = shape.reduce((a, b) => a * b, 1);
        this.store = dtype === 'f32' ? new Float32Array(count).fill(Number.NaN) : new Uint16Array(count).fill(0x7fff);
      }
      protected release(): void {
        disposed++;
      }
    }
    const fake = {
      allocate: (dtype: DType, shape: readonly number[]) => new FakeTensor(dtype, shape),
      write: (t: DeviceTensor, offset: number, data: HostData) => {
        writes.push({ offset, length: data.length });
        bitsOf((t as FakeTensor).store).set(bitsOf(data) as never, offset);
      },
    };
    const t = randomTensor('f32', [50, 3, 4], rand);
    const path = join(dir, 'fake.safetensors');
    await writeSafetensors(path, { q: t }, { layout: '1nhd' });
    await using file = await openSafetensors(path);
    const dev = (await uploadTensor(fake, file, 'q', { layout: '1nhd', chunkRows: 16 })) as FakeTensor;
    expect(writes).toEqual([
      { offset: 0, length: 16 * 12 },
      { offset: 16 * 12, length: 16 * 12 },
      { offset: 32 * 12, length: 16 * 12 },
      { offset: 48 * 12, length: 2 * 12 },
    ]);
    expect(firstDiff(dev.store, t.data), `seed ${SEED}`).toBe(-1);

    // A file cut short after open: the upload fails with FORMAT_ERROR and frees its tensor.
    const fh = await open(path, 'r+');
    await fh.truncate(file.tensor('q').byteOffset + 20 * 12 * 4);
    await fh.close();
    const err = await uploadTensor(fake, file, 'q', { layout: '1nhd', chunkRows: 16 }).catch((e: unknown) => e);
    expect((err as { code?: string }).code).toBe('FORMAT_ERROR');
    expect(String(err)).toMatch(/truncated/);
    expect(disposed).toBe(1);
  });

  it('default chunks stay within DEFAULT_CHUNK_BYTES (bounded host memory)', async () => {
    // 40 MiB bf16 tensor: streamed in chunks of at most 16 MiB.
    const [n, H, d] = [2560, 64, 128];
    const path = join(dir, 'big.safetensors');
    const data = randomBits('bf16', n * H * d, rand) as Uint16Array;
    await writeSafetensors(path, { k: { dtype: 'bf16', shape: [n, H, d], data } });
    await using file = await openSafetensors(path);
    let rows = 0;
    let chunks = 0;
    for await (const c of streamTensor(file, 'k', { layout: 'nhd' })) {
      expect(c.data.byteLength).toBeLessThanOrEqual(DEFAULT_CHUNK_BYTES);
      expect(c.rowStart).toBe(rows);
      // Spot-check one element per chunk against the source.
      const j = Math.floor(rand() * c.data.length);
      expect(c.data[j]).toBe(data[c.rowStart * H * d + j]);
      rows += c.rowCount;
      chunks++;
    }
    expect(rows).toBe(n);
    expect(chunks).toBe(3);
  });
});

describe('files beyond 4 GiB', () => {
  it('reads rows at offsets past 2^32 exactly (sparse file: only the tail holds data)', async () => {
    // [n, H, d] = [40960, 32, 128] bf16 is 320 MiB per tensor; 'pad' pushes 'k' past 4 GiB.
    const [n, H, d] = [40960, 32, 128];
    const dtype = 'bf16';
    const kBytes = n * H * d * bytesPerElement(dtype);
    const padBytes = 2 ** 32 + 4096;
    const header = {
      pad: { dtype: 'U8', shape: [padBytes], data_offsets: [0, padBytes] },
      k: { dtype: 'BF16', shape: [H, n, d], data_offsets: [padBytes, padBytes + kBytes] },
    };
    const json = Buffer.from(JSON.stringify(header));
    const path = join(dir, 'sparse.safetensors');
    const fh = await open(path, 'w');
    const len = Buffer.alloc(8);
    len.writeBigUInt64LE(BigInt(json.length));
    await fh.write(len, 0, 8, 0);
    await fh.write(json, 0, json.length, 8);
    const dataStart = 8 + json.length;
    await fh.truncate(dataStart + padBytes + kBytes);
    // Fill rows [n - 7, n) of every head ([H, n, d] layout: H separate runs near the end).
    const tail = 7;
    const expectRows = randomBits(dtype, tail * H * d, rand) as Uint16Array; // canonical [tail, H, d]
    for (let h = 0; h < H; h++) {
      const run = new Uint16Array(tail * d);
      for (let r = 0; r < tail; r++) run.set(expectRows.subarray((r * H + h) * d, (r * H + h + 1) * d), r * d);
      await fh.write(new Uint8Array(run.buffer), 0, run.byteLength, dataStart + padBytes + (h * n + n - tail) * d * 2);
    }
    await fh.close();

    await using file = await openSafetensors(path);
    expect(file.fileSize).toBeGreaterThan(2 ** 32 + kBytes);
    expect(file.tensor('k').byteOffset).toBeGreaterThan(2 ** 32);
    const got: Uint16Array[] = [];
    for await (const c of streamTensor(file, 'k', { layout: 'hnd', rows: [n - tail, n], chunkRows: 3 })) {
      got.push(c.data as Uint16Array);
    }
    const all = new Uint16Array(tail * H * d);
    let at = 0;
    for (const g of got) {
      all.set(g, at);
      at += g.length;
    }
    expect(firstDiff(all, expectRows), `seed ${SEED}`).toBe(-1);
  });
});
