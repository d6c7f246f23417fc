// The generated corpus of broken files, each opened three ways (in memory, as a file by
// format, as a file by content): the same exact code every way, and a message that names
// the problem. Valid-but-odd cases must open and read back every tensor's bytes.
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { isCrispError } from '@crisp/core';
import { describe, expect, it } from 'vitest';
import { openNpy, openSafetensors, openTensorFile, parseNpyBuffer, parseSafetensorsBuffer, readTensor } from '../../src/index.js';
import { tempDir } from '../helpers.js';
import { type Case, npyCorpus, npyDescrCorpus, safetensorsCorpus } from './corpus.js';
import { caught } from './util.js';

const dir = await tempDir('corpus');
let counter = 0;

function outcome(e: unknown): string {
  if (e === undefined) return 'ok';
  return isCrispError(e) ? e.code : `non-CrispError ${e instanceof Error ? `${e.name}: ${e.message}` : String(e)}`;
}

async function check(c: Case, memory: () => unknown, fromFile: (path: string) => (() => Promise<{ close(): Promise<void> }>)[]): Promise<void> {
  const label = `${c.family}: ${c.name}`;
  const mem = await caught(memory);
  expect(outcome(mem), `${label} (in memory): ${String(mem)}`).toBe(c.expect);
  if (c.message !== undefined) expect((mem as Error).message, label).toMatch(c.message);
  const path = join(dir, `c${counter++}.bin`);
  await writeFile(path, c.bytes);
  for (const [way, open] of fromFile(path).entries()) {
    let file: { close(): Promise<void> } | undefined;
    const e = await caught(async () => {
      file = await open();
    });
    expect(outcome(e), `${label} (from a file): ${String(e)}`).toBe(c.expect);
    // The format's own opener gives the same message; openTensorFile may say neither format fits.
    if (c.message !== undefined && way === 0) expect((e as Error).message, label).toMatch(c.message);
    await file?.close();
  }
}

describe('hostile corpus: safetensors', () => {
  const cases = safetensorsCorpus();
  const families = [...new Set(cases.map((c) => c.family))];
  for (const family of families) {
    const mine = cases.filter((c) => c.family === family);
    it(`${family} (${mine.length} cases)`, async () => {
      for (const c of mine) {
        await check(
          c,
          () => parseSafetensorsBuffer(c.bytes, 'f'),
          (p) => [() => openSafetensors(p), () => openTensorFile(p)],
        );
        if (c.expect !== 'ok') continue;
        // Every tensor of an accepted file reads back as the bytes at its range.
        await using f = await openSafetensors(join(dir, `c${counter - 1}.bin`));
        for (const t of f.tensors) {
          const got = new Uint8Array(t.byteLength);
          await f.read(got, t.byteOffset);
          expect(Buffer.compare(got, c.bytes.subarray(t.byteOffset, t.byteOffset + t.byteLength))).toBe(0);
        }
      }
    });
  }
  it('a tensor named __proto__ is found by that name, and unsupported dtypes are named when read', async () => {
    const c = cases.find((x) => x.name === "a tensor named '__proto__'") as Case;
    const path = join(dir, 'proto.safetensors');
    await writeFile(path, c.bytes);
    await using f = await openSafetensors(path);
    expect(f.tensor('__proto__').shape).toEqual([2, 3]);
    expect(Object.getPrototypeOf(f.metadata)).toBe(Object.prototype);
    for (const dt of cases.filter((x) => x.family === 'dtype' && x.expect === 'ok')) {
      const p = join(dir, `dt${counter++}.safetensors`);
      await writeFile(p, dt.bytes);
      await using g = await openSafetensors(p);
      const t = g.tensor('x');
      const e = await caught(readTensor(g, 'x', { layout: 'nhd' }));
      if (t.dtype === undefined) {
        expect(outcome(e), dt.name).toBe('UNSUPPORTED');
        expect((e as Error).message).toMatch(new RegExp(`'x' is ${t.fileDtype}; CRISP reads F32, F16 or BF16`));
      } else {
        expect(outcome(e), dt.name).toBe('SHAPE_MISMATCH'); // rank 1, not [n, H, d]
      }
    }
  });
});

describe('hostile corpus: .npy', () => {
  const cases = npyCorpus();
  for (const family of [...new Set(cases.map((c) => c.family))]) {
    const mine = cases.filter((c) => c.family === family);
    it(`${family} (${mine.length} cases)`, async () => {
      for (const c of mine) {
        await check(
          c,
          () => parseNpyBuffer(c.bytes, {}, 'f'),
          (p) => [() => openNpy(p), () => openTensorFile(p)],
        );
      }
    });
  }
  const descrs = npyDescrCorpus();
  it(`every NumPy descr, with and without uint16As (${descrs.length * 2} cases)`, async () => {
    for (const c of descrs) {
      const path = join(dir, `d${counter++}.npy`);
      await writeFile(path, c.bytes);
      for (const [opts, want] of [[{}, c.plain], [{ uint16As: 'bf16' as const }, c.bf16]] as const) {
        const mem = await caught(() => parseNpyBuffer(c.bytes, opts, 'f'));
        expect(outcome(mem), `${c.name} ${JSON.stringify(opts)}: ${String(mem)}`).toBe(want);
        let file: { close(): Promise<void> } | undefined;
        const e = await caught(async () => {
          file = await openNpy(path, opts);
        });
        expect(outcome(e), `${c.name} ${JSON.stringify(opts)} (file)`).toBe(want);
        await file?.close();
        if (want !== 'ok') expect((e as Error).message).toMatch(/convert|re-save|uint16As|drop that option|does not read/);
      }
    }
  });
});
