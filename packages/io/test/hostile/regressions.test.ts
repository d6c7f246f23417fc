// Inputs that once crashed, hung, or were silently accepted: each must now end in a typed
// CrispError (or the right result) and write nothing it should not.
import { mkdir, readFile, stat, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { SEED, firstDiff, randomTensor, reportSeedOnFailure, rng, tempDir } from '../helpers.js';
import { openSafetensors, openTensorFile, readQkv, writeNpy, writeSafetensors } from '../../src/index.js';
import { expectCode, leftovers, makeCharDevice, makeFifo, releaseFifo, settlesWithin } from './util.js';

reportSeedOnFailure('hostile/regressions');
const dir = await tempDir('regressions');
const rand = rng(SEED);

/** A safetensors file from a header (object or raw JSON text) over `data`. */
function craft(header: unknown, data: Uint8Array = new Uint8Array(0)): Uint8Array {
  const json = Buffer.from(typeof header === 'string' ? header : JSON.stringify(header), 'utf8');
  const out = new Uint8Array(8 + json.length + data.length);
  Buffer.from(out.buffer).writeBigUInt64LE(BigInt(json.length), 0);
  out.set(json, 8);
  out.set(data, 8 + json.length);
  return out;
}

describe('regressions', () => {
  it('readQkv over a directory of .npy files with tensors above one 16 MiB chunk reads them whole', async () => {
    const sub = join(dir, 'big-npys');
    await mkdir(sub);
    // [2100, 16, 128] f32 = 17.2 MB: two chunks each.
    const t = { q: randomTensor('f32', [2100, 16, 128], rand), k: randomTensor('f32', [2100, 4, 128], rand) };
    await writeNpy(join(sub, 'q.npy'), t.q);
    await writeNpy(join(sub, 'k.npy'), { ...t.q, data: t.q.data.slice() });
    await writeNpy(join(sub, 'v.npy'), t.q);
    const got = await settlesWithin(readQkv(sub, { layout: 'nhd' }), 30_000, 'readQkv');
    expect(firstDiff(got.q.data, t.q.data)).toBe(-1);
    expect(firstDiff(got.v.data, t.q.data)).toBe(-1);
  });

  it('a FIFO as the file, or as q.npy in a dump directory, is refused at once (no hang)', async () => {
    const fifo = join(dir, 'pipe.safetensors');
    if (!makeFifo(fifo)) return;
    try {
      await expectCode(openTensorFile(fifo), 'IO_ERROR', /FIFO/, 3000);
      await expectCode(readQkv(fifo, { layout: 'nhd' }), 'IO_ERROR', /FIFO/, 3000);
    } finally {
      releaseFifo(fifo);
    }
    const sub = join(dir, 'fifo-dir');
    await mkdir(sub);
    const q = randomTensor('f32', [4, 2, 8], rand);
    await writeNpy(join(sub, 'k.npy'), q);
    await writeNpy(join(sub, 'v.npy'), q);
    if (!makeFifo(join(sub, 'q.npy'))) return;
    try {
      await expectCode(readQkv(sub, { layout: 'nhd' }), 'IO_ERROR', /q\.npy.*FIFO/, 3000);
    } finally {
      releaseFifo(join(sub, 'q.npy'));
    }
  });

  it('readQkv without options, or with null, is a typed INVALID_ARGUMENT naming the layout option', async () => {
    const path = join(dir, 'ok.safetensors');
    const q = randomTensor('bf16', [4, 2, 8], rand);
    await writeSafetensors(path, { q, k: q, v: q });
    // @ts-expect-error: the options are required
    await expectCode(readQkv(path), 'INVALID_ARGUMENT', /layout/);
    // @ts-expect-error: the options are required
    await expectCode(readQkv(path, null), 'INVALID_ARGUMENT', /layout/);
    // @ts-expect-error: a path is required
    await expectCode(readQkv(undefined, { layout: 'nhd' }), 'INVALID_ARGUMENT', /path/);
    await expectCode(readQkv('', { layout: 'nhd' }), 'INVALID_ARGUMENT', /path/);
  });

  it('safetensors that the reference parser refuses: duplicate keys, gaps, trailing bytes, data before the first tensor', async () => {
    const data = new Uint8Array(32);
    const dup = '{"x": {"dtype": "U8", "shape": [16], "data_offsets": [0, 16]}, "x": {"dtype": "U8", "shape": [32], "data_offsets": [0, 32]}}';
    await expectCode(openSafetensors(await put(craft(dup, data))), 'FORMAT_ERROR', /duplicate key 'x'/);
    const gap = { a: { dtype: 'U8', shape: [8], data_offsets: [0, 8] }, b: { dtype: 'U8', shape: [8], data_offsets: [16, 24] } };
    await expectCode(openSafetensors(await put(craft(gap, data.subarray(0, 24)))), 'FORMAT_ERROR', /bytes \[8, 16\).*no tensor/);
    const trailing = { a: { dtype: 'U8', shape: [16], data_offsets: [0, 16] } };
    await expectCode(openSafetensors(await put(craft(trailing, data))), 'FORMAT_ERROR', /16 bytes after the last tensor/);
    const before = { a: { dtype: 'U8', shape: [16], data_offsets: [16, 32] } };
    await expectCode(openSafetensors(await put(craft(before, data))), 'FORMAT_ERROR', /bytes \[0, 16\).*no tensor/);
  });

  it('a 120 MB header is "too large", not "truncated"', async () => {
    const path = join(dir, 'huge-header.safetensors');
    const len = Buffer.alloc(16);
    len.writeBigUInt64LE(120_000_000n, 0);
    len.write('{"a":', 8);
    await writeFile(path, len);
    const fh = await import('node:fs/promises').then((m) => m.open(path, 'r+'));
    await fh.truncate(8 + 120_000_000);
    await fh.close();
    await expectCode(openSafetensors(path), 'FORMAT_ERROR', /too large.*100 MB/);
  });

  it("dtypes named after Object.prototype members are unknown dtypes, not 'NaN bytes'", async () => {
    for (const dtype of ['__proto__', 'constructor', 'toString', 'hasOwnProperty']) {
      const h = `{"x": {"dtype": "${dtype}", "shape": [4], "data_offsets": [0, 4]}}`;
      const e = await expectCode(openSafetensors(await put(craft(h, new Uint8Array(4)))), 'FORMAT_ERROR', new RegExp(`unknown dtype '${dtype}'`));
      expect(e.message).not.toMatch(/NaN/);
    }
  });

  it('writers refuse to replace a FIFO, a directory or a device node; nothing is written', async () => {
    const sub = join(dir, 'targets');
    await mkdir(sub);
    const t = randomTensor('f32', [3, 2, 2], rand);
    const fifo = join(sub, 'fifo.npy');
    if (makeFifo(fifo)) {
      await expectCode(writeNpy(fifo, t), 'IO_ERROR', /FIFO/, 3000);
      expect((await stat(fifo)).isFIFO()).toBe(true);
    }
    await mkdir(join(sub, 'adir.npy'));
    await expectCode(writeNpy(join(sub, 'adir.npy'), t), 'IO_ERROR', /directory/);
    const dev = join(sub, 'null.safetensors');
    if (makeCharDevice(dev)) {
      await expectCode(writeSafetensors(dev, { t }), 'IO_ERROR', /character device/);
      expect((await stat(dev)).isCharacterDevice()).toBe(true);
    }
    expect(await leftovers(sub)).toEqual([]);
  });

  it('a chunk source that throws leaves the old file untouched and no temporary file', async () => {
    const sub = join(dir, 'throwing');
    await mkdir(sub);
    const target = join(sub, 'x.safetensors');
    const t = randomTensor('f32', [3, 2, 2], rand);
    await writeSafetensors(target, { t });
    const before = await readFile(target);
    const bad = {
      dtype: 'f32' as const,
      shape: [3, 2, 2],
      *chunks() {
        yield t.data.subarray(0, 4) as Float32Array;
        throw new Error('source failed');
      },
    };
    await expectCode(writeSafetensors(target, { t: bad }), 'INVALID_ARGUMENT', /chunk source.*source failed/);
    expect(Buffer.compare(before, await readFile(target))).toBe(0);
    expect(await leftovers(sub)).toEqual([]);
  });
});

let counter = 0;
async function put(bytes: Uint8Array): Promise<string> {
  const path = join(dir, `r${counter++}.safetensors`);
  await writeFile(path, bytes);
  return path;
}
