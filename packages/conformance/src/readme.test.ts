import { readFileSync } from 'node:fs';
import { createReferenceBackend } from '@crisp/reference';
import { expect, it } from 'vitest';
import { checkBackend } from '../test/readme-example.js';

it('the README example is test/readme-example.ts verbatim, and it runs', async () => {
  const readme = readFileSync(new URL('../README.md', import.meta.url), 'utf8');
  const file = readFileSync(new URL('../test/readme-example.ts', import.meta.url), 'utf8');
  const block = readme.split('<!-- example: test/readme-example.ts -->')[1]?.match(/```ts\n([\s\S]*?)```/)?.[1];
  expect(block).toBe(file);
  const report = await checkBackend(() => createReferenceBackend());
  expect(report.passed).toBe(true);
  expect(report.counts).toEqual({ passed: 7, failed: 0, skipped: 1 });
  expect(report.results.find((r) => r.skipped)?.name).toBe('sparseAttention/vs/n200-h2kv2-d64-b64/bf16');
});
