// Shared vitest settings: resolve workspace packages to their TypeScript sources
// (the "@crisp/source" export condition), so tests never run against a stale build.
import { defineConfig } from 'vitest/config';

export const crispVitest = defineConfig({
  resolve: { conditions: ['@crisp/source'] },
  ssr: { resolve: { conditions: ['@crisp/source'] } },
  test: {
    include: ['src/**/*.test.ts', 'test/**/*.test.ts'],
    // Hang guards, not speed checks: CI runs every package's suite at once on 2 cores, where
    // a SwiftShader test that takes 8 s alone has taken 88 s (its first shader compiles).
    testTimeout: 300_000,
    hookTimeout: 300_000,
    pool: 'forks',
    passWithNoTests: true,
  },
});
