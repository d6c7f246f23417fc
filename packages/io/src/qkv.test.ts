// readQkv: name resolution (defaults, aliases, dump-style prefixes, explicit names) on
// safetensors files and directories of .npy files, with errors that list what was found.
import { mkdir } from 'node:fs/promises';
import { join } from 'node:path';
import { type CrispErrorCode, isCrispError } from '@crisp/core';
import { describe, expect, it } from 'vitest';
import { SEED, firstDiff, randomTensor, reportSeedOnFailure, rng, tempDir } from '../test/helpers.js';
import { readQkv, resolveQkvLayers, resolveQkvNames, splitLayerName, writeNpy, writeSafetensors } from './index.js';

reportSeedOnFailure('qkv');
const dir = await tempDir('qkv');
const rand = rng(SEED);

async function expectError(p: Promise<unknown> | (() => unknown), code: CrispErrorCode, message: RegExp): Promise<void> {
  let err: unknown;
  try {
    await (typeof p === 'function' ? p() : p);
  } catch (e) {
    err = e;
  }
  expect(isCrispError(err, code), `expected ${code}, got ${String(err)} (seed ${SEED})`).toBe(true);
  expect((err as Error).message).toMatch(message);
}

describe('resolveQkvNames', () => {
  it('defaults, aliases in any case, and unique dump-style suffixes', () => {
    expect(resolveQkvNames(['v', 'k', 'q', 'o'], 'f')).toEqual({ q: 'q', k: 'k', v: 'v' });
    expect(resolveQkvNames(['Query', 'KEY', 'value'], 'f')).toEqual({ q: 'Query', k: 'KEY', v: 'value' });
    expect(resolveQkvNames(['query_states', 'key_states', 'value_states'], 'f')).toEqual({
      q: 'query_states',
      k: 'key_states',
      v: 'value_states',
    });
    expect(resolveQkvNames(['model.layers.3.attn.q', 'model.layers.3.attn.k', 'model.layers.3.attn.v'], 'f')).toEqual({
      q: 'model.layers.3.attn.q',
      k: 'model.layers.3.attn.k',
      v: 'model.layers.3.attn.v',
    });
    expect(resolveQkvNames(['a', 'b', 'c'], 'f', { q: 'a', k: 'b', v: 'c' })).toEqual({ q: 'a', k: 'b', v: 'c' });
  });
  it('says which names were found when it cannot decide', async () => {
    await expectError(() => resolveQkvNames(['hidden', 'attn_out'], 'dump.st'), 'FORMAT_ERROR', /no q tensor: looked for 'q', 'query'.* found 'hidden', 'attn_out'; pass names/);
    await expectError(() => resolveQkvNames(['l0.q', 'l1.q', 'k', 'v'], 'dump.st'), 'INVALID_ARGUMENT', /several tensors could be q \('l0\.q', 'l1\.q'\)/);
    await expectError(() => resolveQkvNames(['q', 'k', 'v'], 'dump.st', { k: 'keys' }), 'INVALID_ARGUMENT', /no tensor 'keys' \(given for k\); it has 'q', 'k', 'v'/);
  });
});

describe('readQkv', () => {
  it('reads a safetensors dump with prefixed names and a 1nhd layout', async () => {
    const q = randomTensor('f16', [12, 6, 8], rand);
    const k = randomTensor('f16', [12, 3, 8], rand);
    const v = randomTensor('f16', [12, 3, 8], rand);
    const path = join(dir, 'dump.safetensors');
    await writeSafetensors(path, { 'layers.7.xq': q, 'layers.7.xk': k, 'layers.7.xv': v, other: randomTensor('f32', [3], rand) }, {});
    await expectError(readQkv(path, { layout: '1nhd' }), 'SHAPE_MISMATCH', /rank 3/);
    const path4 = join(dir, 'dump4.safetensors');
    await writeSafetensors(path4, { 'layers.7.xq': q, 'layers.7.xk': k, 'layers.7.xv': v }, { layout: '1nhd' });
    const got = await readQkv(path4, { layout: '[1,n,H,d]' });
    expect(got.names).toEqual({ q: 'layers.7.xq', k: 'layers.7.xk', v: 'layers.7.xv' });
    expect(got.layout).toBe('1nhd');
    expect(firstDiff(got.q.data, q.data)).toBe(-1);
    expect(firstDiff(got.k.data, k.data)).toBe(-1);
    expect(firstDiff(got.v.data, v.data)).toBe(-1);
    const asF32 = await readQkv(path4, { layout: '1nhd', dtype: 'f32' });
    expect(asF32.q.dtype).toBe('f32');
  });

  it('reads a directory of .npy files (bf16 as <u2) and lists the files when names are missing', async () => {
    const sub = join(dir, 'npys');
    await mkdir(sub);
    const q = randomTensor('bf16', [10, 4, 4], rand);
    const k = randomTensor('bf16', [10, 1, 4], rand);
    const v = randomTensor('bf16', [10, 1, 4], rand);
    await writeNpy(join(sub, 'query.npy'), q, { layout: 'hnd' });
    await writeNpy(join(sub, 'key.npy'), k, { layout: 'hnd' });
    await expectError(readQkv(sub, { layout: 'hnd', uint16As: 'bf16' }), 'FORMAT_ERROR', /no v tensor.*found 'key', 'query'|no v tensor.*found 'query', 'key'/);
    await writeNpy(join(sub, 'value.npy'), v, { layout: 'hnd' });
    await expectError(readQkv(sub, { layout: 'hnd' }), 'UNSUPPORTED', /uint16As: 'bf16'/);
    const got = await readQkv(sub, { layout: 'hnd', uint16As: 'bf16' });
    expect(got.names).toEqual({ q: 'query', k: 'key', v: 'value' });
    expect(got.q.shape).toEqual([10, 4, 4]);
    expect(firstDiff(got.q.data, q.data)).toBe(-1);
    expect(firstDiff(got.v.data, v.data)).toBe(-1);
  });

  it('refuses q/k/v that disagree (head dim, k vs v, GQA ratio, dtypes)', async () => {
    const cases: [Record<string, ReturnType<typeof randomTensor>>, string, RegExp][] = [
      [{ q: randomTensor('f32', [8, 4, 8], rand), k: randomTensor('f32', [8, 2, 4], rand), v: randomTensor('f32', [8, 2, 4], rand) }, 'SHAPE_MISMATCH', /head dim 8 differs from k's 4/],
      [{ q: randomTensor('f32', [8, 4, 8], rand), k: randomTensor('f32', [8, 2, 8], rand), v: randomTensor('f32', [8, 1, 8], rand) }, 'SHAPE_MISMATCH', /k .* and v .* must have the same shape/],
      [{ q: randomTensor('f32', [8, 3, 8], rand), k: randomTensor('f32', [8, 2, 8], rand), v: randomTensor('f32', [8, 2, 8], rand) }, 'SHAPE_MISMATCH', /H % Hkv == 0/],
      [{ q: randomTensor('f32', [8, 4, 8], rand), k: randomTensor('bf16', [8, 2, 8], rand), v: randomTensor('bf16', [8, 2, 8], rand) }, 'DTYPE_MISMATCH', /pass dtype/],
    ];
    for (const [i, [tensors, code, message]] of cases.entries()) {
      const path = join(dir, `bad-${i}.safetensors`);
      await writeSafetensors(path, tensors);
      await expectError(readQkv(path, { layout: 'nhd' }), code as CrispErrorCode, message);
    }
    await expectError(readQkv(join(dir, 'absent.safetensors'), { layout: 'nhd' }), 'IO_ERROR', /no such file/);
  });
});

describe('layers in tensor names', () => {
  it('splitLayerName finds the layer of the usual spellings, and nothing in names without one', () => {
    expect(splitLayerName('model.layers.12.self_attn.q')).toEqual({ layer: 12, rest: 'model.self_attn.q' });
    expect(splitLayerName('transformer.h.3.attn.k')).toEqual({ layer: 3, rest: 'transformer.attn.k' });
    expect(splitLayerName('layer_07.v')).toEqual({ layer: 7, rest: 'v' });
    expect(splitLayerName('blocks-2/q')).toEqual({ layer: 2, rest: 'q' });
    expect(splitLayerName('layers.0.q')).toEqual({ layer: 0, rest: 'q' });
    for (const plain of ['q', 'query_states', 'model.q_proj', 'head3.q', 'layers.x.q', 'hq.2']) expect(splitLayerName(plain)).toBeUndefined();
  });

  it('resolveQkvLayers groups q/k/v per layer, ascending, by the names without the layer', () => {
    const names = ['model.layers.1.q', 'model.layers.1.k', 'model.layers.1.v', 'model.layers.0.query_states', 'model.layers.0.key_states', 'model.layers.0.value_states', 'meta'];
    expect(resolveQkvLayers(names, 'f')).toEqual([
      { layer: 0, names: { q: 'model.layers.0.query_states', k: 'model.layers.0.key_states', v: 'model.layers.0.value_states' } },
      { layer: 1, names: { q: 'model.layers.1.q', k: 'model.layers.1.k', v: 'model.layers.1.v' } },
    ]);
    expect(resolveQkvLayers(['q', 'k', 'v'], 'f')).toEqual([]);
    const custom = ['l.layers.0.a', 'l.layers.0.b', 'l.layers.0.c'];
    expect(resolveQkvLayers(custom, 'f', { q: 'l.a', k: 'l.b', v: 'l.c' })[0].names).toEqual({ q: 'l.layers.0.a', k: 'l.layers.0.b', v: 'l.layers.0.c' });
  });

  it('a layer without v is a FORMAT_ERROR naming the layer', () => {
    expect(() => resolveQkvLayers(['layers.0.q', 'layers.0.k', 'layers.0.v', 'layers.1.q', 'layers.1.k'], 'dump.safetensors')).toThrow(
      expect.objectContaining({ code: 'FORMAT_ERROR', message: expect.stringMatching(/dump\.safetensors, layer 1, has no v tensor/) }),
    );
  });
});
