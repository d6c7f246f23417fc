import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { planPrefill, runPlan } from '@crisp/core';
import { writeNpy, writeSafetensors } from '@crisp/io';
import { mkdirSync } from 'node:fs';
import { cudaAvailability } from '@crisp/kernels-cuda';
import { crisp } from '@crisp/presets';
import { createReferenceBackend, massRecall, relativeError, sampleRows } from '@crisp/reference';
import { calibrateScenario, scenario, uploadScenario } from '@crisp/synth';
import { beforeAll, describe, expect, it } from 'vitest';
import { NOTE_RUN_MS, estimateLine } from './estimate.js';
import { formatRun } from './format.js';
import { main } from './main.js';
import type { RunSummary } from './run-job.js';
import { runCli, tempDir, testSeed } from './test-support.js';
import { cliVersion } from './version.js';

const SEED = testSeed();
const SHAPE = ['--n', '1536', '--heads', '4', '--kv-heads', '1', '--head-dim', '32'];
const SMALL = ['--backend', 'reference', ...SHAPE, '--seed', String(SEED), '--sample-rows', '16'];

describe('crisp run', () => {
  let summary: RunSummary;
  beforeAll(async () => {
    const r = await runCli(['run', ...SMALL, '--json']);
    expect(r.code, r.stderr).toBe(0);
    summary = JSON.parse(r.stdout);
  });

  it('--json prints only JSON with the values the reference computes', async () => {
    expect(summary.backend).toBe('reference');
    expect(summary.input).toMatchObject({ n: 1536, heads: 4, kvHeads: 1, headDim: 32, dtype: 'f32', seed: SEED });
    const p = summary.policies[0];
    expect(p.policy).toBe('crisp');
    expect(p.heads).toHaveLength(4);

    // Recompute independently: same scenario, reference backend, crisp preset.
    const sc = scenario('llama-like', { n: 1536, heads: 4, kvHeads: 1, headDim: 32, seed: SEED });
    const be = createReferenceBackend();
    const t = await uploadScenario(be, sc);
    const plan = await planPrefill(be, t, crisp);
    const sparse = await be.download((await runPlan(be, plan, t)).output);
    const dense = await be.download((await be.denseAttention(t.q, t.k, t.v)).output);
    const host = sc.rows(0, sc.n);
    const recall = massRecall(host.q, host.k, plan.mask!, { rows: sampleRows(sc.n, 16) });
    // the plan's per-head check: the exact mass of the proxy rows (the last 128) in its mask
    const proxy = massRecall(host.q, host.k, plan.mask!, { rows: Array.from({ length: 128 }, (_, i) => sc.n - 128 + i) });
    const err = relativeError(sparse, dense);
    for (let h = 0; h < 4; h++) {
      expect(p.heads[h].route).toBe(plan.routing!.routes[h]);
      expect(p.heads[h].score).toBeCloseTo(plan.routing!.scores[h], 12);
      expect(p.heads[h].density).toBeCloseTo(plan.density[h], 12);
      expect(p.heads[h].massRecall).toBeCloseTo(recall.perHead[h], 9);
      expect(p.heads[h].proxyRecall).toBeCloseTo(proxy.perHead[h], 9);
      expect(p.heads[h].outputError).toBeCloseTo(err.perHead[h], 6);
      expect(p.heads[h].kind).toBe(sc.truth.heads[h].kind);
    }
    expect(p.density).toBeCloseTo(plan.overallDensity, 12);
    expect(p.outputError).toBeCloseTo(err.overall, 6);
    expect(p.outputError).toBeGreaterThan(0);
    expect(p.outputError).toBeLessThan(0.5);
    expect(p.timeMs.runs).toHaveLength(1);
    expect(p.speedup).toBeGreaterThan(0);
    expect(summary.dense!.timeMs.median).toBeGreaterThan(0);
    expect(p.routingAgreement).toBeGreaterThanOrEqual(0);
    be.dispose();
  });

  it('prints a per-head table and a summary in text mode', async () => {
    const r = await runCli(['run', ...SMALL]);
    expect(r.code, r.stderr).toBe(0);
    const p = summary.policies[0];
    expect(r.stdout).toMatch(/^crisp run: scenario llama-like/);
    expect(r.stdout).toContain('head  ');
    expect(r.stdout).toContain(`density ${(100 * p.density).toFixed(1)}%`);
    expect(r.stdout).toContain(`mass recall ${(100 * p.massRecall).toFixed(1)}%`);
    for (const h of p.heads) expect(r.stdout).toMatch(new RegExp(`\\n${h.head}\\s+${h.kind}\\s+${h.route.toUpperCase()}`));
    expect(r.stdout).toMatch(/time [\d.]+ ms \(median of 1; plan [\d.]+ ms\) vs dense [\d.]+ ms: [\d.]+x/);
  });

  it("names a WebGPU run's attention and statistics kernels in its first line; a reference run has none", () => {
    expect(summary.kernels).toBeUndefined();
    const first = (x: string) => x.split('\n')[0];
    expect(first(formatRun(summary))).toMatch(/, backend reference$/);
    const gpu = formatRun({ ...summary, backend: 'webgpu', kernels: { attention: 'subgroup-matrix', statistics: 'subgroup-matrix' } });
    expect(first(gpu)).toMatch(/, backend webgpu \(attention kernel subgroup-matrix, proxy statistics subgroup-matrix\)$/);
  });

  it('says where a plan was made on the host although the backend plans on the device, and why', () => {
    const reason = "the backend's planner runs the routers cStruct, not jsd (router jsd)";
    const text = formatRun({ ...summary, policies: [{ ...summary.policies[0], hostReason: reason }] });
    expect(text).toContain(`planned on the host: ${reason}`);
    expect(formatRun(summary)).not.toContain('planned on the host');
  });

  it('says n/a for needle recall when the input has no needles', async () => {
    const args = ['run', '--backend', 'reference', '--n', '512', '--heads', '4', '--kv-heads', '1', '--head-dim', '32', '--no-dense', '--sample-rows', '4'];
    const j = await runCli([...args, '--json']);
    expect(j.code, j.stderr).toBe(0);
    expect((JSON.parse(j.stdout) as RunSummary).policies[0].needleRecall?.total).toBe(0);
    const t = await runCli(args);
    expect(t.stdout).toContain('needle recall n/a (the input has no needles)');
  });

  it('--no-dense skips the baseline: the same plan and mass recall, dense null, no output error or speedup', async () => {
    const r = await runCli(['run', ...SMALL, '--no-dense', '--json']);
    expect(r.code, r.stderr).toBe(0);
    const s: RunSummary = JSON.parse(r.stdout);
    expect(s.dense).toBeNull();
    const p = s.policies[0];
    const full = summary.policies[0];
    expect(p.heads.map((h) => h.density)).toEqual(full.heads.map((h) => h.density));
    expect(p.heads.map((h) => h.massRecall)).toEqual(full.heads.map((h) => h.massRecall));
    expect(p.heads.map((h) => h.outputError)).toEqual([null, null, null, null]);
    expect(p.outputError).toBeNull();
    expect(p.speedup).toBeNull();
    expect(p.timeMs.median).toBeGreaterThan(0);
    // and the text output says so instead of printing numbers
    const text = await runCli(['run', ...SMALL, '--no-dense']);
    expect(text.code, text.stderr).toBe(0);
    expect(text.stdout).toContain('dense baseline skipped (--no-dense): no output error or speedup');
    expect(text.stdout).toContain('output error not measured (no dense baseline)');
    expect(text.stdout).not.toMatch(/vs dense [\d.]+ ms|x$/m);
  });

  it('reads a Q/K/V dump with --qkv and gets the same plan as the scenario', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'crisp-cli-'));
    const file = join(dir, 'layer.safetensors');
    const sc = scenario('llama-like', { n: 1536, heads: 4, kvHeads: 1, headDim: 32, seed: SEED });
    const { q, k, v } = sc.rows(0, sc.n);
    await writeSafetensors(file, { q, k, v });
    const r = await runCli(['run', '--backend', 'reference', '--qkv', file, '--layout', 'nhd', '--sample-rows', '16', '--json']);
    expect(r.code, r.stderr).toBe(0);
    const fromFile: RunSummary = JSON.parse(r.stdout);
    expect(fromFile.input.source).toBe(file);
    const a = fromFile.policies[0];
    const b = summary.policies[0];
    expect(a.heads.map((h) => h.route)).toEqual(b.heads.map((h) => h.route));
    for (let h = 0; h < 4; h++) {
      expect(a.heads[h].density).toBe(b.heads[h].density);
      expect(a.heads[h].massRecall).toBeCloseTo(b.heads[h].massRecall, 12);
    }
    expect(a.needleRecall).toBeUndefined();

    // The same tensors as a directory of .npy files, head-major on disk ([H, n, d]).
    const npyDir = join(dir, 'npy');
    mkdirSync(npyDir);
    await writeNpy(join(npyDir, 'q.npy'), q, { layout: 'hnd' });
    await writeNpy(join(npyDir, 'k.npy'), k, { layout: 'hnd' });
    await writeNpy(join(npyDir, 'v.npy'), v, { layout: 'hnd' });
    const r2 = await runCli(['run', '--backend', 'reference', '--qkv', npyDir, '--layout', 'hnd', '--sample-rows', '16', '--json']);
    expect(r2.code, r2.stderr).toBe(0);
    const fromNpy: RunSummary = JSON.parse(r2.stdout);
    expect(fromNpy.policies[0].heads.map((h) => h.density)).toEqual(b.heads.map((h) => h.density));
    expect(fromNpy.policies[0].outputError).toBeCloseTo(b.outputError!, 9);
    // --layout also takes the shape it stands for
    const r3 = await runCli(['run', '--backend', 'reference', '--qkv', npyDir, '--layout', '[H, n, d]', '--sample-rows', '16', '--json']);
    expect(r3.code, r3.stderr).toBe(0);
    expect((JSON.parse(r3.stdout) as RunSummary).policies[0].outputError).toBe(fromNpy.policies[0].outputError);
  });

  it('refuses a dump whose q and k lengths differ (exit 1, says why)', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'crisp-cli-'));
    const file = join(dir, 'chunk.safetensors');
    const big = scenario('llama-like', { n: 1536, heads: 4, kvHeads: 1, headDim: 32, seed: SEED }).rows(0, 1536);
    const small = scenario('llama-like', { n: 1024, heads: 4, kvHeads: 1, headDim: 32, seed: SEED }).rows(0, 1024);
    await writeSafetensors(file, { q: small.q, k: big.k, v: big.v });
    const r = await runCli(['run', '--backend', 'reference', '--qkv', file]);
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(/^crisp: error UNSUPPORTED: .*q has 1024 rows and k 1536; crisp run needs full prefill/);
  });
});

describe('exit codes and messages', () => {
  const usage: [string[], RegExp][] = [
    [['run', '--alpha', '-1'], /--alpha must be a number in \(0, 1000000\); got '-1'/],
    [['run', '--gamma', '1.5'], /--gamma must be a number in \(0, 1\)/],
    [['run', '--backend', 'tpu'], /--backend must be one of auto, cuda, webgpu, reference; got 'tpu'/],
    [['run', '--n', 'abc'], /--n must be an integer/],
    [['run', '--block', '96'], /--block must be one of 64, 128/],
    [['run', '--preset', 'flexPrefill', '--alpha', '1.1'], /flexPrefill has no α/],
    [['run', '--heads', '6', '--kv-heads', '4'], /--heads \(6\) must be a multiple of --kv-heads \(4\)/],
    [['run', '--layout', 'hnd'], /--layout only applies with --qkv/],
    [['run', '--bogus'], /unknown option '--bogus'/],
    [['frobnicate'], /unknown command 'frobnicate'/],
    [['report', '--compare', 'nope'], /--compare must be one of/],
    [['calibrate', '--profile', 'gpt'], /--profile must be one of llama-like, qwen-like, retrieval, diffuse/],
    [[], /Usage: crisp/],
  ];
  for (const [args, msg] of usage) {
    it(`exits 2 on bad usage: crisp ${args.join(' ')}`, async () => {
      const r = await runCli(args);
      expect(r.code).toBe(2);
      expect(r.stderr).toMatch(msg);
      expect(r.stdout).toBe('');
    });
  }

  it('exits 1 with the error code and the path for a missing file', async () => {
    const r = await runCli(['run', '--backend', 'reference', '--qkv', '/nonexistent/layer.safetensors']);
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(/^crisp: error IO_ERROR: .*\/nonexistent\/layer\.safetensors/);
    expect(r.stdout).toBe('');
  });

  it('exits 1 with FORMAT_ERROR for a file that is not a tensor file', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'crisp-cli-'));
    const file = join(dir, 'notes.safetensors');
    writeFileSync(file, 'hello, this is text and not tensors');
    const r = await runCli(['run', '--backend', 'reference', '--qkv', file]);
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(/^crisp: error FORMAT_ERROR: /);
  });

  it('exits 1 at once when the report cannot be written', async () => {
    const r = await runCli(['report', '--backend', 'reference', '--out', '/nonexistent-dir/report.html']);
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(/^crisp: error IO_ERROR: cannot write \/nonexistent-dir\/report.html \(--out\): its directory \/nonexistent-dir does not exist/);
  });

  it.skipIf(cudaAvailability().available)('exits 1 naming what is missing when --backend cuda has no driver', async () => {
    const r = await runCli(['run', '--backend', 'cuda']);
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(/crisp: error BACKEND_UNAVAILABLE: CUDA: .+; use --backend auto or reference/);
  });

  for (const cmd of [[], ['run'], ['report'], ['calibrate']]) {
    it(`--help works: crisp ${cmd.join(' ')} --help`, async () => {
      const r = await runCli([...cmd, '--help']);
      expect(r.code).toBe(0);
      expect(r.stdout).toMatch(/Usage: crisp/);
      if (cmd[0] === 'run') for (const f of ['--qkv', '--layout', '--names', '--npy-uint16', '--preset', '--alpha', '--gamma', '--tau-proxy', '--block', '--backend', '--seed', '--json']) expect(r.stdout).toContain(f);
      if (cmd[0] === 'report') expect(r.stdout).toContain('--out');
      if (cmd.length === 0) for (const c of ['run', 'report', 'calibrate']) expect(r.stdout).toContain(c);
    });
  }
});

describe('crisp calibrate', () => {
  it('prints the numbers calibrateScenario computes', async () => {
    const args = ['calibrate', '--backend', 'reference', '--n', '2048', '--heads', '4', '--kv-heads', '1', '--head-dim', '32', '--seed', String(SEED)];
    const r = await runCli([...args, '--json']);
    expect(r.code, r.stderr).toBe(0);
    const got = JSON.parse(r.stdout);
    const sc = scenario('llama-like', { n: 2048, heads: 4, kvHeads: 1, headDim: 32, seed: SEED });
    const want = await calibrateScenario(createReferenceBackend(), sc);
    expect(got.perHead).toHaveLength(4);
    for (let h = 0; h < 4; h++) {
      expect(got.perHead[h].sinkMass).toBeCloseTo(want.perHead[h].sinkMass, 12);
      expect(got.perHead[h].cStruct).toBeCloseTo(want.perHead[h].cStruct, 12);
      expect(got.perHead[h].top1Where).toBe(want.perHead[h].top1Where);
      expect(got.perHead[h].decades).toBeCloseTo(want.perHead[h].decades, 9);
    }
    const text = await runCli(args);
    expect(text.code).toBe(0);
    expect(text.stdout).toContain('sink mass');
    expect(text.stdout).toContain(`${want.perHead[0].sinkMass.toFixed(3)}`);
    expect(text.stdout).toMatch(/top-1 block at sink\/local for [\d.]+% of heads/);
  });
});

describe('crisp --version', () => {
  const pkg = JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8')) as { name: string; version: string };
  for (const flag of ['--version', '-V']) {
    it(`${flag} prints apps/cli's package.json version on stdout and exits 0`, async () => {
      expect(pkg.name).toBe('@crisp/cli');
      const r = await runCli([flag]);
      expect(r.code).toBe(0);
      expect(r.stdout).toBe(`${pkg.version}\n`);
      expect(r.stderr).toBe('');
    });
  }

  it('--help lists -V, --version', async () => {
    const r = await runCli(['--help']);
    expect(r.code).toBe(0);
    expect(r.stdout).toMatch(/-V, --version\s+print crisp's version/);
  });

  it('reads the version of the package.json it finds above the module, and refuses a tree without one', () => {
    const dir = tempDir();
    mkdirSync(join(dir, 'pkg', 'dist', 'deep'), { recursive: true });
    writeFileSync(join(dir, 'pkg', 'package.json'), JSON.stringify({ name: '@crisp/cli', version: '9.8.7-test' }));
    // a nearer package.json of another package is passed over
    writeFileSync(join(dir, 'pkg', 'dist', 'package.json'), JSON.stringify({ name: 'other', version: '1.0.0' }));
    expect(cliVersion(pathToFileURL(join(dir, 'pkg', 'dist', 'deep', 'main.js')))).toBe('9.8.7-test');
    const lone = tempDir();
    expect(() => cliVersion(pathToFileURL(join(lone, 'main.js')))).toThrow(/cannot find the package.json of @crisp\/cli/);
  });
});

describe('crisp run: the estimate, the phases and the progress', () => {
  const ARGS = ['run', '--backend', 'reference', '--n', '2048', '--heads', '2', '--kv-heads', '1', '--head-dim', '32', '--seed', String(SEED), '--sample-rows', '8', '--json'];
  let s: RunSummary;
  let stderr: string;
  beforeAll(async () => {
    const r = await runCli(ARGS);
    expect(r.code, r.stderr).toBe(0);
    s = JSON.parse(r.stdout);
    stderr = r.stderr;
  });

  it('prints an estimate on the reference backend, within a factor of 4 of the time the work took', () => {
    const e = s.estimate!;
    const p = s.phasesMs;
    expect(e.msPerKey).toBeGreaterThan(0);
    // dense: H·n(n+1)/2 keys at the calibrated rate, one pass
    expect(e.denseMs).toBeCloseTo(e.msPerKey * ((2 * 2048 * 2049) / 2), 6);
    expect(e.sparse).toHaveLength(1);
    expect(e.sparse[0].density).toBeCloseTo(s.policies[0].density, 12);
    expect(e.totalMs).toBeCloseTo(e.denseMs! + e.sparse[0].ms + e.checkMs, 6);
    const actual = p.dense! + p.prefill + p.check;
    expect(e.totalMs / actual, `estimate ${e.totalMs} ms, took ${actual} ms`).toBeGreaterThan(1 / 4);
    expect(e.totalMs / actual, `estimate ${e.totalMs} ms, took ${actual} ms`).toBeLessThan(4);
    // a run this short gets no line (the estimate is in the JSON)
    if (e.totalMs < NOTE_RUN_MS) expect(stderr).not.toMatch(/this run takes/);
  });

  it('says the estimate as a note from 10 s, as a warning with what to change over a minute', () => {
    const e = { msPerKey: 1e-6, calibrationMs: 400, denseMs: 2 * 45_000, sparse: [{ policy: 'crisp', density: 0.123, planMs: 500, ms: 21_000 }], checkMs: 3000, totalMs: 114_000 };
    expect(estimateLine({ ...e, totalMs: 9_999 }, 2)).toBe('');
    expect(estimateLine({ ...e, denseMs: 8000, sparse: [], checkMs: 0, totalMs: 8000 + 4000 }, 1)).toBe(
      'note: this run takes about 12 s on this machine (dense 8.0 s; from a 0.4 s calibration)\n',
    );
    expect(estimateLine(e, 2)).toBe(
      'warning: this run takes about 1.9 min on this machine (dense 2 × 45 s, crisp 21 s at density 12.3%, exact rows 3.0 s; from a 0.4 s calibration); --no-dense skips the dense baseline, a smaller --n is quadratically faster, a GPU --backend is far faster\n',
    );
    expect(estimateLine({ ...e, denseMs: null, totalMs: 24 * 3_600_000 }, 2)).toMatch(/^warning: this run takes about 24\.0 h .*; a smaller --n is quadratically faster, a GPU --backend is far faster\n$/);
  });

  it('times the phases: each one positive, together no more than the wall time', () => {
    const p = s.phasesMs;
    for (const k of ['generate', 'estimate', 'dense', 'prefill', 'check', 'wall'] as const) expect(p[k], k).toBeGreaterThan(0);
    expect(p.upload).toBeGreaterThanOrEqual(0);
    const sum = p.backend + p.generate! + p.upload + p.estimate! + p.dense! + p.prefill + p.check;
    expect(sum).toBeLessThanOrEqual(p.wall);
    // the timed runs sit inside their phases
    expect(p.dense!).toBeGreaterThanOrEqual(s.dense!.timeMs.runs[0]);
    expect(p.prefill).toBeGreaterThanOrEqual(s.policies[0].timeMs.runs[0]);
    // in-process there is no worker entry: one thread
    expect(s.threads).toBe(1);
  });

  it('the text output ends with the phases line', async () => {
    const r = await runCli(ARGS.slice(0, -1));
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toMatch(
      /\nphases: backend [\d.]+ s, generate [\d.]+ s \(1 thread\), upload [\d.]+ s, estimate [\d.]+ s, dense [\d.]+ s, plan\+prefill [\d.]+ s, check [\d.]+ s; wall [\d.]+ s\n$/,
    );
  });

  it('under --json with stderr a terminal: stdout is the JSON document alone, the bars move on stderr inside a pass', async () => {
    let stdout = '';
    let err = '';
    const io = { stdout: { write: (x: string) => (stdout += x), isTTY: true }, stderr: { write: (x: string) => (err += x), isTTY: true, columns: 120 } };
    // n 4096 H 2: a dense pass of some seconds, long enough for the bar to draw inside it
    const code = await main(['node', 'crisp', 'run', '--backend', 'reference', '--n', '4096', '--heads', '2', '--kv-heads', '1', '--head-dim', '32', '--sample-rows', '4', '--json'], io);
    expect(code, err).toBe(0);
    expect(JSON.parse(stdout).input.n).toBe(4096);
    // frames start at column 1: ESC [ 1 G (or a carriage return)
    const frames = err.split(new RegExp(`\r|${String.fromCharCode(27)}\\[1G`)).filter((f) => f.startsWith('dense baseline'));
    const inside = frames.map((f) => Number(/(\d+)% \| pass 1\/1/.exec(f)?.[1] ?? Number.NaN)).filter((x) => x > 0 && x < 100);
    expect(inside.length, err.slice(0, 2000)).toBeGreaterThan(0);
    expect(frames.some((f) => /ETA \d/.test(f))).toBe(true);
  });

  it('under --no-dense the estimate leaves the dense baseline out', async () => {
    const r = await runCli([...ARGS, '--no-dense']);
    expect(r.code, r.stderr).toBe(0);
    const t: RunSummary = JSON.parse(r.stdout);
    expect(t.estimate!.denseMs).toBeNull();
    expect(t.phasesMs.dense).toBeNull();
    expect(r.stderr).not.toMatch(/\(dense /);
  });
});
