import { readFileSync } from 'node:fs';
import { toFloat32 } from '@crisp/core';
import { expect, it } from 'vitest';
import { referenceExample } from '../test/readme-example.js';

it('the README example is test/readme-example.ts verbatim, and it runs', async () => {
  const readme = readFileSync(new URL('../README.md', import.meta.url), 'utf8');
  const file = readFileSync(new URL('../test/readme-example.ts', import.meta.url), 'utf8');
  const block = readme.split('<!-- example: test/readme-example.ts -->')[1]?.match(/```ts\n([\s\S]*?)```/)?.[1];
  expect(block).toBe(file);
  const seed = 1 + Math.floor(Math.random() * 1000);
  const r = await referenceExample(seed);
  expect(r.cStruct.length).toBe(4);
  // a mask of 2 blocks per row out of up to 4 loses mass, so both numbers are strictly inside (0, 1)
  expect(r.recall.overall, `seed ${seed}`).toBeGreaterThan(0.2);
  expect(r.recall.overall, `seed ${seed}`).toBeLessThan(1);
  expect(r.error.overall, `seed ${seed}`).toBeGreaterThan(0);
  // the exact last row matches the backend's sparse output for that row (f32 rounding)
  const got = toFloat32(r.sparseOut).subarray(255 * 4 * 64);
  expect(r.lastRow.output.length).toBe(4 * 64);
  r.lastRow.output.forEach((x, i) => {
    expect(got[i]).toBe(Math.fround(x));
  });
});
