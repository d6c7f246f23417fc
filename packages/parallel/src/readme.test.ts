import { readFileSync } from 'node:fs';
import { expect, it } from 'vitest';
import { parallelExample } from '../test/readme-example.js';

it('the README example is test/readme-example.ts verbatim, and it runs: the sharded output equals one backend\'s', async () => {
  const readme = readFileSync(new URL('../README.md', import.meta.url), 'utf8');
  const file = readFileSync(new URL('../test/readme-example.ts', import.meta.url), 'utf8');
  const block = readme.split('<!-- example: test/readme-example.ts -->')[1]?.match(/```ts\n([\s\S]*?)```/)?.[1];
  expect(block).toBe(file);
  const seed = 1 + Math.floor(Math.random() * 1000);
  const r = await parallelExample(seed);
  expect(r.singlePlan.denseReason, `seed ${seed}`).toBeUndefined();
  for (const p of r.plans) expect(p.mask).toEqual(r.singlePlan.mask);
  expect(Array.from(r.output.data), `seed ${seed}`).toEqual(Array.from(r.single.data));
}, 60_000);
