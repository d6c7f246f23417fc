// Test helpers: a seeded PRNG (fresh seed per run, printed on failure), random
// bit-pattern tensors (NaN payloads, infinities and subnormals included, so round trips
// prove exact bits, not just values) and a temporary directory per test file.
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { DType, HostData, HostTensor } from '@crisp/core';
import { afterAll, beforeEach } from 'vitest';
import { mulberry32 } from '@crisp/core';

export const SEED = Number(process.env.CRISP_SEED ?? Math.floor(Math.random() * 2 ** 31));

/** Prints the seed when any test in the calling file fails. */
export function reportSeedOnFailure(file: string): void {
  beforeEach((ctx) => {
    ctx.onTestFailed(() => {
      console.error(`[${file}] seed ${SEED}: rerun with CRISP_SEED=${SEED}`);
    });
  });
}

/** mulberry32, from @crisp/core (one generator for every seeded input). */
export const rng: (seed: number) => () => number = mulberry32;

/** Random bit patterns for a dtype; never all zero. */
export function randomBits(dtype: DType, count: number, rand: () => number): HostData {
  if (dtype === 'f32') {
    const u = new Uint32Array(count);
    for (let i = 0; i < count; i++) u[i] = Math.floor(rand() * 2 ** 32) >>> 0;
    u[0] = 0x7fa00001; // a signalling NaN with a payload: must survive untouched
    return new Float32Array(u.buffer);
  }
  const u = new Uint16Array(count);
  for (let i = 0; i < count; i++) u[i] = Math.floor(rand() * 65536);
  u[0] = dtype === 'bf16' ? 0x7f81 : 0x7c01; // signalling NaN pattern for the type
  return u;
}

export function randomTensor(dtype: DType, shape: number[], rand: () => number): HostTensor {
  const count = shape.reduce((a, b) => a * b, 1);
  return { dtype, shape, data: randomBits(dtype, count, rand) };
}

/** Raw bits of host data as a Uint16/Uint32 view for exact comparisons. */
export function bitsOf(data: HostData): Uint16Array | Uint32Array {
  return data instanceof Float32Array ? new Uint32Array(data.buffer, data.byteOffset, data.length) : data;
}

/** Index of the first differing element, or -1. */
export function firstDiff(a: HostData, b: HostData): number {
  const x = bitsOf(a);
  const y = bitsOf(b);
  if (x.length !== y.length || x.BYTES_PER_ELEMENT !== y.BYTES_PER_ELEMENT) return -2;
  for (let i = 0; i < x.length; i++) if (x[i] !== y[i]) return i;
  return -1;
}

/** A fresh temporary directory for the calling test file, removed afterwards. */
export async function tempDir(prefix: string): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), `crisp-io-${prefix}-`));
  afterAll(async () => {
    await rm(dir, { recursive: true, force: true });
  });
  return dir;
}
