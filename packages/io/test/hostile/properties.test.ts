// Property-based hostile input (fast-check): random mutations and truncations of valid
// files, random header values and random names never end in anything but a valid result
// or a CrispError (no other exception, no hang); random tensors round-trip bit-exactly.
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { DTYPES, isCrispError } from '@crisp/core';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import {
  LAYOUTS,
  openNpy,
  openSafetensors,
  openTensorFile,
  parseNpyBuffer,
  parseSafetensorsBuffer,
  readTensor,
  resolveQkvNames,
  streamTensor,
  tensorSource,
  writeNpy,
  writeSafetensors,
} from '../../src/index.js';
import { JsonNumber, parseStrictJson } from '../../src/strict-json.js';
import { SEED, firstDiff, randomTensor, reportSeedOnFailure, rng, tempDir } from '../helpers.js';
import { npyOf, safetensorsOf } from './corpus.js';
import { settlesWithin } from './util.js';

reportSeedOnFailure('hostile/properties');
const dir = await tempDir('props');
const rand = rng(SEED);
const params = (numRuns: number) => ({ seed: SEED, numRuns });

/** Runs `f`; true when it returned or threw a CrispError, otherwise the failure is rethrown. */
function cleanSync(f: () => unknown): boolean {
  try {
    f();
    return true;
  } catch (e) {
    if (isCrispError(e)) return true;
    throw e;
  }
}
async function clean(p: () => Promise<unknown>): Promise<boolean> {
  try {
    await settlesWithin(p(), 10_000, 'a read');
    return true;
  } catch (e) {
    if (isCrispError(e)) return true;
    throw e;
  }
}

const validSt = safetensorsOf(
  {
    __metadata__: { format: 'pt' },
    q: { dtype: 'BF16', shape: [4, 2, 4], data_offsets: [0, 64] },
    k: { dtype: 'F32', shape: [4, 1, 4], data_offsets: [64, 128] },
    v: { dtype: 'F16', shape: [4, 1, 4], data_offsets: [128, 160] },
  },
  Uint8Array.from({ length: 160 }, (_, i) => i),
);
const validNpy = npyOf("{'descr': '<f4', 'fortran_order': False, 'shape': (4, 2, 4), }", new Uint8Array(128).fill(7));

/** A mutation: bytes overwritten at random places (biased to the header), then a cut. */
const mutation = (len: number, headerLen: number) =>
  fc.record({
    edits: fc.array(
      fc.record({ at: fc.oneof(fc.nat({ max: headerLen - 1 }), fc.nat({ max: len - 1 })), byte: fc.integer({ min: 0, max: 255 }) }),
      { maxLength: 6 },
    ),
    cut: fc.option(fc.nat({ max: len }), { freq: 4 }),
  });
function mutate(base: Uint8Array, m: { edits: { at: number; byte: number }[]; cut: number | null }): Uint8Array {
  const b = base.slice();
  for (const e of m.edits) b[e.at] = e.byte;
  return m.cut === null ? b : b.subarray(0, m.cut);
}

/** Checks what a parser accepted: every tensor inside the file, ranges contiguous. */
function accepted(tensors: readonly { byteOffset: number; byteLength: number }[], size: number): void {
  for (const t of tensors) {
    expect(t.byteOffset + t.byteLength).toBeLessThanOrEqual(size);
    expect(Number.isSafeInteger(t.byteOffset) && Number.isSafeInteger(t.byteLength)).toBe(true);
  }
}

describe('mutated files: a valid result or a CrispError, nothing else', () => {
  it('safetensors bytes, in memory (3000 mutants)', () => {
    fc.assert(
      fc.property(mutation(validSt.length, 8 + Number(Buffer.from(validSt).readBigUInt64LE(0))), (m) => {
        const b = mutate(validSt, m);
        return cleanSync(() => accepted(parseSafetensorsBuffer(b, 'm').tensors, b.length));
      }),
      params(3000),
    );
  });
  it('.npy bytes, in memory (3000 mutants)', () => {
    fc.assert(
      fc.property(mutation(validNpy.length, 128), fc.boolean(), (m, bf16) => {
        const b = mutate(validNpy, m);
        return cleanSync(() => accepted([parseNpyBuffer(b, bf16 ? { uint16As: 'bf16' } : {}, 'm')], b.length));
      }),
      params(3000),
    );
  });
  it('both formats through files, opened and read whole (300 mutants)', async () => {
    let i = 0;
    await fc.assert(
      fc.asyncProperty(fc.boolean(), mutation(validSt.length, 140), fc.constantFrom(...LAYOUTS), async (st, m, layout) => {
        const b = mutate(st ? validSt : validNpy, m);
        const path = join(dir, `m${i++}`);
        await writeFile(path, b);
        return clean(async () => {
          await using f = await openTensorFile(path);
          for (const t of f.tensors) await clean(() => readTensor(f, t.name, { layout, dtype: 'f32' }));
        });
      }),
      params(300),
    );
  });
  it('random values in every header field (2000 headers)', () => {
    const anyValue = fc.oneof(
      fc.jsonValue({ maxDepth: 2 }),
      fc.constantFrom('F32', 'BF16', 'F4', '__proto__', 'constructor', [0, 64], [64, 0], [2, 2, 4], [], [-1], [2 ** 53, 1]),
    );
    fc.assert(
      fc.property(fc.constantFrom('q', 'k', 'v', '__metadata__'), fc.constantFrom('dtype', 'shape', 'data_offsets', 'extra', null), anyValue, (name, field, value) => {
        const h = JSON.parse(Buffer.from(validSt.subarray(8, 8 + Number(Buffer.from(validSt).readBigUInt64LE(0)))).toString());
        if (field === null || name === '__metadata__') h[name] = value;
        else h[name][field] = value;
        const b = safetensorsOf(h, validSt.subarray(validSt.length - 160));
        return cleanSync(() => accepted(parseSafetensorsBuffer(b, 'h').tensors, b.length));
      }),
      params(2000),
    );
  });
});

describe('strict JSON and names', () => {
  it('parseStrictJson agrees with JSON.parse on any JSON text without duplicate keys (1000 texts)', () => {
    const plain = (v: unknown): unknown =>
      v instanceof Map ? Object.fromEntries([...v].map(([k, x]) => [k, plain(x)])) : Array.isArray(v) ? v.map(plain) : v instanceof JsonNumber ? v.value : v;
    fc.assert(
      fc.property(fc.json({ maxDepth: 4 }), (text) => {
        expect(JSON.stringify(plain(parseStrictJson(text)))).toBe(JSON.stringify(JSON.parse(text)));
      }),
      params(1000),
    );
  });
  it('resolveQkvNames on random names: names it was given, or a CrispError (2000 lists)', () => {
    const name = fc.oneof(fc.string({ maxLength: 12 }), fc.constantFrom('q', 'Q', 'k', 'key', 'v', 'value', 'a.q', 'b.q', 'x/k', 'xv', '__proto__'));
    fc.assert(
      fc.property(fc.array(name, { maxLength: 8 }), fc.option(fc.record({ q: name }, { requiredKeys: [] })), (names, given) =>
        cleanSync(() => {
          const got = resolveQkvNames(names, 'f', given ?? undefined);
          for (const role of ['q', 'k', 'v'] as const) expect(names).toContain(got[role]);
        }),
      ),
      params(2000),
    );
  });
});

describe('round trips of random shapes, dtypes, layouts and chunkings are bit-exact', () => {
  it('write -> read, both formats (120 tensors)', async () => {
    let i = 0;
    await fc.assert(
      fc.asyncProperty(
        fc.record({
          dtype: fc.constantFrom(...DTYPES),
          n: fc.integer({ min: 1, max: 40 }),
          H: fc.integer({ min: 1, max: 4 }),
          d: fc.integer({ min: 1, max: 16 }),
          layout: fc.constantFrom(...LAYOUTS),
          npy: fc.boolean(),
          chunkRows: fc.integer({ min: 1, max: 50 }),
        }),
        async ({ dtype, n, H, d, layout, npy, chunkRows }) => {
          const t = randomTensor(dtype, [n, H, d], rand);
          const path = join(dir, `rt${i++}.${npy ? 'npy' : 'safetensors'}`);
          if (npy) await writeNpy(path, t, { layout });
          else await writeSafetensors(path, { t }, { layout });
          await using f = npy ? await openNpy(path, { uint16As: dtype === 'bf16' ? 'bf16' : undefined }) : await openSafetensors(path);
          const whole = await readTensor(f, undefined, { layout });
          expect(whole.shape).toEqual([n, H, d]);
          expect(firstDiff(whole.data, t.data)).toBe(-1);
          // Streamed back in chunks, converted to the other format through a source.
          const other = join(dir, `rt${i++}.${npy ? 'safetensors' : 'npy'}`);
          const src = tensorSource(f, undefined, { layout, chunkRows });
          if (npy) await writeSafetensors(other, { t: src }, { layout: 'hnd' });
          else await writeNpy(other, src, { layout: 'hnd' });
          await using g = npy ? await openSafetensors(other) : await openNpy(other, { uint16As: dtype === 'bf16' ? 'bf16' : undefined });
          let at = 0;
          for await (const c of streamTensor(g, undefined, { layout: 'hnd', chunkRows })) {
            expect(c.rowStart * H * d).toBe(at);
            expect(firstDiff(c.data, t.data.subarray(at, at + c.data.length) as never)).toBe(-1);
            at += c.data.length;
          }
          expect(at).toBe(n * H * d);
        },
      ),
      params(120),
    );
  });
});
