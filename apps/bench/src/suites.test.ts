import { describe, expect, it } from 'vitest';
import { parseSizes, resolveConfig } from './index.js';
import { warmupText } from './report.js';
import { crossoverSuite } from './suites/crossover.js';
import { JIT_WARMUP_MAX_MS, jitWarmupGoesOn, type LatencyRow, steadySizeMs } from './suites/latency.js';
import { constructedHead, syntheticCurve } from './suites/on-curve.js';

const row = (backend: string, preset: string, n: number, median: number): LatencyRow => ({
  backend,
  preset,
  n,
  dtype: 'f32',
  shape: { heads: 1, kvHeads: 1, headDim: 64 },
  ms: { median, min: median, max: median, runs: 3 },
  planMs: 0,
  density: 1,
  input: 'test',
});

describe('parseSizes', () => {
  it('reads lists, k suffixes and power-of-two ranges', () => {
    expect(parseSizes('8k..64k')).toEqual([8192, 16384, 32768, 65536]);
    expect(parseSizes('1536,2k')).toEqual([1536, 2048]);
    expect(() => parseSizes('8k..4k')).toThrow(/bad size range/);
    expect(() => parseSizes('lots')).toThrow(/not a size/);
  });
  it('takes k suffixes for the floors size too', () => {
    expect(resolveConfig({ floorsN: '16k' }).floors.n).toBe(16384);
    expect(resolveConfig({ floorsN: '3000' }).floors.n).toBe(3000);
    expect(() => resolveConfig({ floorsN: '8k..16k' })).toThrow(/one size/);
  });
  it('keeps at least 3 timed runs', () => {
    expect(() => resolveConfig({ reps: '2' })).toThrow(/reps/);
    expect(resolveConfig({ smoke: true, reps: '5' }).latency.reps).toBe(5);
  });
  it('warms the JIT with 2000 prefills by default (none in the smoke run), and says so in the reports', () => {
    expect(resolveConfig({}).latency.jitWarmup).toBe(2000);
    expect(resolveConfig({}).cudaSchedule).toBe('auto');
    expect(resolveConfig({ cudaSchedule: 'spin' }).cudaSchedule).toBe('spin');
    expect(() => resolveConfig({ cudaSchedule: 'busy' })).toThrow(/unknown CUDA schedule 'busy'/);
    expect(resolveConfig({}).cudaProxyLayout).toBeUndefined();
    expect(resolveConfig({ cudaProxyLayout: 'w32' }).cudaProxyLayout).toBe('w32');
    expect(() => resolveConfig({ cudaProxyLayout: 'w64' })).toThrow(/unknown CUDA proxy layout 'w64'/);
    expect(resolveConfig({}).cudaPdl).toBeUndefined();
    expect(resolveConfig({ cudaPdl: 'off' }).cudaPdl).toBe(false);
    expect(resolveConfig({ cudaPdl: 'on' }).cudaPdl).toBe(true);
    expect(() => resolveConfig({ cudaPdl: 'maybe' })).toThrow(/maybe/);
    expect(resolveConfig({}).cudaFlexOnDevice).toBeUndefined();
    expect(resolveConfig({ cudaFlexPlan: 'device' }).cudaFlexOnDevice).toBe(true);
    expect(resolveConfig({ cudaFlexPlan: 'host' }).cudaFlexOnDevice).toBe(false);
    expect(resolveConfig({}).cudaAttention).toBeUndefined();
    expect(resolveConfig({ cudaAttention: 'wgw' }).cudaAttention).toBe('wgw');
    expect(() => resolveConfig({ cudaAttention: 'w64' })).toThrow(/CUDA attention layout/);
    expect(() => resolveConfig({ cudaFlexPlan: 'gpu' })).toThrow(/gpu/);
    expect(resolveConfig({}).cudaGuardOnDevice).toBeUndefined();
    expect(resolveConfig({ cudaGuardPlan: 'device' }).cudaGuardOnDevice).toBe(true);
    expect(resolveConfig({ cudaGuardPlan: 'host' }).cudaGuardOnDevice).toBe(false);
    expect(() => resolveConfig({ cudaGuardPlan: 'gpu' })).toThrow(/gpu/);
    expect(resolveConfig({}).webgpuKernel).toBeUndefined();
    expect(resolveConfig({ webgpuKernel: 'fma' }).webgpuKernel).toEqual({ kernel: 'fma' });
    expect(resolveConfig({ webgpuKernel: 'subgroup-matrix' }).webgpuKernel).toEqual({ kernel: 'subgroup-matrix' });
    expect(resolveConfig({ webgpuKernel: 'subgroup-matrix:direct' }).webgpuKernel).toEqual({ kernel: 'subgroup-matrix', form: 'direct' });
    for (const bad of ['tensor', 'fma:staged', 'subgroup-matrix:fast', 'subgroup-matrix:staged:x']) {
      expect(() => resolveConfig({ webgpuKernel: bad }), bad).toThrow(/--webgpu-kernel/);
    }
    expect(resolveConfig({ smoke: true }).latency.jitWarmup).toBe(0);
    expect(resolveConfig({ jitWarmup: '0' }).latency.jitWarmup).toBe(0);
    expect(() => resolveConfig({ jitWarmup: '-1' })).toThrow(/jit-warmup/);
    expect(warmupText({ warmup: 3, jitWarmup: 300 })).toMatch(/^3 warm-up \(GPU backends: after 300 untimed prefills at 8k/);
    // results written before the option existed say nothing of it
    expect(warmupText({ warmup: 1 })).toBe('1 warm-up');
    // GPU backends warm each preset for a least time at full size; the smoke does not
    expect(resolveConfig({}).latency.gpuWarmMs).toBe(500);
    expect(resolveConfig({ smoke: true }).latency.gpuWarmMs).toBe(0);
    expect(warmupText({ warmup: 1, gpuWarmMs: 500, jitWarmup: 2000 })).toBe(
      '1 warm-up (GPU backends: warm-up runs for at least 500 ms a preset and size; after 2000 untimed prefills at 8k, so their JavaScript runs JIT-optimised)',
    );
  });
  it("caps the JIT warm-up's time from the end of its first round, so kernel compiles do not use it up", () => {
    const late = JIT_WARMUP_MAX_MS + 1;
    // the first round (one prefill a preset, each compiling its kernels) runs whatever it took
    expect([0, 1, 2, 3].map((done) => jitWarmupGoesOn(done, 2000, 4, late))).toEqual([true, true, true, true]);
    // after it, the cap counts
    expect(jitWarmupGoesOn(4, 2000, 4, late)).toBe(false);
    expect(jitWarmupGoesOn(4, 2000, 4, JIT_WARMUP_MAX_MS - 1)).toBe(true);
    expect(jitWarmupGoesOn(1999, 2000, 4, 0)).toBe(true);
    // the count, and nothing to warm
    expect(jitWarmupGoesOn(2000, 2000, 4, 0)).toBe(false);
    expect(jitWarmupGoesOn(2, 2, 4, 0)).toBe(false);
    expect(jitWarmupGoesOn(0, 2000, 0, 0)).toBe(false);
  });
  it('takes the latency switches for fresh inputs and host timings, off by default', () => {
    expect(resolveConfig({}).latency).toMatchObject({ freshInputs: false, hostTimings: false });
    expect(resolveConfig({ freshInputs: true, hostTimings: true }).latency).toMatchObject({ freshInputs: true, hostTimings: true });
  });
});

describe('steadySizeMs (what the next size is projected from)', () => {
  it('counts the presets at their timed medians, not a first run that compiled every kernel', () => {
    // two presets at 1.5 and 0.5 ms, 3 reps + 1 warm-up each; the wall time held a 50 s compile
    expect(steadySizeMs([1.5, 0.5], 4, 50_000)).toBe(8);
  });
  it('falls back to the wall time when no preset ran, and never exceeds it', () => {
    expect(steadySizeMs([], 4, 1234)).toBe(1234);
    expect(steadySizeMs([400], 4, 1000)).toBe(1000);
  });
});

describe('crossoverSuite', () => {
  it('interpolates where sparse / dense crosses 1 in log n', () => {
    // ratio 2 at 8k, 0.5 at 32k: log-linear crossing at 16k
    const rows = [row('gpu', 'dense', 8192, 10), row('gpu', 'crisp', 8192, 20), row('gpu', 'dense', 32768, 100), row('gpu', 'crisp', 32768, 50)];
    const r = crossoverSuite(rows, new Map([['gpu', 4096]]));
    expect(r.rows[0].crossoverN).toBe(32768);
    expect(r.rows[0].estimatedN).toBe(16384);
    expect(r.gates).toEqual([{ backend: 'gpu', gate: 16384, shipped: 4096, note: expect.stringContaining('dense wins at 8192') }]);
  });
  it('needs sparse to win from the crossover on, not once', () => {
    const rows = [row('b', 'dense', 1, 10), row('b', 'crisp', 1, 5), row('b', 'dense', 2, 10), row('b', 'crisp', 2, 20)];
    const r = crossoverSuite(rows, new Map());
    expect(r.rows[0].crossoverN).toBeNull();
    expect(r.gates[0].gate).toBeNull();
  });
});

describe('the constructed O(n) head', () => {
  it('holds the stated masses', () => {
    const h = constructedHead(16384, 'salient', 3);
    const Nb = h.blocks.length;
    expect(h.blocks[0]).toBeCloseTo(0.85, 6);
    expect(h.blocks[Nb - 1]).toBeCloseTo(0.03, 6);
    let sig = 0;
    for (const J of h.signal) sig += h.blocks[J];
    expect(sig).toBeCloseTo(0.04, 6);
    expect(h.blocks.reduce((a, b) => a + b, 0)).toBeCloseTo(1, 5);
  });
  it('γ coverage keeps O(n) background blocks; the noise floor keeps every signal block and no flat background', () => {
    const rows = syntheticCurve([8192, 32768, 131072], 5);
    const cov = rows.filter((r) => r.selector === 'γ-coverage 0.95' && r.background === 'flat').map((r) => r.backgroundBlocks);
    expect(cov[1] / cov[0]).toBeGreaterThan(3);
    expect(cov[2] / cov[1]).toBeGreaterThan(3);
    for (const r of rows.filter((x) => x.selector === 'noise floor α=1')) expect(r.signalRecall).toBe(1);
    for (const r of rows.filter((x) => x.selector === 'noise floor α=1' && x.background === 'flat')) expect(r.backgroundBlocks).toBe(0);
  });
});

describe('mergeResults', () => {
  it('replaces the rows of the backends that ran, keeps the others, and recomputes the crossover', async () => {
    const { mergeResults } = await import('./merge.js');
    const mk = (command: string, rows: LatencyRow[], backends: string[]) =>
      ({
        command,
        startedAt: command,
        backends: backends.map((name) => ({ name, available: true })),
        suites: { latency: { rows, skipped: [], peers: { rows: [], notes: [] } }, crossover: { rows: [], gates: [] } },
      }) as unknown as import('./result.js').BenchResult;
    const prev = mk('first', [row('cuda', 'dense', 8, 10), row('cuda', 'crisp', 8, 5), row('webgpu', 'dense', 8, 1), row('webgpu', 'crisp', 8, 2)], ['cuda', 'webgpu']);
    const cur = mk('second', [row('webgpu', 'dense', 8, 4), row('webgpu', 'crisp', 8, 1)], ['webgpu']);
    const m = mergeResults(prev, cur, ['webgpu']);
    expect(m.suites.latency!.rows.map((r) => `${r.backend} ${r.preset} ${r.ms.median}`)).toEqual([
      'cuda dense 10',
      'cuda crisp 5',
      'webgpu dense 4',
      'webgpu crisp 1',
    ]);
    expect(m.suites.crossover!.gates.map((g) => [g.backend, g.gate])).toEqual([
      ['cuda', 8],
      ['webgpu', 8],
    ]);
    expect(m.earlierRuns!.map((e) => e.command)).toEqual(['first']);
    // a later command with larger sizes of the same backend adds rows instead of replacing them
    const more = mk('third', [row('webgpu', 'dense', 16, 20), row('webgpu', 'crisp', 16, 8)], ['webgpu']);
    const m2 = mergeResults(m, more, ['webgpu']);
    expect(m2.suites.latency!.rows.filter((r) => r.backend === 'webgpu').map((r) => `${r.n} ${r.preset}`)).toEqual(['8 dense', '8 crisp', '16 dense', '16 crisp']);
    expect(m2.earlierRuns!.map((e) => e.command)).toEqual(['first', 'second']);
  });
});
