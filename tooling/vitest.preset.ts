// Shared vitest settings: resolve workspace packages to their TypeScript sources
// (the "@crisp/source" export condition), so tests never run against a stale build.
import { defineConfig } from 'vitest/config';

export const crispVitest = defineConfig({
  resolve: { conditions: ['@crisp/source'] },
  ssr: { resolve: { conditions: ['@crisp/source'] } },
  test: {
    include: ['src/**/*.test.ts', 'test/**/*.test.ts'],
    testTimeout: 120_000,
    hookTimeout: 120_000,
    pool: 'forks',
    passWithNoTests: true,
  },
});
