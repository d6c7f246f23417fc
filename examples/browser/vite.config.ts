// Workspace packages resolve to their TypeScript sources (the "@crisp/source" export
// condition), so the page builds with no prior build of the libraries.
import { defaultClientConditions, defineConfig } from 'vite';

export default defineConfig({
  resolve: { conditions: ['@crisp/source', ...defaultClientConditions] },
  build: { target: 'es2022', outDir: 'dist', emptyOutDir: true },
});
