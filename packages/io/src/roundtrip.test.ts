import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { DTYPES, type DType, type HostData, bytesPerElement, decode, encode } from '@crisp/core';
import { describe, expect, it } from 'vitest';
import {
  SEED,
  bitsOf,
  firstDiff,
  randomTensor,
  reportSeedOnFailure,
  rng,
  tempDir,
} from '../test/helpers.js';
import {
  LAYOUTS,
  type Layout,
  type TensorChunk,
  fileShapeFor,
  openTensorFile,
  readTensor,
  streamTensor,
  tensorSource,
  writeNpy,
  writeSafetensors,
} from './index.js';

reportSeedOnFailure('roundtrip');
const dir = await tempDir('roundtrip');
const FORMATS = ['safetensors', 'npy'] as const;

/** Independent layout math: where canonical element (i, h, j) lives in the file. */
function fileIndex(layout: Layout, n: number, H: number, d: number, i: number, h: number, j: number): number {
  return layout === 'hnd' ? (h * n + i) * d + j : (i * H + h) * d + j;
}

async function collect(it: AsyncIterable<TensorChunk>): Promise<TensorChunk[]> {
  const out: TensorChunk[] = [];
  for await (const c of it) out.push(c);
  return out;
}

function concat(dtype: DType, chunks: readonly { data: HostData }[]): HostData {
  const len = chunks.reduce((a, c) => a + c.data.length, 0);
  const out = dtype === 'f32' ? new Float32Array(len) : new Uint16Array(len);
  let at = 0;
  for (const c of chunks) {
    bitsOf(out).set(bitsOf(c.data) as never, at);
    at += c.data.length;
  }
  return out;
}

describe('round trips: every dtype x format x layout, exact bits', () => {
  const rand = rng(SEED);
  for (const dtype of DTYPES) {
    for (const format of FORMATS) {
      for (const layout of LAYOUTS) {
        it(`${dtype} ${format} ${layout}`, async () => {
          const n = 11 + Math.floor(rand() * 20);
          const H = 1 + Math.floor(rand() * 4);
          const d = 1 + Math.floor(rand() * 9);
          const t = randomTensor(dtype, [n, H, d], rand);
          const path = join(dir, `${dtype}-${layout}.${format === 'npy' ? 'npy' : 'safetensors'}`);
          if (format === 'npy') await writeNpy(path, t, { layout });
          else await writeSafetensors(path, { x: t }, { layout });

          await using file = await openTensorFile(path, { uint16As: dtype === 'bf16' ? 'bf16' : undefined });
          expect(file.format).toBe(format);
          const info = file.tensor(format === 'npy' ? undefined : 'x');
          expect(info.dtype).toBe(dtype);
          expect(info.shape).toEqual(fileShapeFor({ n, H, d }, layout));

          // The bytes on disk, checked against independent index math (not the reader).
          const raw = (await readFile(path)).subarray(info.byteOffset, info.byteOffset + info.byteLength);
          const fileBits = bytesPerElement(dtype) === 4 ? new Uint32Array(raw.buffer.slice(raw.byteOffset, raw.byteOffset + raw.byteLength)) : new Uint16Array(raw.buffer.slice(raw.byteOffset, raw.byteOffset + raw.byteLength));
          const src = bitsOf(t.data);
          expect(fileBits.length).toBe(src.length);
          let bad = -1;
          for (let i = 0; i < n && bad < 0; i++)
            for (let h = 0; h < H; h++)
              for (let j = 0; j < d; j++)
                if (fileBits[fileIndex(layout, n, H, d, i, h, j)] !== src[(i * H + h) * d + j]) bad = (i * H + h) * d + j;
          expect(bad, `file element for canonical ${bad} (seed ${SEED})`).toBe(-1);

          // Whole read and chunked stream both give the canonical bits back.
          const whole = await readTensor(file, info.name, { layout });
          expect(whole.shape).toEqual([n, H, d]);
          expect(firstDiff(whole.data, t.data), `seed ${SEED}`).toBe(-1);
          const chunkRows = 1 + Math.floor(rand() * 5);
          const chunks = await collect(streamTensor(file, info.name, { layout, chunkRows }));
          expect(chunks.map((c) => c.rowStart)).toEqual(Array.from({ length: Math.ceil(n / chunkRows) }, (_, k) => k * chunkRows));
          for (const c of chunks) {
            expect(c.rowCount).toBeLessThanOrEqual(chunkRows);
            expect(c.data.length).toBe(c.rowCount * H * d);
          }
          expect(firstDiff(concat(dtype, chunks), t.data), `chunkRows ${chunkRows} seed ${SEED}`).toBe(-1);

          // A row window equals the same slice of the whole.
          const r0 = Math.floor(rand() * n);
          const r1 = r0 + Math.floor(rand() * (n - r0 + 1));
          const part = await collect(streamTensor(file, info.name, { layout, chunkRows: 3, rows: [r0, r1] }));
          const want = t.data.subarray(r0 * H * d, r1 * H * d) as HostData;
          expect(firstDiff(concat(dtype, part), want), `rows [${r0}, ${r1}) seed ${SEED}`).toBe(-1);
        });
      }
    }
  }
});

describe('streamed writes', () => {
  const rand = rng(SEED ^ 0x5eed);
  for (const layout of LAYOUTS) {
    it(`chunked sources write the same bytes as whole tensors (${layout})`, async () => {
      const [n, H, d] = [23, 3, 6];
      for (const dtype of DTYPES) {
        const t = randomTensor(dtype, [n, H, d], rand);
        // Random row-aligned chunk sizes, including single rows.
        const pieces: HostData[] = [];
        for (let r = 0; r < n; ) {
          const rc = Math.min(n - r, 1 + Math.floor(rand() * 7));
          pieces.push(t.data.subarray(r * H * d, (r + rc) * H * d) as HostData);
          r += rc;
        }
        const source = { dtype, shape: [n, H, d], chunks: () => pieces };
        for (const ext of ['safetensors', 'npy'] as const) {
          const a = join(dir, `whole-${dtype}-${layout}.${ext}`);
          const b = join(dir, `chunked-${dtype}-${layout}.${ext}`);
          if (ext === 'npy') {
            await writeNpy(a, t, { layout });
            await writeNpy(b, source, { layout });
          } else {
            await writeSafetensors(a, { q: t }, { layout });
            await writeSafetensors(b, { q: source }, { layout });
          }
          expect(Buffer.compare(await readFile(a), await readFile(b)), `${dtype} ${ext} seed ${SEED}`).toBe(0);
        }
      }
    });
  }

  it('converts between layouts and formats through tensorSource without a whole-tensor array', async () => {
    const t = randomTensor('bf16', [29, 4, 8], rand);
    const src = join(dir, 'conv-src.safetensors');
    await writeSafetensors(src, { k: t }, { layout: 'hnd' });
    await using file = await openTensorFile(src);
    const dst = join(dir, 'conv-dst.npy');
    await writeNpy(dst, tensorSource(file, 'k', { layout: 'hnd', chunkRows: 5 }), { layout: '1nhd' });
    await using out = await openTensorFile(dst, { uint16As: 'bf16' });
    expect(out.tensor().shape).toEqual([1, 29, 4, 8]);
    const back = await readTensor(out, undefined, { layout: '1nhd' });
    expect(firstDiff(back.data, t.data), `seed ${SEED}`).toBe(-1);
  });

  it('several tensors of different dtypes and shapes share one safetensors file', async () => {
    const q = randomTensor('f32', [17, 8, 4], rand);
    const k = randomTensor('bf16', [17, 2, 4], rand);
    const v = randomTensor('f16', [17, 2, 4], rand);
    const path = join(dir, 'qkv-mixed.safetensors');
    await writeSafetensors(path, { q, k, v }, { metadata: { source: 'test' } });
    // Check the header independently of the reader: length prefix, JSON, 8-byte padding.
    const bytes = await readFile(path);
    const len = Number(bytes.readBigUInt64LE(0));
    expect(len % 8).toBe(0);
    const header = JSON.parse(bytes.subarray(8, 8 + len).toString('utf8'));
    expect(header.__metadata__).toEqual({ source: 'test' });
    expect(header.q).toEqual({ dtype: 'F32', shape: [17, 8, 4], data_offsets: [0, 17 * 8 * 4 * 4] });
    expect(header.k.dtype).toBe('BF16');
    expect(header.v.dtype).toBe('F16');
    expect(8 + len + header.v.data_offsets[1]).toBe(bytes.length);
    await using file = await openTensorFile(path);
    expect(file.metadata).toEqual({ source: 'test' });
    for (const [name, t] of [['q', q], ['k', k], ['v', v]] as const) {
      const back = await readTensor(file, name, { layout: 'nhd' });
      expect(firstDiff(back.data, t.data), `${name} seed ${SEED}`).toBe(-1);
    }
  });

  it('converts dtype per chunk with round-to-nearest-even (f32 file to bf16 and f16)', async () => {
    const values = Float32Array.from({ length: 19 * 2 * 8 }, () => (rand() - 0.5) * 2 ** (rand() * 40 - 20));
    const path = join(dir, 'cast.safetensors');
    await writeSafetensors(path, { q: { dtype: 'f32', shape: [19, 2, 8], data: values } }, { layout: 'hnd' });
    await using file = await openTensorFile(path);
    for (const dtype of ['bf16', 'f16'] as const) {
      const back = await readTensor(file, 'q', { layout: 'hnd', dtype });
      expect(back.dtype).toBe(dtype);
      expect(firstDiff(back.data, encode(dtype, values)), `${dtype} seed ${SEED}`).toBe(-1);
      // Spot-check against the float64 value: within half an ulp of the target type.
      const got = decode(dtype, back.data);
      const ulp = dtype === 'bf16' ? 2 ** -8 : 2 ** -11;
      for (let i = 0; i < values.length; i++) {
        if (Math.abs(values[i]) < 2 ** -14 || Math.abs(values[i]) > 60000) continue;
        expect(Math.abs(got[i] - values[i]) <= Math.abs(values[i]) * ulp, `${dtype} [${i}] seed ${SEED}`).toBe(true);
      }
    }
  });
});
