// Runs every example's main() and checks what it returns and prints; builds the browser page.
import { mkdtemp, readdir, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { DirectionScores } from '@crisp/core';
import { build } from 'vite';
import { describe, expect, it } from 'vitest';
import { main as chunkedPrefill } from './chunked-prefill.js';
import { firstBlockRouter, main as customRouter } from './custom-router.js';
import { keepTopBlocks, main as customSelector } from './custom-selector.js';
import { main as readADump } from './read-a-dump.js';
import { main as referenceEndToEnd } from './reference-end-to-end.js';
import { main as varlenBatch } from './varlen-batch.js';

function collect(): { lines: string[]; log: (line: string) => void } {
  const lines: string[] = [];
  return { lines, log: (line) => lines.push(line) };
}

/** The k best indices (ties toward the lower one) ∪ {0}, ascending: the selector's rule, restated. */
function topWithZero(scores: readonly number[], k: number): number[] {
  const best = scores
    .map((s, i) => [s, i] as const)
    .sort((a, b) => b[0] - a[0] || a[1] - b[1])
    .slice(0, k)
    .map(([, i]) => i);
  return [...new Set([0, ...best])].sort((a, b) => a - b);
}

describe('examples', () => {
  it('(a) reference end to end: one route per head, a sparse density, a finite output', async () => {
    const { lines, log } = collect();
    const r = await referenceEndToEnd(log);
    expect(r.routes).toHaveLength(r.heads);
    expect(r.heads).toBe(8);
    expect(new Set(r.routes)).toEqual(new Set(['vs', 'pe'])); // the llama-like layer has a diffuse head
    expect(r.density).toBeGreaterThan(0);
    expect(r.density).toBeLessThan(1);
    expect(r.outputShape).toEqual([2048, 8, 32]);
    expect(r.finiteOutput).toBe(true);
    expect(lines[0]).toMatch(new RegExp(`^routes: ${r.routes.join(' ')} \\(C_struct`));
    expect(lines[1]).toMatch(new RegExp(`^density: ${r.density.toFixed(3)} `));
  });

  it('(b) custom router: the plan routes each head as the first-block rule decides', async () => {
    const { lines, log } = collect();
    const r = await customRouter(log);
    expect(r.routerName).toBe('first-block(>=0.8)');
    expect(r.routes).toHaveLength(r.heads);
    expect(r.routes).toEqual(r.firstBlockShare.map((s) => (s >= r.minShare ? 'vs' : 'pe')));
    expect(r.routes).toContain('vs');
    expect(r.routes).toContain('pe');
    expect(r.density).toBeGreaterThan(0);
    expect(r.density).toBeLessThanOrEqual(1);
    expect(lines[1]).toContain(r.routes.join(' '));
  });

  it('(b) the router alone: scores are the first key block of each head', () => {
    const stats = { heads: 2, numBlocks: 3, verticalBlocks: Float64Array.of(0.9, 0.05, 0.05, 0.2, 0.3, 0.5) };
    const d = firstBlockRouter(0.5).route(stats as never);
    expect(d.routes).toEqual(['vs', 'pe']);
    expect(Array.from(d.scores)).toEqual([0.9, 0.2]);
    expect(d.threshold).toBe(0.5);
  });

  it('(c) custom selector: each direction keeps its k best blocks and block 0', async () => {
    const { lines, log } = collect();
    const r = await customSelector(log);
    expect(r.numBlocks).toBe(32);
    expect(r.vertical).toHaveLength(4);
    for (let h = 0; h < r.vertical.length; h++) {
      expect(r.vertical[h]).toEqual(topWithZero(r.verticalScores[h], r.k));
      expect(r.slash[h]).toEqual(topWithZero(r.slashScores[h], r.k));
      for (const list of [r.vertical[h], r.slash[h]]) {
        expect(list.length).toBeGreaterThanOrEqual(r.k);
        expect(list.length).toBeLessThanOrEqual(r.k + 1);
      }
    }
    expect(r.density).toBeGreaterThan(0);
    expect(r.density).toBeLessThan(0.5); // about 2(k + 1) of 32 diagonals per head
    expect(lines).toHaveLength(5);
  });

  it('(c) the selector alone: ties go to the lower index', () => {
    const input = (scores: number[]) => ({ blockScores: Float64Array.from(scores) }) as DirectionScores;
    expect(Array.from(keepTopBlocks(2).select(input([0.1, 0.5, 0.5, 0.2])))).toEqual([0, 1, 2]);
    expect(Array.from(keepTopBlocks(1).select(input([0.1, 0.2, 0.5, 0.5])))).toEqual([0, 2]);
    expect(Array.from(keepTopBlocks(2).select(input([0.9, 0.1, 0.3, 0.2])))).toEqual([0, 2]);
  });

  it('(d) reading a dump: the file round trip is bit-exact, and it runs', async () => {
    const { lines, log } = collect();
    const r = await readADump(log);
    for (const name of ['q', 'k', 'v'] as const) {
      expect(r.read[name].dtype).toBe('bf16');
      expect(r.read[name].shape).toEqual(r.written[name].shape);
      expect(r.read[name].data).toEqual(r.written[name].data);
    }
    const dataBytes = (2048 * 4 * 32 + 2 * 2048 * 2 * 32) * 2;
    expect(r.fileBytes).toBeGreaterThan(dataBytes + 8); // the 8-byte length and a JSON header
    expect(r.fileBytes).toBeLessThan(dataBytes + 4096);
    expect(r.routes).toHaveLength(r.heads);
    expect(r.density).toBeGreaterThan(0);
    expect(r.density).toBeLessThanOrEqual(1);
    expect(r.outputShape).toEqual([2048, 4, 32]);
    expect(lines[0]).toContain(`${r.fileBytes} bytes`);
  });

  it('(e) a ragged batch: one call, each request planned on its own, rows equal to each request alone', async () => {
    const { lines, log } = collect();
    const r = await varlenBatch(log);
    expect(r.cuSeqlens).toEqual([0, 2048, 2348, 3884]);
    expect(r.plans[1]).toBe('dense (min-length)');
    expect(r.plans[0]).toMatch(/^((vs|pe) ){7}(vs|pe)$/);
    expect(r.plans[2]).toMatch(/^((vs|pe) ){7}(vs|pe)$/);
    expect(r.densities[1]).toBe(1);
    expect(r.densities[0]).toBeLessThan(1);
    expect(r.maxDiffFromAlone).toBe(0);
    expect(r.outputShape).toEqual([3884, 8, 32]);
    expect(lines).toHaveLength(4);
  });

  it('(f) chunked prefill: a plan per chunk over all keys so far, LSE per row, dense chunks equal to one dense prefill', async () => {
    const { lines, log } = collect();
    const r = await chunkedPrefill(log);
    expect(r.chunks.map((c) => [c.queries, c.keys])).toEqual([[700, 700], [800, 1500], [548, 2048]]);
    expect(r.chunks[0].denseReason).toBe('min-length'); // 700 keys: too short to skip anything
    expect(r.chunks[2].denseReason).toBeUndefined(); // 2048 keys: a sparse plan for 548 queries
    expect(r.chunks[2].density).toBeGreaterThan(0);
    expect(r.chunks[2].density).toBeLessThan(1);
    expect(r.chunks.map((c) => c.lseShape)).toEqual([[8, 700], [8, 800], [8, 548]]);
    expect(r.denseChunksVsWhole).toBe(0);
    expect(lines).toHaveLength(4);
  });

  it('(g) the browser page builds with vite into a page and a script that uses navigator.gpu', async () => {
    const outDir = await mkdtemp(join(tmpdir(), 'crisp-example-page-'));
    try {
      await build({ root: fileURLToPath(new URL('../browser/', import.meta.url)), logLevel: 'silent', build: { outDir, emptyOutDir: true } });
      const html = await readFile(join(outDir, 'index.html'), 'utf8');
      const scripts = (await readdir(join(outDir, 'assets'))).filter((f) => f.endsWith('.js'));
      expect(scripts).toHaveLength(1);
      expect(html).toContain(`assets/${scripts[0]}`);
      const js = await readFile(join(outDir, 'assets', scripts[0]), 'utf8');
      expect(js).toContain('navigator.gpu');
      expect(js).toContain('requestAdapter');
    } finally {
      await rm(outDir, { recursive: true, force: true });
    }
  });
});
