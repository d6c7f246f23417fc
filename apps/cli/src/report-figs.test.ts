import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { BlockRows } from '@crisp/core';
import { describe, expect, it } from 'vitest';
import { blockMasks, headAxis, perHead, scaling, timeBreakdown } from './report-figs.js';
import { readRunJson } from './report-input.js';
import type { RunSummary } from './run-job.js';
import { missedSignalBlocks, signalBlocks, type TruthView } from './truth-blocks.js';

const B = 4;
const Nb = 6;
const head = (head: number, kind: TruthView['heads'][number]['kind'], slashOffsets: number[] = []) => ({
  head,
  kvHead: 0,
  kind,
  expectedRoute: 'vs' as const,
  sinkTarget: 0.8,
  slashOffsets,
  needles: [],
});
const TRUTH: TruthView = {
  heads: [head(0, 'slash', [6]), head(1, 'vertical'), head(2, 'retrieval')],
  needles: [{ id: 0, kvHead: 0, position: 13, length: 4, readers: [2], askers: [[20, 24]], visibleToProxy: true }],
  stripes: [[9]],
};

/** Rows that keep the sink column, the diagonal, and `extra[h]` ([I, J] pairs). */
function rowsOf(extra: [number, number][][]): BlockRows {
  const rowPtr = [0];
  const cols: number[] = [];
  for (let h = 0; h < extra.length; h++) {
    for (let I = 0; I < Nb; I++) {
      const js = new Set([0, I, ...extra[h].filter(([i]) => i === I).map(([, j]) => j)]);
      cols.push(...[...js].sort((a, b) => a - b));
      rowPtr.push(cols.length);
    }
  }
  return { rowPtr: Int32Array.from(rowPtr), cols: Int32Array.from(cols) };
}

describe('ground-truth signal blocks', () => {
  it('lists the sink, the diagonal, the slash line, the stripe and the needle blocks', () => {
    // offset 6 with B = 4: query block I reads key blocks floor((4I - 6) / 4) .. floor((4I - 3) / 4)
    const slash = [[2, 1], [3, 1], [3, 2], [4, 2], [4, 3], [5, 3], [5, 4]];
    const anchors = [...Array(Nb).keys()].flatMap((I) => (I === 0 ? [[0, 0]] : [[I, 0], [I, I]]));
    const key = (x: number[][]) => x.map(([I, J]) => I * Nb + J).sort((a, b) => a - b);
    expect(key(signalBlocks(TRUTH, 0, B, Nb))).toEqual(key([...anchors, ...slash]));
    // stripe token 9 lies in key block 2, read by every query block from 2 on
    expect(key(signalBlocks(TRUTH, 1, B, Nb))).toEqual(key([...anchors, [3, 2], [4, 2], [5, 2]]));
    // needle tokens 13..16 (key blocks 3, 4), asked by rows 20..23 (query block 5)
    expect(key(signalBlocks(TRUTH, 2, B, Nb))).toEqual(key([...anchors, [5, 3], [5, 4]]));
    // without the stripes (an older run JSON) a vertical head has only its anchors
    expect(signalBlocks({ ...TRUTH, stripes: undefined }, 1, B, Nb)).toHaveLength(anchors.length);
  });

  it('marks exactly the signal blocks a constructed plan left out', () => {
    const rows = rowsOf([
      [[2, 1], [3, 2], [4, 2], [4, 3], [5, 3], [4, 1]], // slash head: misses (3,1) and (5,4); (4,1) is noise it kept
      [[3, 2], [5, 2]], // vertical head: misses (4,2)
      [[5, 3]], // needle reader: misses (5,4)
    ]);
    expect(missedSignalBlocks(rows, TRUTH, 0, B, Nb)).toEqual([[3, 1], [5, 4]]);
    expect(missedSignalBlocks(rows, TRUTH, 1, B, Nb)).toEqual([[4, 2]]);
    expect(missedSignalBlocks(rows, TRUTH, 2, B, Nb)).toEqual([[5, 4]]);
    expect(missedSignalBlocks(undefined, TRUTH, 0, B, Nb)).toEqual([]);
  });
});

/** A small run summary as crisp run --json writes it (3 heads, 2 policies). */
function summary(n = 24): RunSummary {
  const heads = [0, 1, 2].map((h) => ({ head: h, kind: TRUTH.heads[h].kind, route: 'vs' as const, score: 0.8, density: 0.5, massRecall: 0.99, proxyRecall: 0.98, outputError: 0.01 }));
  const policy = (name: string) => ({ policy: name, heads, density: 0.5, massRecall: 0.99, outputError: 0.01, timeMs: { median: 10, runs: [10], planMs: 4 }, speedup: 2 });
  return {
    backend: 'reference',
    backendNotes: [],
    input: { source: 'scenario llama-like (seed 1)', profile: 'llama-like', seed: 1, n, heads: 3, kvHeads: 1, headDim: 32, dtype: 'f32' },
    blockSize: B,
    numBlocks: Nb,
    sampleRows: 8,
    phasesMs: { backend: 1, generate: 2, upload: 3, estimate: null, dense: 10, prefill: 20, check: 4, wall: 45 },
    threads: 1,
    checkThreads: 1,
    dense: { timeMs: { median: 20, runs: [20] } },
    policies: [policy('crisp'), policy('flexPrefill')],
    truth: TRUTH,
  };
}

describe('report figures', () => {
  it('draws one missed-block trace per head beside its mask, and the colour key', () => {
    const s = summary();
    const rows = rowsOf([[[2, 1]], [], []]);
    const b = blockMasks({ ...s, policies: [{ ...s.policies[0], rows }] });
    if ('why' in b) throw new Error(b.why);
    const data = b.figs[0].data as { type: string; x?: number[]; y?: number[]; visible: boolean; colorbar?: { ticktext: string[] } }[];
    expect(data.map((t) => t.type)).toEqual(['heatmap', 'scatter', 'heatmap', 'scatter', 'heatmap', 'scatter']);
    expect(data[0].colorbar?.ticktext).toEqual(['skipped', 'selected']);
    const missed0 = missedSignalBlocks(rows, TRUTH, 0, B, Nb);
    expect(missed0).toHaveLength(6); // 7 slash blocks, (2,1) kept
    expect(data[1].x).toEqual(missed0.map(([, J]) => J));
    expect(data[1].y).toEqual(missed0.map(([I]) => I));
    expect(data.map((t) => t.visible)).toEqual([true, true, false, false, false, false]);
    // the picker's head-2 button shows exactly head 2's pair
    const menu = (b.figs[0].layout.updatemenus as { buttons: { label: string; args: [{ visible: boolean[] }] }[] }[])[0];
    expect(menu.buttons[2].args[0].visible).toEqual([false, false, false, false, true, true]);
    expect(menu.buttons[0].label).toMatch(/, 6 missed$/);
  });

  it('says why a section is missing instead of drawing it', () => {
    const s = summary();
    expect(blockMasks(s)).toEqual({ why: expect.stringMatching(/JSON carries no block masks/) });
    const old = { ...s, policies: s.policies.map((p) => ({ ...p, timeMs: { median: 10, runs: [10] } })) } as unknown as RunSummary;
    expect(timeBreakdown(old)).toEqual({ why: expect.stringMatching(/no plan times/) });
    expect(scaling([s])).toEqual({ why: expect.stringMatching(/^one size only \(n=24\)/) });
  });

  it('splits the sparse time into plan and attention', () => {
    const b = timeBreakdown(summary());
    if ('why' in b) throw new Error(b.why);
    const [plan, att] = b.figs[0].data as { y: string[]; x: number[] }[];
    expect(plan.y).toEqual(['crisp', 'flexPrefill', 'dense']);
    expect(plan.x).toEqual([4, 4, 0]);
    expect(att.x).toEqual([6, 6, 20]);
  });

  it('plots density and latency against n in n order', () => {
    const b = scaling([summary(48), summary(24)]);
    if ('why' in b) throw new Error(b.why);
    const lat = b.figs[1].data as { name: string; x: number[]; y: number[] }[];
    expect(lat.map((t) => t.name)).toEqual(['crisp', 'flexPrefill', 'dense']);
    expect(lat[0].x).toEqual([24, 48]);
    expect(lat[2].y).toEqual([20, 20]);
  });

  it('thins and tilts crowded per-head labels', () => {
    expect(headAxis(4, 2)).toEqual({ labels: true, tickangle: 0, tickvals: ['h0', 'h1', 'h2', 'h3'] });
    const wide = headAxis(32, 2);
    expect(wide.labels).toBe(false);
    expect(wide.tickangle).toBe(-45);
    expect(wide.tickvals).toEqual([...Array(16).keys()].map((i) => `h${2 * i}`));
    expect(headAxis(12, 1).tickvals).toHaveLength(12);
    const b = perHead(summary());
    if ('why' in b) throw new Error(b.why);
    // 3 heads x 2 policies = 6 bars: the values stay on the bars
    expect((b.figs[0].data as { textposition: string }[]).map((t) => t.textposition)).toEqual(['outside', 'outside']);
  });
});

describe('run JSON input', () => {
  const dir = mkdtempSync(join(tmpdir(), 'crisp-from-'));
  const file = (name: string, text: string) => {
    const p = join(dir, name);
    writeFileSync(p, text);
    return p;
  };
  it('reads a run back, non-finite numbers included', async () => {
    const s = summary();
    const text = JSON.stringify({ ...s, policies: s.policies.map((p) => ({ ...p, outputError: 'Infinity' })) });
    const back = await readRunJson(file('ok.json', text));
    expect(back.policies[0].outputError).toBe(Number.POSITIVE_INFINITY);
    expect(back.input.n).toBe(24);
  });
  it('names the file and the missing field of anything else', async () => {
    await expect(readRunJson(file('bad.json', '{"backend": '))).rejects.toMatchObject({ code: 'FORMAT_ERROR', message: expect.stringMatching(/bad\.json is not JSON/) });
    const { policies, ...rest } = summary();
    await expect(readRunJson(file('nopol.json', JSON.stringify(rest)))).rejects.toMatchObject({ code: 'FORMAT_ERROR', message: expect.stringMatching(/nopol\.json is not a crisp run --json result: it lacks policies$/) });
    await expect(readRunJson(join(dir, 'absent.json'))).rejects.toMatchObject({ code: 'IO_ERROR', message: expect.stringMatching(/no such file/) });
    expect(policies).toHaveLength(2);
  });
});
