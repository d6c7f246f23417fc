/**
 * The run itself, in process, on the float64 reference at tiny sizes: a fresh nested
 * --out folder, --merge with no bench.json yet, bench.json rewritten after every finished
 * size (so a run killed at a wall-clock limit leaves its data), and --deadline-s.
 */
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ALL_PROFILE_NAMES } from '@crisp/synth';
import { afterAll, describe, expect, it } from 'vitest';
import { main } from './main.js';
import type { BenchResult } from './result.js';

const root = mkdtempSync(join(tmpdir(), 'crisp-bench-run-'));
afterAll(() => rmSync(root, { recursive: true, force: true }));
const read = (dir: string): BenchResult => JSON.parse(readFileSync(join(dir, 'bench.json'), 'utf8'));
const tiny = ['--backends', 'reference', '--curve-sizes', '8k,16k', '--acc-sizes', '1024', '--acc-shape', '2,1,64', '--acc-rows', '4', '--floors-n', '1024', '--quiet'];

describe('crisp-bench run', () => {
  it('writes into a fresh nested --out, --merge with no bench.json starts one, and every size is on disk before the next starts', async () => {
    const out = join(root, 'fresh', 'nested');
    const seen: BenchResult[] = [];
    const log = (line: string) => {
      // When the second proxy size is logged, the first must already be in bench.json.
      if (/O\(n\) reference proxy n=2048/.test(line)) seen.push(read(out));
    };
    const args = ['node', 'crisp-bench', ...tiny.filter((x) => x !== '--quiet'), '--suites', 'onCurve', '--proxy-sizes', '1024,2048', '--merge', '--out', out];
    expect(await main(args, { log })).toBe(0);
    expect(seen).toHaveLength(1);
    expect(seen[0].inProgress).toBe('onCurve');
    expect(seen[0].suites.onCurve!.proxy.map((r) => r.n)).toEqual(expect.arrayContaining([1024]));
    expect(seen[0].suites.onCurve!.proxy.some((r) => r.n === 2048)).toBe(false);
    const done = read(out);
    expect(done.inProgress).toBeUndefined();
    expect(done.earlierRuns).toBeUndefined();
    expect([...new Set(done.suites.onCurve!.proxy.map((r) => r.n))]).toEqual([1024, 2048]);
    for (const f of ['bench.md', 'headline.md', 'on-curve.svg', 'on-curve-proxy.svg']) expect(existsSync(join(out, f)), f).toBe(true);
    // A second --merge run adds a suite and keeps the first run's rows and command.
    expect(await main(['node', 'crisp-bench', ...tiny, '--suites', 'accuracy', '--acc-flex-gammas', '0.999,0.99', '--acc-guard-alphas', '2', '--merge', '--out', out])).toBe(0);
    const merged = read(out);
    expect(merged.suites.onCurve!.proxy).toHaveLength(done.suites.onCurve!.proxy.length);
    expect(merged.suites.accuracy!.rows.length).toBeGreaterThan(0);
    // FlexPrefill at the γ asked for, beside the presets, and the table at matched error
    expect(merged.config.accuracy.flexGammas).toEqual([0.99, 0.999]);
    const policies = new Set(merged.suites.accuracy!.rows.map((x) => x.policy));
    expect(merged.config.accuracy.guardAlphas).toEqual([2]);
    for (const p of ['crispGuarded', 'crispGuarded(VS α=2)', 'flexPrefill', 'flexPrefill(γ=0.99)', 'flexPrefill(γ=0.999)']) expect(policies.has(p), p).toBe(true);
    expect(readFileSync(join(out, 'bench.md'), 'utf8')).toContain('crispGuarded against FlexPrefill at matched error');
    expect(merged.earlierRuns!.map((e) => e.command)).toEqual([done.command]);
    expect(readFileSync(join(out, 'bench.md'), 'utf8')).toContain(`Reproduce: \`${done.command}\``);
  });

  it('--fold merges another bench.json into a fresh output before the run', async () => {
    const a = join(root, 'fold-a');
    const b = join(root, 'fold-b');
    expect(await main(['node', 'crisp-bench', ...tiny, '--suites', 'onCurve', '--proxy-sizes', '1024', '--out', a])).toBe(0);
    expect(await main(['node', 'crisp-bench', ...tiny, '--suites', 'accuracy', '--fold', join(a, 'bench.json'), '--out', b])).toBe(0);
    const r = read(b);
    expect(r.suites.onCurve!.proxy.length).toBeGreaterThan(0);
    expect(r.suites.accuracy!.rows.length).toBeGreaterThan(0);
    expect(r.earlierRuns!.map((e) => e.command)).toEqual([read(a).command]);
    expect(await main(['node', 'crisp-bench', ...tiny, '--suites', 'onCurve', '--fold', join(root, 'nowhere.json'), '--out', b])).toBe(2);
  });

  it('with --deadline-s spent, starts nothing more, reports why, and still writes the files', async () => {
    const out = join(root, 'deadline');
    expect(await main(['node', 'crisp-bench', ...tiny, '--suites', 'accuracy,onCurve,floors', '--proxy-sizes', '1024', '--deadline-s', '0.001', '--out', out])).toBe(0);
    const r = read(out);
    expect(r.suites.accuracy!.rows).toHaveLength(0);
    expect(r.suites.accuracy!.skipped.map((s) => s.profile)).toEqual(r.config.accuracy.profiles);
    expect(r.config.accuracy.profiles).toEqual(ALL_PROFILE_NAMES);
    for (const s of [...r.suites.accuracy!.skipped, ...r.suites.onCurve!.skipped, ...r.suites.floors!.skipped]) expect(s.reason).toMatch(/--deadline-s/);
    expect(r.suites.floors!.skipped.map((s) => s.profile)).toEqual(r.config.floors.profiles);
    expect(readFileSync(join(out, 'bench.md'), 'utf8')).toContain('--deadline-s');
  });

  it('--render-only rewrites the report of an existing bench.json and leaves its measurements alone', async () => {
    const out = join(root, 'render');
    expect(await main(['node', 'crisp-bench', ...tiny, '--suites', 'onCurve', '--proxy-sizes', '1024', '--out', out])).toBe(0);
    const before = readFileSync(join(out, 'bench.json'), 'utf8');
    rmSync(join(out, 'bench.md'));
    rmSync(join(out, 'on-curve.svg'));
    expect(await main(['node', 'crisp-bench', '--render-only', '--quiet', '--out', out])).toBe(0);
    expect(readFileSync(join(out, 'bench.json'), 'utf8')).toBe(before);
    expect(readFileSync(join(out, 'bench.md'), 'utf8')).toContain('## The O(n) curve');
    expect(existsSync(join(out, 'on-curve.svg'))).toBe(true);
    expect(await main(['node', 'crisp-bench', '--render-only', '--quiet', '--out', join(root, 'empty')])).toBe(2);
  });

  it('--render-only --fold merges other bench.json files into the output first, and writes nothing when one cannot be read', async () => {
    const out = join(root, 'fold-into');
    const other = join(root, 'fold-from');
    expect(await main(['node', 'crisp-bench', ...tiny, '--suites', 'onCurve', '--proxy-sizes', '1024,2048', '--out', out])).toBe(0);
    expect(await main(['node', 'crisp-bench', ...tiny, '--suites', 'onCurve', '--proxy-sizes', '2048', '--out', other])).toBe(0);
    const base = read(out);
    const fresh = read(other);
    const bad = join(root, 'not-a-result.json');
    writeFileSync(bad, '{"schema":"something-else"}');
    const before = readFileSync(join(out, 'bench.json'), 'utf8');
    expect(await main(['node', 'crisp-bench', '--render-only', '--quiet', '--fold', `${join(other, 'bench.json')},${bad}`, '--out', out])).toBe(2);
    expect(readFileSync(join(out, 'bench.json'), 'utf8')).toBe(before);
    expect(await main(['node', 'crisp-bench', '--render-only', '--quiet', '--fold', join(other, 'bench.json'), '--out', out])).toBe(0);
    const merged = read(out);
    const proxy = (r: BenchResult, n: number) => r.suites.onCurve!.proxy.filter((x) => x.n === n);
    // the folded file's 2048 rows replace the output's; its 1024 rows stay, naming their run
    expect(proxy(merged, 2048)).toEqual(proxy(fresh, 2048).map((x) => ({ ...x, run: fresh.startedAt })));
    expect(proxy(merged, 1024).map((x) => x.run)).toEqual(proxy(base, 1024).map(() => base.startedAt));
    expect(merged.startedAt).toBe(fresh.startedAt);
    expect(merged.earlierRuns!.map((e) => e.startedAt)).toEqual([base.startedAt]);
    expect(readFileSync(join(out, 'bench.md'), 'utf8')).toContain('Merged with the results of');
  });

  it('answers an unknown backend or option with a usage error (2), before anything starts', async () => {
    const out = join(root, 'bad-backend');
    expect(await main(['node', 'crisp-bench', '--backends', 'reference,nope', '--quiet', '--out', out])).toBe(2);
    expect(existsSync(out)).toBe(false);
    expect(await main(['node', 'crisp-bench', '--no-such-option', '--quiet', '--out', out])).toBe(2);
    expect(await main(['node', 'crisp-bench', '--help'])).toBe(0);
  });

  it('rejects a bad --deadline-s', async () => {
    expect(await main(['node', 'crisp-bench', ...tiny, '--deadline-s', '0', '--out', join(root, 'bad')])).toBe(2);
  });

  it('rejects an α that is not > 0 in --acc-guard-alphas', async () => {
    for (const bad of ['0', '-1,2', 'x', '', 'Infinity']) {
      expect(await main(['node', 'crisp-bench', ...tiny, '--suites', 'accuracy', '--acc-guard-alphas', bad, '--out', join(root, 'bad')]), bad).toBe(2);
    }
  });

  it('rejects a γ outside (0, 1) in --acc-flex-gammas, and takes none', async () => {
    for (const bad of ['0.99,1', '0', 'x', '']) {
      expect(await main(['node', 'crisp-bench', ...tiny, '--suites', 'accuracy', '--acc-flex-gammas', bad, '--out', join(root, 'bad')]), bad).toBe(2);
    }
    const out = join(root, 'no-gammas');
    expect(await main(['node', 'crisp-bench', ...tiny, '--suites', 'accuracy', '--acc-flex-gammas', 'none', '--out', out])).toBe(0);
    expect(read(out).suites.accuracy!.rows.some((x) => x.policy.startsWith('flexPrefill(γ='))).toBe(false);
  });
});
