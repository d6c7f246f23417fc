/**
 * The parallel suite on the float64 reference at n = 2k: its settings, and its numbers against
 * the real thing: parallelPrefill run with createLocalGroup on the same scenario, whose traffic
 * counters (K/V and plan-phase bytes per rank) and plan must equal the suite's rows, and whose
 * mask, expanded to rows, gives the same work per rank.
 */
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { expandToRows } from '@crisp/core';
import { createLocalGroup, ownedBlocks, parallelPrefill, shardTensor, zigzagLayout } from '@crisp/parallel';
import { crisp } from '@crisp/presets';
import { createReferenceBackend } from '@crisp/reference';
import { afterAll, describe, expect, it } from 'vitest';
import { DEFAULT_SUITES } from './config.js';
import { hostInputs, makeScenario } from './inputs.js';
import { main, resolveConfig } from './main.js';
import { mergeResults } from './merge.js';
import { markdown, suiteCommands } from './report.js';
import type { BenchResult } from './result.js';
import { NOT_TIMED } from './suites/parallel.js';

const root = mkdtempSync(join(tmpdir(), 'crisp-bench-parallel-'));
afterAll(() => rmSync(root, { recursive: true, force: true }));

describe('the parallel suite settings', () => {
  it('is asked for by name, not in the default set, and reads its flags', () => {
    expect(DEFAULT_SUITES).not.toContain('parallel');
    const full = resolveConfig({}).parallel;
    expect(full).toMatchObject({ referenceSizes: [16384, 32768], ranks: [2, 4, 8], shape: { heads: 32, kvHeads: 8, headDim: 128 }, presets: ['crisp'] });
    expect(full.sizes[0]).toBe(32768);
    const c = resolveConfig({ suites: 'parallel', parallelSizes: '4k,8k', parallelRanks: '2,3', parallelShape: '8,2,64', presets: 'dense,crisp' });
    expect(c.suites).toEqual(['parallel']);
    expect(c.parallel).toEqual({ sizes: [4096, 8192], referenceSizes: [4096, 8192], ranks: [2, 3], shape: { heads: 8, kvHeads: 2, headDim: 64 }, presets: ['dense', 'crisp'] });
    expect(() => resolveConfig({ parallelRanks: '1,2' })).toThrow(/integers >= 2/);
  });
});

describe('crisp-bench --suites parallel on the reference', () => {
  it("gives each rank's K/V and plan bytes and its work as parallelPrefill does on the same inputs", async () => {
    // (8 heads: the llama-like scenario then routes a head to PE, so the query block means are gathered too)
    const [n, H, Hkv, d] = [2048, 8, 2, 32];
    const out = join(root, 'run');
    const args = ['node', 'crisp-bench', '--backends', 'reference', '--suites', 'parallel', '--parallel-sizes', String(n), '--parallel-ranks', '2,3'];
    expect(await main([...args, '--parallel-shape', `${H},${Hkv},${d}`, '--quiet', '--out', out])).toBe(0);
    const r = JSON.parse(readFileSync(join(out, 'bench.json'), 'utf8')) as BenchResult;
    const p = r.suites.parallel!;
    expect(p.notes).toContain(NOT_TIMED);
    expect(p.skipped).toEqual([]);
    expect(p.rows.map((x) => [x.backend, x.preset, x.n, x.ranks, x.dtype])).toEqual([
      ['reference', 'crisp', n, 2, 'f32'],
      ['reference', 'crisp', n, 3, 'f32'],
    ]);
    const sc = makeScenario('llama-like', n, { heads: H, kvHeads: Hkv, headDim: d }, r.config.seed);
    const { q, k, v } = hostInputs(sc);
    for (const row of p.rows) {
      const layout = zigzagLayout(n, row.ranks, 128);
      const comms = createLocalGroup(row.ranks);
      const ranks = await Promise.all(
        comms.map((comm, rank) => {
          const shard = { q: shardTensor(layout, rank, q), k: shardTensor(layout, rank, k), v: shardTensor(layout, rank, v) };
          return parallelPrefill(comm, createReferenceBackend(), layout, shard, crisp);
        }),
      );
      const plan = ranks[0].plan;
      expect(plan.denseReason).toBeUndefined();
      expect(plan.overallDensity).toBe(row.density);
      expect(plan.routing!.routes.filter((x) => x === 'pe').length).toBe(row.peHeads);
      expect(row.peHeads).toBeGreaterThan(0);
      expect(row.planBytes.parts.queryMeans).toBeGreaterThan(0);
      expect(ranks.map((x) => x.traffic.kvBytesReceived)).toEqual(row.kvBytes.perRank);
      expect(ranks.map((x) => x.traffic.planBytesReceived)).toEqual(row.planBytes.perRank);
      expect(ranks[0].traffic.denseRingBytes).toBe(row.denseRingBytes);
      expect(row.kvBytes.total).toBeLessThan(row.causalDenseBytes);
      expect(row.causalDenseBytes).toBeLessThan(row.denseRingBytes);
      // work: the selected blocks of each rank's query blocks, from the expanded mask
      const rows = expandToRows(plan.mask!);
      const work = Array.from({ length: row.ranks }, (_, rank) => {
        let c = 0;
        for (const I of ownedBlocks(layout, rank)) for (let h = 0; h < H; h++) c += rows.rowPtr[h * layout.numBlocks + I + 1] - rows.rowPtr[h * layout.numBlocks + I];
        return c;
      });
      expect(work).toEqual(row.work.perRank);
      expect(row.work.imbalance).toBeCloseTo(Math.max(...work) / (work.reduce((a, x) => a + x, 0) / work.length), 12);
    }
    const md = readFileSync(join(out, 'bench.md'), 'utf8');
    expect(md).toContain('## Context-parallel prefill: traffic and load per rank');
    expect(md).toContain(NOT_TIMED);

    // --merge: a later command's sizes join the rows, one that measures a size again replaces its rows
    const later = (command: string, size: number): BenchResult => {
      const x = structuredClone(r) as BenchResult & { command: string; startedAt: string };
      Object.assign(x, { command, startedAt: command });
      for (const row of x.suites.parallel!.rows) Object.assign(row, { n: size, run: undefined });
      return x;
    };
    const m = mergeResults(mergeResults(structuredClone(r), later('second', 4096), ['reference']), later('third', n), ['reference']);
    expect(m.suites.parallel!.rows.map((x) => [x.n, x.ranks])).toEqual([[4096, 2], [4096, 3], [n, 2], [n, 3]]);
    expect(suiteCommands(m, 'parallel')).toEqual(['second', 'third']);
    expect(markdown(m)).toContain('Reproduce: `second`, then `third`');
  });
});
