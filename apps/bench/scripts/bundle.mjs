// One ESM file for plain Node: `node apps/bench/dist/crisp-bench.mjs` runs the bench with no
// TypeScript build of the workspace (packages are bundled from their sources). The native
// modules (Dawn's `webgpu`, `koffi` for CUDA) and onnxruntime-web (it finds its .wasm beside
// its own files) stay external and load from node_modules.
import { build } from 'esbuild';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const entry = process.argv[2] ?? join(here, '..', 'src', 'cli.ts');
const outfile = process.argv[3] ?? join(here, '..', 'dist', 'crisp-bench.mjs');

await build({
  entryPoints: [entry],
  outfile,
  bundle: true,
  platform: 'node',
  format: 'esm',
  target: 'node20',
  conditions: ['@crisp/source'],
  external: ['webgpu', 'koffi', 'onnxruntime-web'],
  // CommonJS dependencies call require(); give the ESM bundle one.
  banner: { js: "import { createRequire as __crispRequire } from 'node:module'; const require = __crispRequire(import.meta.url);" },
  logLevel: 'warning',
});
