// Interop with files written by Python's numpy and safetensors libraries (fixtures made by
// fixtures-src/make_python_fixture.py), and the reverse direction: a committed file from
// our writer that the script loads with safetensors.torch and checks bit for bit.
import { existsSync } from 'node:fs';
import { readFile, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { type DType, type HostData, type HostTensor, f32ToBf16Bits, f32ToF16Bits, isCrispError } from '@crisp/core';
import { describe, expect, it } from 'vitest';
import { firstDiff, tempDir } from '../test/helpers.js';
import { type Layout, openTensorFile, readQkv, readTensor, writeSafetensors } from './index.js';

const FIXTURES = join(dirname(fileURLToPath(import.meta.url)), '__fixtures__');
const PY_FIXTURE = join(FIXTURES, 'python-written.safetensors');
const TS_FIXTURE = join(FIXTURES, 'ts-written.safetensors');
const MAKE_CMD =
  'python3 packages/io/fixtures-src/make_python_fixture.py packages/io/src/__fixtures__  (from the repo root, on a machine with numpy, torch and safetensors)';
const [N, H, HKV, D] = [37, 4, 2, 8];
const dir = await tempDir('interop');

/** The fixture formula in f32: x[t][i] = fround(sin((i + 1000 t) · 0.37) · 3), canonical [n, H, d]. */
function formulaF32(t: number, heads: number): Float32Array {
  const out = new Float32Array(N * heads * D);
  for (let i = 0; i < out.length; i++) out[i] = Math.sin((i + 1000 * t) * 0.37) * 3;
  return out;
}

/** Canonical tensor in a dtype, each f32 value rounded once with core's RNE conversions. */
function formula(t: number, heads: number, dtype: DType): HostTensor {
  const f32 = formulaF32(t, heads);
  const data: HostData =
    dtype === 'f32' ? f32 : Uint16Array.from(f32, (x) => (dtype === 'bf16' ? f32ToBf16Bits(x) : f32ToF16Bits(x)));
  return { dtype, shape: [N, heads, D], data };
}

/** Every tensor the Python script writes: name -> expected canonical tensor and file layout. */
function expectedTensors(): Map<string, { tensor: HostTensor; layout: Layout }> {
  const out = new Map<string, { tensor: HostTensor; layout: Layout }>();
  for (const dtype of ['f32', 'f16', 'bf16'] as const) {
    out.set(`q_${dtype}`, { tensor: formula(0, H, dtype), layout: 'nhd' });
    out.set(`k_${dtype}`, { tensor: formula(1, HKV, dtype), layout: 'nhd' });
    out.set(`v_${dtype}`, { tensor: formula(2, HKV, dtype), layout: 'nhd' });
  }
  out.set('q', out.get('q_bf16')!);
  out.set('k', out.get('k_bf16')!);
  out.set('v', out.get('v_bf16')!);
  out.set('q_hnd_f16', { tensor: formula(0, H, 'f16'), layout: 'hnd' });
  out.set('k_hnd_f32', { tensor: formula(1, HKV, 'f32'), layout: 'hnd' });
  out.set('q_1nhd_bf16', { tensor: formula(0, H, 'bf16'), layout: '1nhd' });
  return out;
}

function hexBits(data: Uint8Array, bytesPer: number): string {
  let s = '';
  for (let i = 0; i < data.length; i += bytesPer) {
    const v = bytesPer === 4 ? data[i] | (data[i + 1] << 8) | (data[i + 2] << 16) | (data[i + 3] << 24) : data[i] | (data[i + 1] << 8);
    s += (v >>> 0).toString(16).padStart(bytesPer * 2, '0');
  }
  return s;
}

describe('numpy-written .npy fixtures', () => {
  const cases: [string, Layout, DType, { uint16As?: 'bf16' }][] = [
    ['numpy-f32.npy', 'nhd', 'f32', {}],
    ['numpy-1nhd-f32.npy', '1nhd', 'f32', {}],
    ['numpy-f16-hnd.npy', 'hnd', 'f16', {}],
    ['numpy-f16-v2.npy', 'nhd', 'f16', {}],
    ['numpy-bf16-u2.npy', 'nhd', 'bf16', { uint16As: 'bf16' }],
  ];
  for (const [name, layout, dtype, opts] of cases) {
    it(`${name} reads back bit-exactly as ${dtype} ${layout}`, async () => {
      await using file = await openTensorFile(join(FIXTURES, name), opts);
      expect(file.format).toBe('npy');
      const t = await readTensor(file, undefined, { layout, chunkRows: 5 });
      expect(t.dtype).toBe(dtype);
      expect(t.shape).toEqual([N, H, D]);
      expect(firstDiff(t.data, formula(0, H, dtype).data)).toBe(-1);
    });
  }

  const refused: [string, string, RegExp][] = [
    ['numpy-fortran.npy', 'UNSUPPORTED', /Fortran.*np\.ascontiguousarray/],
    ['numpy-f64.npy', 'UNSUPPORTED', /float64 \('<f8'\).*astype\(np\.float32\)/],
    ['numpy-i8.npy', 'UNSUPPORTED', /int8 \('\|i1'\)/],
    ['numpy-bigendian.npy', 'UNSUPPORTED', /big-endian float32/],
    ['numpy-bf16-u2.npy', 'UNSUPPORTED', /uint16 \('<u2'\).*uint16As: 'bf16'/],
  ];
  for (const [name, code, message] of refused) {
    it(`${name} is refused with ${code} and a message saying what to do`, async () => {
      const err = await openTensorFile(join(FIXTURES, name)).then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(isCrispError(err, code as never), String(err)).toBe(true);
      expect((err as Error).message).toMatch(message);
    });
  }
});

describe('Python safetensors interop', () => {
  it('python-written.safetensors reads back bit-exactly (bytes vs Python, values vs core RNE)', async () => {
    if (!existsSync(PY_FIXTURE)) {
      throw new Error(`missing ${PY_FIXTURE}: generate it with\n  ${MAKE_CMD}\nand commit it`);
    }
    await using file = await openTensorFile(PY_FIXTURE);
    expect(file.format).toBe('safetensors');
    const expected = expectedTensors();
    expect(file.tensors.map((t) => t.name).sort()).toEqual([...expected.keys()].sort());
    const raw = await readFile(PY_FIXTURE);
    for (const info of file.tensors) {
      const want = expected.get(info.name)!;
      expect(info.dtype, info.name).toBe(want.tensor.dtype);
      // 1. The reader's byte range holds exactly the bits Python says it wrote.
      const bytes = raw.subarray(info.byteOffset, info.byteOffset + info.byteLength);
      expect(hexBits(bytes, info.dtype === 'f32' ? 4 : 2) === file.metadata[`bits.${info.name}`], `${info.name} raw bits`).toBe(true);
      // 2. Read through the layout, the values equal the formula rounded by core's RNE.
      const t = await readTensor(file, info.name, { layout: want.layout, chunkRows: 6 });
      expect(t.shape, info.name).toEqual(want.tensor.shape);
      expect(firstDiff(t.data, want.tensor.data), `${info.name} first differing element`).toBe(-1);
    }
    const qkv = await readQkv(PY_FIXTURE, { layout: 'nhd' });
    expect(qkv.names).toEqual({ q: 'q', k: 'k', v: 'v' });
    expect(firstDiff(qkv.k.data, formula(1, HKV, 'bf16').data)).toBe(-1);
  });

  it('ts-written.safetensors (checked by the Python script) is what the writer produces today', async () => {
    const tensors: Record<string, HostTensor> = {};
    for (const [name, { tensor }] of expectedTensors()) if (!name.includes('_hnd') && !name.includes('_1nhd')) tensors[name] = tensor;
    const fresh = join(dir, 'ts-written.safetensors');
    await writeSafetensors(fresh, tensors, { layout: 'nhd', metadata: { writer: '@crisp/io writeSafetensors' } });
    if (process.env.CRISP_IO_REGEN === '1') await writeFile(TS_FIXTURE, await readFile(fresh));
    if (!existsSync(TS_FIXTURE)) {
      throw new Error(`missing ${TS_FIXTURE}: regenerate with CRISP_IO_REGEN=1 pnpm --filter @crisp/io test`);
    }
    expect(
      Buffer.compare(await readFile(fresh), await readFile(TS_FIXTURE)),
      'the writer changed: regenerate with CRISP_IO_REGEN=1 pnpm --filter @crisp/io test, then rerun the Python script',
    ).toBe(0);
  });
});
