#!/usr/bin/env node
// The tsc build (pnpm --filter @crisp/bench build); dist/crisp-bench.mjs is the single-file bundle of the same entry.
import '../dist/cli.js';
