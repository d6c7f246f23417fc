// The README's Node example run as pasted (its imports by the published names), on whatever
// adapter Dawn finds, its printed output against @crisp/reference's dense attention on the same
// inputs (drawn with a seeded Math.random, then drawn again in the same order).
import { fileURLToPath } from 'node:url';
import { hostTensor, mulberry32, toFloat32 } from '@crisp/core';
import { createReferenceBackend } from '@crisp/reference';
import { afterEach, expect, it, vi } from 'vitest';
import { readmeBlock, runBlock } from '../../../tooling/readme-snippet.js';
import { webgpuAvailability } from './node.js';

const avail = await webgpuAvailability();
if (!avail.available) console.log(`README example skipped: ${avail.reason}`);

afterEach(() => {
  vi.restoreAllMocks();
});

it.skipIf(!avail.available)('Example (Node): the printed output values are dense attention as the reference computes it', async () => {
  const seed = 1 + Math.floor(Math.random() * 1e6);
  const logs: unknown[][] = [];
  vi.spyOn(console, 'log').mockImplementation((...args: unknown[]) => {
    logs.push(args);
  });
  vi.spyOn(Math, 'random').mockImplementation(mulberry32(seed));
  const code = readmeBlock(fileURLToPath(new URL('../README.md', import.meta.url)), 'Example (Node)');
  const { n, H, Hkv, d } = (await runBlock(code, { resolveDir: fileURLToPath(new URL('.', import.meta.url)), returns: ['n', 'H', 'Hkv', 'd'] })) as Record<string, number>;
  vi.restoreAllMocks();
  const next = mulberry32(seed);
  const rand = (len: number) => Array.from({ length: len }, () => next() * 2 - 1);
  const ref = createReferenceBackend();
  const q = ref.upload(hostTensor('f16', [n, H, d], rand(n * H * d)));
  const k = ref.upload(hostTensor('f16', [n, Hkv, d], rand(n * Hkv * d)));
  const v = ref.upload(hostTensor('f16', [n, Hkv, d], rand(n * Hkv * d)));
  const want = toFloat32(await ref.download((await ref.denseAttention(q, k, v)).output)).slice(0, 4);
  ref.dispose();
  expect(logs).toHaveLength(1);
  const got = logs[0][0] as Float32Array;
  expect(got).toBeInstanceOf(Float32Array);
  expect(got).toHaveLength(4);
  for (let i = 0; i < 4; i++) expect(Math.abs(got[i] - want[i]), `seed ${seed}, value ${i}`).toBeLessThanOrEqual(2 ** -10 * Math.max(1, Math.abs(want[i])));
});
