import { existsSync, mkdtempSync, readFileSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { DENSE_SKIPPED } from './format.js';
import { buildReportHtml, gammaCut, noiseFloorMu } from './report.js';
import type { RunSummary } from './run-job.js';
import { runCli, testSeed } from './test-support.js';

const SEED = testSeed();
const CHROMIUM = '/usr/bin/chromium';

describe('report helpers', () => {
  it('noise floor μ and the γ cut follow docs/ALGORITHM.md', () => {
    // μ = (1 - 0.9 - 0.04) / (5 - 2) = 0.02
    expect(noiseFloorMu([0.9, 0.03, 0.02, 0.01, 0.04])).toBeCloseTo(0.02, 15);
    expect(noiseFloorMu([0.99, 0.01])).toBe(0);
    // sorted 0.9, 0.04, 0.03 ... reaches 0.95 at the 3rd block
    expect(gammaCut([0.9, 0.04, 0.03, 0.02, 0.01], 0.95)).toBe(3);
    expect(gammaCut([0.5, 0.2], 0.95)).toBe(2);
  });
});

describe('crisp report in headless Chromium', () => {
  const have = existsSync(CHROMIUM);
  if (!have) console.log(`skipping the Chromium render test: ${CHROMIUM} is absent (apt-get install chromium)`);
  it.skipIf(!have)('renders every plot offline and carries the run numbers', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'crisp-report-'));
    const out = join(dir, 'report.html');
    const r = await runCli([
      'report',
      '--backend',
      'reference',
      '--n',
      '1536',
      '--heads',
      '4',
      '--kv-heads',
      '1',
      '--head-dim',
      '32',
      '--seed',
      String(SEED),
      '--sample-rows',
      '16',
      '--out',
      out,
    ]);
    expect(r.code, r.stderr).toBe(0);
    const m = /crisp density ([\d.]+%), mass recall ([\d.]+%), output error ([\d.e-]+), ([\d.]+)x vs dense/.exec(r.stdout);
    expect(m, r.stdout).not.toBeNull();
    const [, density, recall, error] = m!;
    const html = readFileSync(out, 'utf8');
    // Outside the inlined scripts, nothing refers to another file or host.
    const shell = html.replace(/<script>[\s\S]*?<\/script>/g, '');
    expect(/<script[^>]*src=|<link[^>]*href=|https?:\/\//.test(shell)).toBe(false);
    expect(html.length).toBeGreaterThan(4_000_000); // plotly is inside

    const { chromium } = await import('playwright-core');
    const profile = mkdtempSync(join(tmpdir(), 'crisp-chromium-'));
    const ctx = await chromium.launchPersistentContext(profile, {
      executablePath: CHROMIUM,
      headless: true,
      args: [
        '--headless',
        '--no-sandbox',
        '--disable-gpu',
        '--disable-background-networking',
        '--no-first-run',
        '--disable-component-update',
        '--disable-sync',
      ],
      viewport: { width: 1400, height: 1000 },
    });
    try {
      const page = await ctx.newPage();
      const external: string[] = [];
      await page.route('**/*', (route) => {
        const url = route.request().url();
        if (!url.startsWith('file:')) external.push(url);
        return url.startsWith('file:') ? route.continue() : route.abort();
      });
      const errors: string[] = [];
      page.on('pageerror', (e) => errors.push(e.message));
      await page.goto(`file://${out}`);
      await page.evaluate('window.__crispPlots');
      expect(errors).toEqual([]);
      expect(external).toEqual([]);

      // 4 Figure-1 plots (one per head), 2 mask heatmaps (crisp, flexPrefill), C_struct vs JSD, density, error.
      const plots = page.locator('.js-plotly-plot');
      expect(await plots.count()).toBe(9);
      for (let i = 0; i < 9; i++) expect(await plots.nth(i).locator('svg.main-svg').count()).toBeGreaterThan(0);

      // Figure 1: log y axis, the α·μ floor and the γ cut drawn as shapes, sink mass in the title.
      const fig1 = page.locator('#fig1-h0');
      expect(await fig1.locator('.shapelayer path').count()).toBeGreaterThanOrEqual(2);
      // masses in [0, 1] to two decimals: a slash head's C_struct can round to 1.00 (seed 976072659)
      expect(await fig1.locator('.gtitle').textContent()).toMatch(/sink=(0\.\d\d|1\.00), C_struct=(0\.\d\d|1\.00)/);
      expect(await fig1.locator('.annotation-text').allTextContents()).toEqual(
        expect.arrayContaining([expect.stringMatching(/^α·μ=/), expect.stringMatching(/^γ=0.95 cut: \d+ blocks$/)]),
      );

      // The crisp mask plot's title carries the run's density; the summary table its numbers.
      expect(await page.locator('#mask-0 .gtitle').textContent()).toBe(`crisp: selected blocks (density ${density})`);
      const summary = await page.locator('#summary').textContent();
      for (const x of [density, recall, error]) expect(summary).toContain(x);

      // Density bars: one label per head and policy; crisp's labels average to the overall density.
      const labels = await page.locator('#density .bartext').allTextContents();
      expect(labels).toHaveLength(8);
      const crispLabels = await page.locator('#density .trace.bars').first().locator('.bartext').allTextContents();
      const mean = crispLabels.map((s) => Number.parseFloat(s)).reduce((a, b) => a + b, 0) / crispLabels.length;
      expect(Math.abs(mean - Number.parseFloat(density))).toBeLessThan(0.11);
      expect((await page.locator('#error .bartext').allTextContents()).every((s) => /^\d\.\d{4}$|e-/.test(s))).toBe(true);

      const shot = join(dir, 'report.png');
      await page.screenshot({ path: shot, fullPage: true });
      console.log(`report screenshot: ${shot}`);
      expect(statSync(shot).size).toBeGreaterThan(50_000);
    } finally {
      await ctx.close();
    }
  });
});

describe('report without a dense baseline (--no-dense)', () => {
  const SMALL = ['--backend', 'reference', '--n', '1024', '--heads', '2', '--kv-heads', '1', '--head-dim', '32', '--seed', String(SEED), '--sample-rows', '4', '--no-dense'];

  it('builds the page from the JSON of `crisp run --no-dense --json`: says the comparison was skipped, no error plot', async () => {
    const r = await runCli(['run', ...SMALL, '--json']);
    expect(r.code, r.stderr).toBe(0);
    const s = JSON.parse(r.stdout) as RunSummary;
    expect(s.dense).toBeNull();
    const html = buildReportHtml(s, { alpha: 1, gamma: 0.95, tauProxy: 0.2 });
    expect(html).toContain(DENSE_SKIPPED);
    expect(html).not.toContain('id="error"');
    expect(html).toMatch(/data-metric="output-error">-<\/td>/);
    expect(html).toMatch(/<td class="num">-<\/td><\/tr>/);
    expect(html).toContain(`data-metric="density">${(100 * s.policies[0].density).toFixed(1)}%`);
  });

  it('crisp report --no-dense writes the page and says the comparison was skipped', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'crisp-report-'));
    const out = join(dir, 'report.html');
    const r = await runCli(['report', ...SMALL, '--compare', 'flexPrefill', '--out', out]);
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toMatch(/^wrote .*report\.html \([\d.]+ MB\): crisp density [\d.]+%, mass recall [\d.]+%, dense baseline skipped \(--no-dense\)/);
    expect(readFileSync(out, 'utf8')).toContain(DENSE_SKIPPED);
  });
});
