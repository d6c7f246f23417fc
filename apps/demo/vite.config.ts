// Workspace packages resolve to their TypeScript sources (the "@crisp/source" export
// condition), so `dev` and `build` need no prior build of the libraries.
import { defaultClientConditions, defineConfig } from 'vite';

export default defineConfig({
  resolve: { conditions: ['@crisp/source', ...defaultClientConditions] },
  build: { target: 'es2022', outDir: 'dist', emptyOutDir: true },
  server: { host: 'localhost' },
});
