import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { defaultConfig } from './config.js';
import { mergeResults, readResult, withLiveRuns } from './merge.js';
import { headline, markdown, matchedDensityMarkdown, matchedErrorMarkdown, suiteCommands } from './report.js';
import type { BenchResult } from './result.js';
import { floorSummary } from './suites/floors.js';
import type { PeerRow } from './peers.js';
import type { LatencyRow } from './suites/latency.js';
import type { ParityRow } from './suites/parity.js';

const lat = (backend: string, preset: string, n: number, median: number, planMs: number, density: number): LatencyRow => ({
  backend,
  preset,
  n,
  dtype: 'bf16',
  shape: { heads: 32, kvHeads: 8, headDim: 128 },
  ms: { median, min: median * 0.9, max: median * 1.2, runs: 3 },
  planMs,
  density,
  input: 'test fill',
});

function result(command: string, startedAt: string, rows: LatencyRow[], peers: { n: number; peer: string; median: number }[] = []): BenchResult {
  return {
    schema: 'crisp-bench/1',
    command,
    cwd: '/repo',
    startedAt,
    machine: {
      hostname: 'h',
      slug: 'h200',
      os: 'Linux',
      cpu: { model: 'Xeon', cores: 16 },
      memoryGiB: 128,
      gpus: [{ name: 'NVIDIA H200', driver: '580', memory: '143771 MiB' }],
      node: 'v20',
      versions: {},
    },
    config: defaultConfig('full'),
    backends: [...new Set(rows.map((r) => r.backend))].map((name) => ({ name, available: true })),
    suites: {
      latency: {
        rows,
        skipped: [],
        peers: { rows: peers.map((p) => ({ backend: 'cuda', peer: p.peer, n: p.n, ms: { median: p.median, min: p.median, max: p.median, runs: 3 } })), notes: [] },
      },
    },
  };
}

describe('headline.md', () => {
  it("sets FlexPrefill's own code beside the dense peers where the parity suite ran on the latency suite's layer", () => {
    const synth = (row: LatencyRow): LatencyRow => ({ ...row, input: '@crisp/synth llama-like (seed 7), generated on 15 host threads' });
    const r = result(
      'node apps/bench/dist/crisp-bench.mjs --backends cuda --suites latency,parity',
      '2026-12-06T05:00:00.000Z',
      [32768, 131072].flatMap((n) => [synth(lat('cuda', 'dense', n, n / 1000, 0, 1)), synth(lat('cuda', 'crisp', n, n / 8000, 0.5, 0.08))]),
      [{ n: 131072, peer: 'torch-sdpa-flash', median: 430 }],
    );
    const spread = (median: number) => ({ median, min: median * 0.95, max: median * 1.1, runs: 3 });
    const parity = (n: number, seed: number, theirs: number, theirsRelErr: number): ParityRow => ({
      backend: 'cuda',
      profile: 'llama-like',
      n,
      seed,
      numBlocks: n / 128,
      oursMs: spread(theirs / 3),
      theirsMs: spread(theirs),
      oursRelErr: theirsRelErr,
      theirsRelErr,
      oursDensity: 0.034,
      theirsDensity: 0.035,
      oursPeHeads: 0,
      theirsPeHeads: 0,
      meanAbsDensityDiff: 0.001,
      heads: [],
      others: [{ preset: 'crisp', ms: spread(20), density: 0.079, relErr: 0.004 }],
    });
    const withParity: BenchResult = {
      ...r,
      suites: {
        ...r.suites,
        parity: {
          shape: { heads: 32, kvHeads: 8, headDim: 128 },
          params: { gamma: 0.95, tau: 0.1, minBudget: 1024, blockSize: 128 },
          sampledRows: 64,
          // seed 1 is another layer: not the headline's
          rows: [parity(131072, 7, 35, 0.0781), parity(32768, 1, 9, 0.05)],
          skipped: [],
          notes: [],
        },
      },
    };
    const lines = headline(withParity, 'apps/bench/results/nvidia-h100-synth').split('\n');
    expect(lines.find((l) => l.startsWith('| n |'))).toBe(
      '| n | dense | crisp | torch-sdpa-flash | FlexPrefill (its code) | crisp vs dense | crisp vs torch-sdpa-flash | crisp vs FlexPrefill (its code) | crisp density | crisp plan share | crisp route+select+mask share |',
    );
    // 128k: crisp 16.4 ms against FlexPrefill's 35 ms; 32k: the parity row is another seed's layer
    expect(lines.find((l) => l.startsWith('| 128k |'))).toContain('| 35.0 [33.3, 38.5] | 8.00x | 26.25x | 2.14x |');
    expect(lines.find((l) => l.startsWith('| 32k |'))).toContain('| – | – | 8.00x | – | – |');
    const note = lines.find((l) => l.startsWith('FlexPrefill (its code):'))!;
    expect(note).toContain('128k: FlexPrefill density 0.035, error 0.0781; crisp density 0.079, error 0.0040');
    expect(note).not.toContain('32k:');
    // without the parity suite the columns are not there
    expect(headline(r, 'x').includes('FlexPrefill (its code)')).toBe(false);
  });

  it('puts dense, crisp and the peers per n with crisp speed-ups, density and plan share', () => {
    const r = result(
      'node apps/bench/dist/crisp-bench.mjs --backends cuda --sizes 32k,128k',
      '2026-11-30T05:00:00.000Z',
      [lat('cuda', 'dense', 32768, 40, 0.1, 1), lat('cuda', 'crisp', 32768, 20, 5, 0.43), lat('cuda', 'crispFast', 32768, 18, 4, 0.43), lat('cuda', 'dense', 131072, 600, 0.1, 1), { ...lat('cuda', 'crisp', 131072, 300, 30, 0.45), planPhases: { statsMs: 20, peRowsMs: 10 } }],
      [
        { n: 32768, peer: 'torch-sdpa-flash', median: 30 },
        { n: 131072, peer: 'torch-sdpa-flash', median: 450 },
      ],
    );
    const md = headline(r, 'apps/bench/results/nvidia-h200/');
    const lines = md.split('\n');
    const head = lines.find((l) => l.startsWith('| n |'))!;
    expect(head).toBe('| n | dense | crisp | torch-sdpa-flash | crisp vs dense | crisp vs torch-sdpa-flash | crisp density | crisp plan share | crisp route+select+mask share |');
    // crispFast is in bench.md, not in the headline
    expect(md).not.toContain('crispFast');
    expect(lines.find((l) => l.startsWith('| 32k |'))).toBe('| 32k | 40.0 [36.0, 48.0] | 20.0 [18.0, 24.0] | 30.0 [30.0, 30.0] | 2.00x | 1.50x | 0.430 | 25.0% | – |');
    expect(lines.find((l) => l.startsWith('| 128k |'))).toBe('| 128k | 600 [540, 720] | 300 [270, 360] | 450 [450, 450] | 2.00x | 1.50x | 0.450 | 10.0% | 3.3% |');
    expect(md).toContain('[all results](apps/bench/results/nvidia-h200/bench.md)');
    expect(md).toContain('`node apps/bench/dist/crisp-bench.mjs --backends cuda --sizes 32k,128k`');
    expect(md).toContain('NVIDIA H200');
  });

  it('gives no route+select+mask share for a plan timed by waiting for the device (WebGPU\'s serial split), and says why', () => {
    const serial = { ...lat('webgpu', 'crisp', 131072, 300, 30, 0.45), planPhases: { statsMs: 20, peRowsMs: 10 }, planSplit: 'serial' as const };
    const r = result('cmd', 't0', [lat('webgpu', 'dense', 131072, 600, 0.1, 1), serial], []);
    const md = headline(r, 'x/');
    expect(md.split('\n').find((l) => l.startsWith('| 128k |'))).toBe('| 128k | 600 [540, 720] | 300 [270, 360] | 2.00x | 0.450 | 10.0% | – |');
    expect(md).toContain('no route+select+mask share is given');
  });

  it('shows the error of a peer timed with its output past the check\'s tolerance, in both tables', () => {
    const r = result('cmd', 't0', [lat('cuda', 'dense', 16384, 20, 0.1, 1), lat('cuda', 'crisp', 16384, 10, 1, 0.4)], [{ n: 16384, peer: 'ort-web-webgpu', median: 80 }]);
    const row = r.suites.latency!.peers.rows[0];
    (r.suites.latency!.peers.rows as PeerRow[])[0] = { ...row, beyondTolerance: { maxRelError: 0.011, tolerance: 0.01 } };
    for (const md of [headline(r, 'x/'), markdown(r)]) {
      const line = md.split('\n').find((l) => l.startsWith('| 16k |'))!;
      expect(line).toContain('80.0 [80.0, 80.0] (rel. err 1.1e-2 > 0.01)');
    }
  });

  it('lists every sparse preset\'s plan time, share and density in bench.md when more than crisp was timed', () => {
    const r = result('cmd', 't0', [lat('cuda', 'crisp', 131072, 200, 1, 0.45), lat('cuda', 'crispGuarded', 131072, 250, 5, 0.5), lat('cuda', 'dense', 131072, 600, 0.1, 1)]);
    const lines = markdown(r).split('\n');
    const at = lines.indexOf('Plan per preset (ms, share of the preset\'s total, density):');
    expect(at).toBeGreaterThan(0);
    expect(lines[at + 2]).toBe('| n | crisp | crispGuarded |');
    expect(lines[at + 4]).toBe('| 128k | 1.00 (0.5%), 0.450 | 5.00 (2.0%), 0.500 |');
    // crisp alone: the main table has its plan already
    expect(markdown(result('cmd', 't0', [lat('cuda', 'crisp', 131072, 200, 1, 0.45)]))).not.toContain('Plan per preset');
  });

  it('puts each kernel\'s achieved TFLOP/s against the H200\'s peak in a roofline table: dense over the whole call, a sparse preset over its computed blocks and attention time', () => {
    const n = 131072;
    const full = 4 * 32 * 128 * ((n * (n + 1)) / 2);
    const r = result('cmd', 't0', [lat('cuda', 'dense', n, 400, 0, 1), { ...lat('cuda', 'crisp', n, 40, 2, 0.1), attentionMs: 38 }], [{ n, peer: 'torch-sdpa-cudnn', median: 250 }]);
    const lines = markdown(r).split('\n');
    expect(lines).toContain('## Roofline: achieved TFLOP/s per kernel');
    const row = (kernel: string) => lines.find((l) => l.startsWith(`| cuda | 128k | ${kernel} |`));
    const t = (ms: number, flops: number) => (flops / (ms * 1e-3) / 1e12).toFixed(1);
    const pct = (ms: number, flops: number) => `${((100 * flops) / (ms * 1e-3) / 1e12 / 790).toFixed(0)}%`;
    expect(row('dense (CRISP)')).toBe(`| cuda | 128k | dense (CRISP) | 400 | ${t(400, full)} | ${pct(400, full)} |`);
    expect(row('crisp attention (density 0.100)')).toBe(`| cuda | 128k | crisp attention (density 0.100) | 38.0 | ${t(38, 0.1 * full)} | ${pct(38, 0.1 * full)} |`);
    expect(row('torch-sdpa-cudnn')).toBe(`| cuda | 128k | torch-sdpa-cudnn | 250 | ${t(250, full)} | ${pct(250, full)} |`);
    // a GPU with no listed peak: no share column
    const other = result('cmd', 't0', [lat('cuda', 'dense', n, 400, 0, 1)]);
    const md = markdown({ ...other, machine: { ...other.machine, gpus: [{ name: 'Some GPU', driver: '1', memory: '1 MiB' }] } });
    expect(md).toContain('No peak is listed for this GPU.');
    expect(md).toContain('| backend | n | kernel | ms | TFLOP/s |\n');
  });

  it('says so when the run stopped early', () => {
    const r = result('cmd', 't0', [lat('cuda', 'dense', 8192, 1, 0, 1)]);
    r.inProgress = 'accuracy';
    expect(headline(r, 'x')).toContain('Partial: the run stopped in suite `accuracy`');
    expect(markdown(r)).toContain('**Partial results**');
  });
});

describe('provenance after --merge', () => {
  it('names, per suite, exactly the commands whose rows it holds', () => {
    const first = result('first', 't1', [lat('cuda', 'dense', 8192, 10, 0, 1), lat('cuda', 'crisp', 8192, 5, 1, 0.5)]);
    const second = result('second', 't2', [lat('webgpu', 'dense', 8192, 20, 0, 1), lat('webgpu', 'crisp', 8192, 10, 1, 0.5)]);
    const m = mergeResults(first, second, ['webgpu']);
    expect(suiteCommands(m, 'latency')).toEqual(['first', 'second']);
    // a third command that re-measures the cuda rows replaces the first one entirely
    const third = result('third', 't3', [lat('cuda', 'dense', 8192, 11, 0, 1), lat('cuda', 'crisp', 8192, 6, 1, 0.5)]);
    const m2 = mergeResults(m, third, ['cuda']);
    expect(suiteCommands(m2, 'latency')).toEqual(['second', 'third']);
    // ... and is no longer listed as merged: the file names the commands behind its numbers
    expect(m2.earlierRuns!.map((e) => e.command)).toEqual(['second']);
    expect(markdown(m2)).toContain('Reproduce: `second`, then `third`');
    expect(markdown(m2)).toContain('Merged with the results of `second`');
    expect(markdown(m2)).not.toContain('`first`');
    // the same command run again replaces its own earlier run: one run listed, not two
    const again = mergeResults(m2, result('third', 't4', [lat('cuda', 'dense', 8192, 12, 0, 1), lat('cuda', 'crisp', 8192, 7, 1, 0.5)]), ['cuda']);
    expect(again.earlierRuns!.map((e) => `${e.command} ${e.startedAt}`)).toEqual(['second t2']);
    // a file written before this rule, read back, lists only the runs whose rows it holds
    const stale = { ...again, earlierRuns: [...again.earlierRuns!, { command: 'third', startedAt: 't3', backends: ['cuda'] }] };
    expect(withLiveRuns(stale).earlierRuns!.map((e) => e.startedAt)).toEqual(['t2']);
    // a tfjs, varlen or parity section written before they named their run could be any
    // run's: with one present every run stays
    const withTfjs = { ...stale, suites: { ...stale.suites, tfjs: { rows: [], notes: [] } } } as typeof stale;
    expect(withLiveRuns(withTfjs).earlierRuns).toHaveLength(2);
    // one that names its run keeps that run and lets the others go
    const tagged = (run: string) => ({ ...stale, suites: { ...stale.suites, parity: { run } } }) as unknown as typeof stale;
    expect(withLiveRuns(tagged('t4')).earlierRuns!.map((e) => e.startedAt)).toEqual(['t2']);
    expect(withLiveRuns(tagged('t3')).earlierRuns!.map((e) => e.startedAt)).toEqual(['t2', 't3']);
  });
});

/** One accuracy row (MaskMetrics with its input) for the report's functions: the worst head at the overall error, needles all recalled. */
function maskRow(o: {
  profile: string;
  n: number;
  policy: string;
  massRecall: number;
  outputError: number;
  density: number;
  minProxyRecall: number;
  meanProxyRecall: number;
  worstHeadError?: number;
}) {
  return {
    backend: 'reference',
    ...o,
    needleRecall: 1,
    needleOutputRecall: 1,
    needles: 2,
    vsHeads: 4,
    planMs: 1,
    worstHeadError: o.worstHeadError ?? o.outputError,
    worstHead: 0,
    guardedHeads: 0,
  };
}

describe('floorSummary', () => {
  const variants2 = ['a', 'b'].map((param) => ({ family: 'mean', param }));
  const row = (param: string, profile: string, massRecall: number, density: number) => ({
    ...maskRow({ profile, n: 8192, policy: param, massRecall, outputError: 1 - massRecall, density, minProxyRecall: massRecall, meanProxyRecall: massRecall }),
    family: 'mean' as const,
    param,
  });
  it('averages over profiles and marks the accuracy-density Pareto front', () => {
    const variants = ['a', 'b', 'c', 'd'].map((param) => ({ family: 'mean', param }));
    const s = floorSummary(variants, [
      row('a', 'p', 0.9, 0.3),
      row('a', 'q', 0.8, 0.1), // a: 0.85 @ 0.2
      row('b', 'p', 0.95, 0.4),
      row('b', 'q', 0.95, 0.4), // b: 0.95 @ 0.4
      row('c', 'p', 0.84, 0.3),
      row('c', 'q', 0.84, 0.3), // c: 0.84 @ 0.3, dominated by a
      row('d', 'p', 0.95, 0.5),
      row('d', 'q', 0.95, 0.5), // d: equal recall to b at higher density: dominated
    ]);
    expect(s.map((x) => [x.param, Number(x.massRecall.toFixed(3)), Number(x.density.toFixed(3)), x.pareto])).toEqual([
      ['a', 0.85, 0.2, true],
      ['b', 0.95, 0.4, true],
      ['c', 0.84, 0.3, false],
      ['d', 0.95, 0.5, false],
    ]);
  });

  it('is derived when a result written without the Pareto flags is read back (to merge, fold or render)', () => {
    const rows = [row('a', 'p', 0.9, 0.3), row('b', 'p', 0.8, 0.4)];
    const summary = floorSummary(variants2, rows).map(({ pareto: _, ...x }) => x);
    const old = { ...result('old', '2026-11-30T00:00:00.000Z', []), suites: { floors: { backend: 'reference', n: 8192, rows, summary } } };
    const dir = mkdtempSync(join(tmpdir(), 'crisp-bench-read-'));
    writeFileSync(join(dir, 'bench.json'), JSON.stringify(old));
    expect(readResult(join(dir, 'bench.json')).suites.floors!.summary.map((x) => [x.param, x.pareto])).toEqual([
      ['a', true],
      ['b', false],
    ]);
    writeFileSync(join(dir, 'other.json'), JSON.stringify({ ...old, schema: 'other/2' }));
    expect(() => readResult(join(dir, 'other.json'))).toThrow(/not a crisp-bench\/1 result \(schema 'other\/2'\)/);
  });
});

describe('matchedErrorMarkdown', () => {
  const acc = (profile: string, policy: string, outputError: number, density: number) =>
    maskRow({ profile, n: 16384, policy, massRecall: 0.99, outputError, density, minProxyRecall: 0.9, meanProxyRecall: 0.95 });

  it("finds the smallest γ whose error is within crispGuarded's, or says none reached it", () => {
    const lines = matchedErrorMarkdown([
      acc('p', 'crispGuarded', 0.01, 0.2),
      acc('p', 'crisp', 0.02, 0.15),
      acc('p', 'flexPrefill', 0.05, 0.14),
      // listed out of order: the table goes by γ
      acc('p', 'flexPrefill(γ=0.995)', 0.008, 0.3),
      acc('p', 'flexPrefill(γ=0.99)', 0.012, 0.25),
      acc('q', 'crispGuarded', 0.01, 0.2),
      acc('q', 'flexPrefill', 0.05, 0.14),
      acc('q', 'flexPrefill(γ=0.99)', 0.03, 0.25),
      acc('q', 'flexPrefill(γ=0.999)', 0.02, 0.4),
    ]).join('\n');
    expect(lines).toContain('| reference | p | 16k | 0.0100 / 0.200 | 0.0500 / 0.140 | γ=0.995: 0.0080 / 0.300 (1.50x) |');
    expect(lines).toContain('| reference | q | 16k | 0.0100 / 0.200 | 0.0500 / 0.140 | none up to γ=0.999 (0.0200 / 0.400, 2.00x the blocks at 2.0x the error) |');
  });

  it('takes the preset itself when it is already within the error', () => {
    const lines = matchedErrorMarkdown([acc('p', 'crispGuarded', 0.05, 0.2), acc('p', 'flexPrefill', 0.04, 0.1), acc('p', 'flexPrefill(γ=0.99)', 0.01, 0.3)]).join('\n');
    expect(lines).toContain('| γ=0.95: 0.0400 / 0.100 (0.50x) |');
  });

  it('is empty without the swept rows (results from before them, or --acc-flex-gammas none)', () => {
    expect(matchedErrorMarkdown([acc('p', 'crispGuarded', 0.01, 0.2), acc('p', 'flexPrefill', 0.05, 0.14)])).toEqual([]);
  });
});

describe('matchedDensityMarkdown', () => {
  const acc = (profile: string, policy: string, outputError: number, density: number, worstHeadError = outputError * 4) =>
    maskRow({ profile, n: 65536, policy, massRecall: 0.99, outputError, density, worstHeadError, minProxyRecall: 0.9, meanProxyRecall: 0.95 });

  it("finds the smallest α whose density is within flexPrefill's, or says none reached it, on the inputs where crispGuarded is denser", () => {
    const lines = matchedDensityMarkdown([
      acc('p', 'crispGuarded', 0.003, 0.117),
      acc('p', 'flexPrefill', 0.045, 0.1, 0.338),
      // listed out of order: the table goes by α
      acc('p', 'crispGuarded(VS α=2)', 0.005, 0.099),
      acc('p', 'crispGuarded(VS α=1.5)', 0.004, 0.105),
      acc('q', 'crispGuarded', 0.006, 0.165),
      acc('q', 'flexPrefill', 0.057, 0.142),
      acc('q', 'crispGuarded(VS α=2)', 0.0065, 0.159),
      // crispGuarded is already at or under flexPrefill's density: no row
      acc('r', 'crispGuarded', 0.01, 0.25),
      acc('r', 'flexPrefill', 0.15, 0.33),
      acc('r', 'crispGuarded(VS α=2)', 0.01, 0.24),
    ]).join('\n');
    expect(lines).toContain("| reference | p | 64k | 0.0450 / 0.338 / 1.00 / 0.100 | 0.0030 / 0.012 / 1.00 / 0.117 | VS α=2: 0.0050 / 0.020 / 1.00 / 0.099 |");
    expect(lines).toContain('| reference | q | 64k | 0.0570 / 0.228 / 1.00 / 0.142 | 0.0060 / 0.024 / 1.00 / 0.165 | none up to VS α=2 (0.0065 / 0.026 / 1.00 / 0.159: 1.12x flexPrefill\'s blocks) |');
    expect(lines).not.toContain('| r |');
  });

  it('is empty without the swept rows (results from before them, or --acc-guard-alphas none)', () => {
    expect(matchedDensityMarkdown([acc('p', 'crispGuarded', 0.01, 0.2), acc('p', 'flexPrefill', 0.05, 0.14)])).toEqual([]);
  });
});
