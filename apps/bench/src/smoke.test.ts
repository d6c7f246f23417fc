/**
 * The smoke run end to end, as CI runs it: the single-file bundle, plain Node, every
 * suite, output into a temporary folder (never into results/).
 */
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { BenchResult } from './result.js';

const here = dirname(fileURLToPath(import.meta.url));
const pkg = join(here, '..');
const repoRoot = join(pkg, '..', '..');
const bundle = join(pkg, 'dist', 'crisp-bench.mjs');

function finite(x: unknown): boolean {
  return typeof x === 'number' && Number.isFinite(x);
}

describe('crisp-bench --smoke', () => {
  let out: string;
  let result: BenchResult;
  let status: number | null;
  let stderr: string;
  beforeAll(() => {
    out = mkdtempSync(join(tmpdir(), 'crisp-bench-smoke-'));
    const b = spawnSync(process.execPath, [join(pkg, 'scripts', 'bundle.mjs')], { encoding: 'utf8' });
    expect(b.status, b.stderr).toBe(0);
    // (a hang guard: beside the other suites on a loaded machine the run has taken 516 s)
    // --liftoff-only: V8 keeps ONNX Runtime Web's WebAssembly (the ort-web-webgpu peer, 27 MB)
    // on its baseline compiler. Left to tier up, its optimizing compiles take ~60 s of CPU in
    // background threads, most of them after the results are written (the process waits for
    // them before it exits), and the peer's results and checks are the same either way.
    const r = spawnSync(process.execPath, ['--liftoff-only', bundle, '--smoke', '--kernel-times', '--out', out], { cwd: repoRoot, encoding: 'utf8', timeout: 1_500_000 });
    status = r.status;
    stderr = r.stderr;
    if (existsSync(join(out, 'bench.json'))) result = JSON.parse(readFileSync(join(out, 'bench.json'), 'utf8'));
  }, 1_520_000); // bundle + the whole --smoke run: ~80-130 s on 2 idle cores, 140-200 s in CI beside the other suites
  afterAll(() => rmSync(out, { recursive: true, force: true }));

  it('exits 0 and writes bench.json', () => {
    expect(status, stderr.slice(-2000)).toBe(0);
    expect(result.schema).toBe('crisp-bench/1');
    expect(result.config.mode).toBe('smoke');
    expect(result.command).toContain('--smoke');
    expect(result.machine.node).toBe(process.version);
  });

  it('reports every backend, available or with a reason', () => {
    expect(result.backends.map((b) => b.name)).toEqual(['reference', 'webgpu', 'cuda']);
    for (const b of result.backends) {
      if (!b.available) expect(b.reason?.length).toBeGreaterThan(5);
    }
    expect(result.backends[0].available).toBe(true);
  });

  it('times every preset on the reference, and dense + crisp on each other available backend', () => {
    const lat = result.suites.latency!;
    for (const b of result.backends.filter((x) => x.available)) {
      const rows = lat.rows.filter((r) => r.backend === b.name);
      const presets = new Set(rows.map((r) => r.preset));
      expect([...presets].sort(), b.name).toEqual(b.name === 'reference' ? ['crisp', 'crispFast', 'crispGuarded', 'dense', 'flexPrefill'] : ['crisp', 'dense']);
    }
    for (const r of lat.rows) {
      expect(r.ms.runs).toBeGreaterThanOrEqual(3);
      expect(finite(r.ms.median) && r.ms.median > 0).toBe(true);
      expect(r.ms.min).toBeLessThanOrEqual(r.ms.median);
      expect(r.ms.max).toBeGreaterThanOrEqual(r.ms.median);
      expect(r.density).toBeGreaterThan(0);
      expect(r.density).toBeLessThanOrEqual(1);
      // every timed run's plan, whose median is the row's planMs
      expect(r.planRuns?.planMs).toHaveLength(r.ms.runs);
      expect(Math.max(...(r.planRuns?.totalMs ?? []))).toBeCloseTo(r.ms.max, 2);
      const sorted = [...(r.planRuns?.planMs ?? [])].sort((a, b) => a - b);
      const mid = sorted.length % 2 ? sorted[(sorted.length - 1) / 2] : (sorted[sorted.length / 2 - 1] + sorted[sorted.length / 2]) / 2;
      // (WebGPU's sparse rows: plan and attention from runs that waited for the device after each)
      expect(r.planSplit, `${r.backend} ${r.preset}`).toBe(r.backend === 'webgpu' && r.preset !== 'dense' ? 'serial' : undefined);
      if (r.planSplit === undefined) expect(mid).toBeCloseTo(r.planMs, 2);
      // the length gate is off in this suite: sparse presets really ran sparse
      if (r.preset !== 'dense') expect(r.denseReason).toBeUndefined();
    }
    expect(lat.peers.notes.length).toBeGreaterThan(0);
  });

  it('times the kernels of each WebGPU row on the GPU clock (--kernel-times), and says why not on the others', () => {
    const lat = result.suites.latency!;
    for (const r of lat.rows) {
      if (r.backend === 'reference') {
        expect(r.kernelTimes).toBeUndefined();
        continue;
      }
      const t = r.kernelTimes!;
      expect(t, `${r.backend} ${r.preset}`).toBeDefined();
      if (r.backend !== 'webgpu') {
        expect(t.error).toMatch(/does not time its kernels/);
        continue;
      }
      expect(t.error, `${r.preset} n=${r.n}`).toBeUndefined();
      expect(t.busyMs).toBeGreaterThan(0);
      expect(t.spanMs).toBeGreaterThanOrEqual(t.busyMs - 1e-6);
      expect(t.kernels.some((k) => /attention/i.test(k.name))).toBe(true);
      expect(t.passes).toBe(t.kernels.reduce((s, k) => s + k.passes, 0));
      // a sparse prefill runs the proxy statistics before its attention
      if (r.preset === 'crisp') expect(t.kernels.map((k) => k.name)).toContain('rowStats');
      // and its plan time holds the plan's device work, not only the host's part of it: at
      // least a quarter of what the kernels other than the attention took on the GPU clock.
      // (The two come from different runs; on SwiftShader, whose "GPU" is the CPU, a loaded
      // machine stretches either by 2x. Without the device work the plan time is the host's
      // queueing alone, a few ms against the kernels' hundreds.)
      if (r.preset !== 'dense') {
        const planKernelsMs = t.kernels.filter((k) => !/attention/i.test(k.name)).reduce((sum, k) => sum + k.ms, 0);
        expect(r.planMs, `${r.preset} n=${r.n}`).toBeGreaterThan(0.25 * planKernelsMs);
      }
    }
    if (lat.rows.some((r) => r.backend === 'webgpu')) expect(readFileSync(join(out, 'bench.md'), 'utf8')).toContain('### GPU time per kernel');
  });

  it('gives a crossover verdict per timed backend', () => {
    const cross = result.suites.crossover!;
    const timed = new Set(result.suites.latency!.rows.map((r) => r.backend));
    expect(new Set(cross.gates.map((g) => g.backend))).toEqual(timed);
    for (const c of cross.rows) for (const q of c.ratios) expect(finite(q.ratio) && q.ratio > 0).toBe(true);
  });

  it('scores accuracy with finite metrics for every profile on the reference', () => {
    const acc = result.suites.accuracy!;
    expect(new Set(acc.rows.filter((r) => r.backend === 'reference').map((r) => r.profile))).toEqual(
      new Set(['llama-like', 'qwen-like', 'retrieval', 'diffuse']),
    );
    for (const r of acc.rows) {
      expect(r.massRecall).toBeGreaterThan(0.5);
      expect(r.massRecall).toBeLessThanOrEqual(1 + 1e-12);
      expect(finite(r.outputError) && r.outputError >= 0).toBe(true);
      expect(r.needleRecall).toBeGreaterThanOrEqual(0);
      // the needles the proxy rows can see are a subset, scored the same way
      expect(r.visibleNeedles!).toBeLessThanOrEqual(r.needles);
      expect(r.visibleNeedleRecall! >= 0 && r.visibleNeedleRecall! <= 1).toBe(true);
      expect(r.density).toBeGreaterThan(0);
    }
    for (const g of acc.routing) for (const x of [g.cStructVsJsd, g.cStructVsTruth, g.jsdVsTruth]) expect(x >= 0 && x <= 1).toBe(true);
  });

  it('shows the O(n) curve: γ coverage adds background blocks as n grows, the noise floor none on a flat background', () => {
    const syn = result.suites.onCurve!.synthetic.filter((r) => r.background === 'flat');
    const sizes = [...new Set(syn.map((r) => r.n))].sort((a, b) => a - b);
    const at = (sel: string, n: number) => syn.find((r) => r.selector === sel && r.n === n)!;
    const first = at('γ-coverage 0.95', sizes[0]);
    const last = at('γ-coverage 0.95', sizes[sizes.length - 1]);
    expect(last.backgroundBlocks).toBeGreaterThan(4 * first.backgroundBlocks);
    for (const n of sizes) expect(at('noise floor α=1', n).backgroundBlocks).toBe(0);
    expect(result.suites.onCurve!.proxy.length).toBeGreaterThan(0);
    for (const p of result.suites.onCurve!.proxy) expect(p.meanBlocks >= 1 && p.meanBlocks <= p.numBlocks).toBe(true);
  });

  it('compares floors with finite values', () => {
    const fl = result.suites.floors!;
    expect(new Set(fl.summary.map((s) => s.family))).toEqual(new Set(['mean', 'median', 'quantile', 'robust', 'coverage']));
    for (const s of fl.summary) for (const x of [s.massRecall, s.outputError, s.density, s.needleRecall]) expect(finite(x)).toBe(true);
  });

  it('writes the markdown (headline first) and the SVG figures', () => {
    const md = readFileSync(join(out, 'bench.md'), 'utf8');
    expect(md.startsWith('# CRISP bench')).toBe(true);
    expect(md.indexOf('## Latency (headline)')).toBeLessThan(md.indexOf('## Accuracy'));
    expect(result.figures).toEqual(expect.arrayContaining(['latency.svg', 'crossover.svg', 'accuracy.svg', 'on-curve.svg', 'floors-pareto.svg']));
    expect(md).toContain('crisp plan share');
    for (const f of result.figures!) {
      const svg = readFileSync(join(out, f), 'utf8');
      expect(svg.startsWith('<svg')).toBe(true);
      expect(svg.length).toBeGreaterThan(2000);
      // every figure carries the command that reproduces it
      expect(svg, f).toContain('Reproduce: node apps/bench/dist/crisp-bench.mjs --smoke');
    }
    const head = readFileSync(join(out, 'headline.md'), 'utf8');
    expect(head).toContain('| n | dense | crisp |');
    expect(head).toContain('[all results](');
    expect(result.inProgress).toBeUndefined();
  });
});
