import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { BrowserContext, Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DENSE_SKIPPED } from './format.js';
import { buildReportHtml, gammaCut, noiseFloorMu } from './report.js';
import type { RunSummary } from './run-job.js';
import { runCli, testSeed } from './test-support.js';
import { signalBlocks } from './truth-blocks.js';

const SEED = testSeed();
const CHROMIUM = '/usr/bin/chromium';
const REPO = join(dirname(fileURLToPath(import.meta.url)), '../../..');
/** CRISP_UPDATE_SCREENSHOTS=1 writes the page shots to docs/screenshots (see docs/screenshots/README.md) */
const SHOTS = process.env.CRISP_UPDATE_SCREENSHOTS === '1' ? join(REPO, 'docs/screenshots') : undefined;
const SHAPE = ['--backend', 'reference', '--heads', '4', '--kv-heads', '1', '--head-dim', '32', '--seed', String(SEED), '--sample-rows', '16'];
const SECTIONS = ['provenance', 'data', 'numbers', 'mass-cliff', 'masks', 'routing', 'per-head', 'time', 'sweep', 'scaling'];

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
  const dir = mkdtempSync(join(tmpdir(), 'crisp-report-'));
  let ctx: BrowserContext | undefined;

  beforeAll(async () => {
    if (!have) return;
    const { chromium } = await import('playwright-core');
    ctx = await chromium.launchPersistentContext(mkdtempSync(join(tmpdir(), 'crisp-chromium-')), {
      executablePath: CHROMIUM,
      headless: true,
      args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking', '--no-first-run', '--disable-component-update', '--disable-sync'],
      viewport: { width: 1400, height: 1000 },
    });
    // Playwright's own 30 s default is a speed check: the page carries Plotly inline (megabytes
    // of script), and on 2 busy CI cores its load event has taken longer than that. The test's
    // own timeout stays the hang guard.
    ctx.setDefaultTimeout(240_000);
  });
  afterAll(async () => {
    await ctx?.close();
  });

  /** Open a report offline; every plot drawn, no page or console error, no request off file:. */
  async function open(file: string): Promise<Page> {
    const page = await ctx!.newPage();
    const external: string[] = [];
    await page.route('**/*', (route) => {
      const url = route.request().url();
      const local = url.startsWith('file:') || url.startsWith('data:');
      if (!local) external.push(url);
      return local ? route.continue() : route.abort();
    });
    const errors: string[] = [];
    page.on('pageerror', (e) => errors.push(e.message));
    page.on('console', (m) => {
      if (m.type() === 'error' || m.type() === 'warning') errors.push(`console ${m.type()}: ${m.text()}`);
    });
    await page.goto(`file://${file}`);
    await page.evaluate('window.__crispPlots');
    expect(errors).toEqual([]);
    expect(external).toEqual([]);
    // Every section is there, and each either draws its plots or says why not.
    for (const id of SECTIONS) {
      const sec = page.locator(`section#${id}`);
      expect(await sec.count(), id).toBe(1);
      const shown = await sec.getAttribute('data-shown');
      if (shown === 'no') expect(await sec.locator('.why').textContent(), id).toMatch(/^Not shown: .{20,}\.$/);
      else if (shown === 'yes') {
        const plots = sec.locator('.js-plotly-plot');
        expect(await plots.count(), id).toBeGreaterThan(0);
        for (let i = 0; i < (await plots.count()); i++) expect(await plots.nth(i).locator('svg.main-svg').count(), id).toBeGreaterThan(0);
      }
    }
    return page;
  }

  async function shot(page: Page, name: string): Promise<void> {
    const out = SHOTS ?? dir;
    mkdirSync(out, { recursive: true });
    const path = join(out, name);
    await page.screenshot({ path, fullPage: true });
    console.log(`report screenshot: ${path}`);
    expect(statSync(path).size).toBeGreaterThan(50_000);
  }

  it.skipIf(!have)('renders every section of a fresh run with --sweep offline, with the run numbers', async () => {
    const out = join(dir, 'report.html');
    const r = await runCli(['report', ...SHAPE, '--n', '1536', '--sweep', '--out', out]);
    expect(r.code, r.stderr).toBe(0);
    const m = /crisp density ([\d.]+%), mass recall ([\d.]+%), output error ([\d.e-]+), ([\d.]+)x vs dense; sweep of 14 plans/.exec(r.stdout);
    expect(m, r.stdout).not.toBeNull();
    const [, density, recall, error] = m!;
    const html = readFileSync(out, 'utf8');
    // Outside the inlined scripts, nothing refers to another file or host.
    const shell = html.replace(/<script>[\s\S]*?<\/script>/g, '');
    expect(/<script[^>]*src=|<link[^>]*href="(?!data:)|https?:\/\//.test(shell)).toBe(false);
    expect(html.length).toBeGreaterThan(4_000_000); // plotly is inside

    const page = await open(out);
    // Every section is drawn but the plots against n (one size).
    const shown = await page.locator('section').evaluateAll((xs) => xs.map((x) => `${x.id}:${x.getAttribute('data-shown') ?? 'yes'}`));
    expect(shown).toEqual(SECTIONS.map((id) => `${id}:${id === 'scaling' ? 'no' : 'yes'}`));
    expect(await page.locator('#scaling .why').textContent()).toContain('one size only (n=1536)');

    // Figure 1: log y axis, the α·μ floor and the γ cut drawn as shapes, sink mass in the title.
    const fig1 = page.locator('#fig1-h0');
    expect(await fig1.locator('.shapelayer path').count()).toBeGreaterThanOrEqual(2);
    // masses in [0, 1] to two decimals: a slash head's C_struct can round to 1.00 (seed 976072659)
    expect(await fig1.locator('.gtitle').textContent()).toMatch(/sink=(0\.\d\d|1\.00), C_struct=(0\.\d\d|1\.00)/);
    expect(await fig1.locator('.annotation-text').allTextContents()).toEqual(
      expect.arrayContaining([expect.stringMatching(/^α·μ=/), expect.stringMatching(/^γ=0.95 cut: \d+ blocks$/)]),
    );

    // The crisp mask plot: the run's density in the title, a colour key, and the overlay marks
    // exactly the ground truth's signal blocks that the drawn mask leaves out.
    const mask = page.locator('#mask-0');
    expect(await mask.locator('.gtitle').textContent()).toBe(`crisp: selected blocks (density ${density})`);
    expect(await mask.locator('.colorbar .cbaxis text').allTextContents()).toEqual(['skipped', 'selected']);
    expect(await mask.locator('.annotation-text').allTextContents()).toEqual(['× signal blockmissed (truth)']);
    const fig = (await page.evaluate('FIGS.find((f) => f.id === "mask-0")')) as { data: { z?: (number | null)[][]; x?: number[]; y?: number[] }[] };
    const summary = JSON.parse(Buffer.from((await page.locator('#download-0').getAttribute('href'))!.split(',')[1], 'base64').toString('utf8')) as RunSummary;
    for (let h = 0; h < 4; h++) {
      const z = fig.data[2 * h].z!;
      const expected = signalBlocks(summary.truth!, h, summary.blockSize, summary.numBlocks).filter(([I, J]) => z[I][J] === 0);
      const drawn = fig.data[2 * h + 1];
      expect(drawn.y!.map((I, t) => [I, drawn.x![t]]), `head ${h}`).toEqual(expected);
    }
    expect(await mask.locator('.scatterlayer .point').count()).toBe(fig.data[1].x!.length);

    // The download link carries the run: its numbers are the page's.
    expect(summary.policies[0].density).toBeCloseTo(Number.parseFloat(density) / 100, 3);
    expect(summary.provenance?.commit).toBe(execFileSync('git', ['rev-parse', 'HEAD'], { cwd: REPO, encoding: 'utf8' }).trim());
    const table = await page.locator('#summary').textContent();
    for (const x of [density, recall, error]) expect(table).toContain(x);
    expect(await page.locator('#provenance-table code.commit').textContent()).toBe(summary.provenance!.commit);

    // Density bars: one label per head and policy (8 bars fit); crisp's average to the overall density.
    expect(await page.locator('#density .bartext').allTextContents()).toHaveLength(8);
    const crispLabels = await page.locator('#density .trace.bars').first().locator('.bartext').allTextContents();
    const mean = crispLabels.map((s) => Number.parseFloat(s)).reduce((a, b) => a + b, 0) / crispLabels.length;
    expect(Math.abs(mean - Number.parseFloat(density))).toBeLessThan(0.11);
    expect((await page.locator('#error .bartext').allTextContents()).every((s) => /^\d\.\d{4}$|e-/.test(s))).toBe(true);

    // Time: plan + attention per policy and dense; sweep: 8 α and 6 γ points and the run's star.
    expect(await page.locator('#time .trace.bars').count()).toBe(2);
    const sweep = page.locator('#sweep');
    expect(await sweep.locator('.legendtext').allTextContents()).toEqual(['α swept (γ=0.95)', 'γ swept (α=1)', "the run's setting"]);
    expect(await sweep.locator('.scatterlayer .trace').nth(0).locator('.point').count()).toBe(8);
    expect(await sweep.locator('.scatterlayer .trace').nth(1).locator('.point').count()).toBe(6);
    await shot(page, 'report.png');
  });

  it.skipIf(!have)('renders several run JSON files, and an older one without the new fields', async () => {
    const runs: string[] = [];
    for (const n of [1536, 2048]) {
      const r = await runCli(['run', ...SHAPE, '--n', String(n), '--no-gate', '--json']);
      expect(r.code, r.stderr).toBe(0);
      runs.push(join(dir, `run-${n}.json`));
      writeFileSync(runs.at(-1)!, r.stdout);
    }
    const a = JSON.parse(readFileSync(runs[0], 'utf8')) as RunSummary;
    const b = JSON.parse(readFileSync(runs[1], 'utf8')) as RunSummary;
    // Put a known commit in one file: the page must show that one, not the checkout's.
    const commit = 'c0ffee0000000000000000000000000000000001';
    writeFileSync(runs[1], JSON.stringify({ ...b, provenance: { ...b.provenance, commit, dirty: false } }));
    const out = join(dir, 'sizes.html');
    const r = await runCli(['report', '--from', runs[0], '--from', runs[1], '--out', out]);
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toMatch(/\(and 1 more run\)\n$/);
    const page = await open(out);
    expect(await page.locator('section#scaling').getAttribute('data-shown')).toBe('yes');
    expect(await page.locator('#masks .why').textContent()).toMatch(/carries no block masks/);
    expect(await page.locator('#sweep .why').textContent()).toMatch(/pass --sweep/);
    expect(await page.locator('#provenance-table code.commit').allTextContents()).toEqual([a.provenance!.commit, commit]);
    const latency = page.locator('#scaling-latency .scatterlayer .trace');
    expect(await latency.count()).toBe(2); // crisp (crisp run has no --compare), dense
    expect(await latency.nth(0).locator('.point').count()).toBe(2);
    const downloaded = Buffer.from((await page.locator('#download-0').getAttribute('href'))!.split(',')[1], 'base64').toString('utf8');
    expect(JSON.parse(downloaded)).toEqual(a);
    await shot(page, 'report-sizes.png');

    // An older run: no provenance, no stripes, no plan times.
    const { provenance, ...old } = a;
    expect(provenance).toBeDefined();
    const older = { ...old, truth: { heads: a.truth!.heads, needles: a.truth!.needles }, policies: a.policies.map((p) => ({ ...p, timeMs: { median: p.timeMs.median, runs: p.timeMs.runs } })) };
    writeFileSync(runs[0], JSON.stringify(older));
    const out2 = join(dir, 'older.html');
    const r2 = await runCli(['report', '--from', runs[0], '--sweep', '--out', out2]);
    expect(r2.code, r2.stderr).toBe(0);
    const p2 = await open(out2);
    expect(await p2.locator('#provenance-table tr.no-provenance').textContent()).toMatch(/not recorded: this run JSON predates provenance/);
    expect(await p2.locator('#time .why').textContent()).toMatch(/no plan times/);
    // the sweep needs only the scenario, which the old file names
    expect(await p2.locator('section#sweep').getAttribute('data-shown')).toBe('yes');
  });

  it('refuses run flags beside --from', async () => {
    const r = await runCli(['report', '--from', 'x.json', '--n', '1024', '--out', join(dir, 'x.html')]);
    expect(r.code).toBe(2);
    expect(r.stderr).toBe('crisp: --n describes a run, and --from reads finished runs; drop it or drop --from (see --help)\n');
  });
});

describe('report without a dense baseline (--no-dense)', () => {
  const SMALL = ['--backend', 'reference', '--n', '1024', '--heads', '2', '--kv-heads', '1', '--head-dim', '32', '--seed', String(SEED), '--sample-rows', '4', '--no-dense'];

  it('builds the page from the JSON of `crisp run --no-dense --json`: says the comparison was skipped, no error plot', async () => {
    const r = await runCli(['run', ...SMALL, '--json']);
    expect(r.code, r.stderr).toBe(0);
    const s = JSON.parse(r.stdout) as RunSummary;
    expect(s.dense).toBeNull();
    const html = buildReportHtml({ runs: [s] });
    expect(html).toContain(DENSE_SKIPPED);
    expect(html).not.toContain('id="error"');
    expect(html).toMatch(/data-metric="output-error">-<\/td>/);
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
