/**
 * The built demo page in headless Chromium with WebGPU (SwiftShader's Vulkan on a CPU-only
 * machine): the page runs @crisp/kernels-webgpu itself, and this test recomputes the float64
 * answer in Node from the same seed and compares it with the rows the page's GPU produced.
 */
import { existsSync, mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import type { Server } from 'node:http';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { CHROMIUM, PageStalled, serveStatic, WEBGPU_CHROMIUM_ARGS, waitWithProgress } from '@crisp/browser-test';
import { type BlockMask, causalBlockCount } from '@crisp/core';
import { FMA_SPARSE_CROSSOVER, TENSOR_CORE_SPARSE_CROSSOVER } from '@crisp/kernels-webgpu';
import { attentionRows } from '@crisp/reference';
import { needleRecall, type ProfileName, scenario } from '@crisp/synth';
import type { Browser, Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { AdapterReport, DemoFailure } from './main.js';
import type { DemoResult, DemoSamples } from './run-demo.js';
import { checkCliffData, relErr, testSeed } from './test-support.js';

const SEED = testSeed();
const APP = join(dirname(fileURLToPath(import.meta.url)), '..');
/** relative error of the page's GPU rows against float64 (f16 inputs are exact in both; f16 outputs round) */
const TOL = { f32: 1e-4, f16: 5e-3, bf16: 2e-2 } as const;
/**
 * A first run on SwiftShader compiles every pipeline: ~20-50 s on 2 idle cores, several times
 * that beside the other suites in CI. The hang guard follows the page's progress line: a line
 * that stands for STALL_MS is a hang (the longest step, the warm-up's shader compiles, has
 * taken over 150 s under CI's load); WAIT_MS bounds the whole run.
 */
const STALL_MS = 270_000;
const WAIT_MS = 420_000;
/**
 * Chromium flags in place of the SwiftShader set, space-separated: '--enable-unsafe-webgpu' on
 * a machine with a GPU, or '--no-sandbox --disable-gpu' to see the no-WebGPU skip.
 */
const ARGS = process.env.CRISP_DEMO_CHROMIUM_ARGS?.split(/\s+/).filter(Boolean) ?? WEBGPU_CHROMIUM_ARGS;
/** CRISP_UPDATE_SCREENSHOTS=1 writes docs/screenshots/demo.png (see docs/screenshots/README.md) */
const SHOTS = process.env.CRISP_UPDATE_SCREENSHOTS === '1' ? join(APP, '../../docs/screenshots') : undefined;

interface PageRun {
  readonly result: DemoResult | DemoFailure;
  readonly samples: DemoSamples | undefined;
  readonly features: readonly string[];
  readonly page: Page;
  readonly errors: string[];
}

describe('the demo page in headless Chromium with WebGPU', () => {
  const have = existsSync(CHROMIUM);
  if (!have) console.log(`skipping the demo browser test: ${CHROMIUM} is absent (apt-get install chromium)`);
  let server: Server | undefined;
  let browser: Browser | undefined;
  let base = '';
  let outDir = '';
  // One page for both runs: shader pipelines are cached per device, and SwiftShader spends
  // most of a first run compiling them (about 20 s on 2 cores), so the second run reuses them.
  let shared: PageRun | undefined;
  let webgpuMissing: string | undefined;

  beforeAll(async () => {
    if (!have) return;
    outDir = mkdtempSync(join(tmpdir(), 'crisp-demo-'));
    const { build } = await import('vite');
    await build({ root: APP, configFile: join(APP, 'vite.config.ts'), logLevel: 'warn', build: { outDir, emptyOutDir: true } });
    const s = await serveStatic(outDir);
    server = s.server;
    base = s.url;
    const { chromium } = await import('playwright-core');
    browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: [...ARGS] });
  });

  afterAll(async () => {
    await shared?.page.close();
    await browser?.close();
    await new Promise<void>((resolve) => (server ? server.close(() => resolve()) : resolve()));
    if (outDir) rmSync(outDir, { recursive: true, force: true });
  });

  /** Wait for the page's result (or, without autorun, its adapter) while its progress line moves. */
  function untilResult(page: Page, autorun: boolean): Promise<void> {
    return waitWithProgress(
      () => page.evaluate((auto) => window.__crispResult !== undefined || (!auto && window.__crispAdapter !== undefined), autorun),
      () => page.locator('#progress').textContent().then((t) => t ?? ''),
      { stallMs: STALL_MS, totalMs: WAIT_MS },
    );
  }

  /**
   * Open the page with these URL parameters and wait for its run. A page that hangs (its
   * progress line stands for STALL_MS) is reported with the line it hung on and opened once
   * more in a fresh page: headless Chromium's SwiftShader GPU process has stalled once on a
   * loaded CI machine where the same run takes under a minute otherwise. A second hang fails.
   */
  async function open(params: Record<string, string | number>, retried = false): Promise<PageRun> {
    const page = await browser!.newPage();
    // every Playwright wait (navigation included) gets the hang guard, not Playwright's 30 s
    page.setDefaultTimeout(WAIT_MS);
    const errors: string[] = [];
    page.on('pageerror', (e) => errors.push(e.message));
    page.on('crash', () => errors.push('the page crashed'));
    // a missing favicon, a failed fetch or a WebGPU validation message all land here
    page.on('console', (m) => {
      if (m.type() === 'error') errors.push(`console: ${m.text()}`);
    });
    const q = new URLSearchParams(Object.entries(params).map(([k, v]) => [k, String(v)]));
    await page.goto(`${base}?${q}`);
    try {
      await untilResult(page, q.get('autorun') === '1');
    } catch (e) {
      const why = `${e instanceof Error ? e.message : String(e)}; page errors: ${JSON.stringify(errors)}`;
      await page.close().catch(() => {});
      if (retried || !(e instanceof PageStalled)) throw new Error(`the demo page did not finish: ${why}`);
      console.log(`demo browser test: ${why}; opening the page once more`);
      return open(params, true);
    }
    const got = await page.evaluate(() => ({
      result: window.__crispResult ?? { ok: false as const, code: 'NOT_RUN', message: 'no run yet' },
      samples: window.__crispSamples,
      features: window.__crispAdapter && 'features' in window.__crispAdapter ? [...window.__crispAdapter.features] : [],
    }));
    return { ...got, page, errors };
  }

  /** Recompute float64 rows in Node from the same seed and check the page's GPU rows and numbers. */
  function checkAgainstFloat64(r: DemoResult, s: DemoSamples, profile: ProfileName): void {
    const c = r.config;
    const tol = TOL[c.dtype];
    const ctx = `seed ${c.seed}, ${profile}, ${r.policy}, ${c.dtype}`;
    const sc = scenario(profile, { n: c.n, heads: c.heads, kvHeads: c.kvHeads, headDim: c.headDim, dtype: c.dtype, seed: c.seed });
    const all = sc.rows(0, c.n);
    const dense = attentionRows(all.q, all.k, all.v, s.rows);
    const denseErr = relErr(s.dense, dense.output);
    expect(denseErr, `dense rows vs float64 (${ctx})`).toBeLessThan(tol);
    expect(Math.abs(denseErr - r.denseKernelError), ctx).toBeLessThan(tol / 10);

    expect(s.mask, `the plan is sparse (${ctx})`).not.toBeNull();
    const m = s.mask!;
    const mask: BlockMask = {
      heads: c.heads,
      numBlocks: m.numBlocks,
      blockSize: m.blockSize,
      rows: { rowPtr: Int32Array.from(m.rowPtr), cols: Int32Array.from(m.cols) },
    };
    const masked = attentionRows(all.q, all.k, all.v, s.rows, mask);
    const sparseErr = relErr(s.sparse, masked.output);
    expect(sparseErr, `sparse rows vs float64 with the same mask (${ctx})`).toBeLessThan(tol);
    expect(Math.abs(sparseErr - r.kernelError), ctx).toBeLessThan(tol / 10);
    // The page's output error is the sparse rows against float64 dense.
    expect(Math.abs(relErr(s.sparse, dense.output) - r.outputError), ctx).toBeLessThan(tol / 10);

    // Density per head from the mask itself: selected causal blocks / (Nb (Nb + 1) / 2).
    const Nb = m.numBlocks;
    expect(Nb).toBe(Math.ceil(c.n / m.blockSize));
    let sum = 0;
    expect(r.heads).toHaveLength(c.heads);
    for (const h of r.heads) {
      const nnz = m.rowPtr[(h.head + 1) * Nb] - m.rowPtr[h.head * Nb];
      expect(h.density, `head ${h.head} (${ctx})`).toBeCloseTo(nnz / causalBlockCount(Nb), 12);
      expect(h.density).toBeGreaterThan(0);
      expect(h.density).toBeLessThanOrEqual(1);
      expect(['vs', 'pe']).toContain(h.route);
      expect(h.cStruct).toBeGreaterThanOrEqual(0);
      expect(h.cStruct).toBeLessThanOrEqual(1 + 1e-6);
      sum += h.density;
    }
    expect(r.overallDensity).toBeCloseTo(sum / c.heads, 12);
    expect(r.overallDensity).toBeGreaterThan(0);
    expect(r.overallDensity).toBeLessThanOrEqual(1);

    expect(checkCliffData(r.heads, m), ctx).toBeNull();
    // VS heads carry their selector's lists; PE heads the pipeline's kMin / B best vertical
    // blocks with key block 0 (the sink column) forced in, FlexPrefill's rule (every preset
    // here has pe.kMin = 1024), next to their rows.
    for (const h of r.heads) {
      expect(h.verticalSelected.length, `head ${h.head} ${h.route} (${ctx})`).toBeGreaterThan(0);
      if (h.route !== 'pe') continue;
      const p = h.verticalMass!;
      const best = Array.from(p.keys())
        .sort((a, b) => p[b] - p[a] || a - b)
        .slice(0, Math.min(Nb, Math.ceil(1024 / m.blockSize)));
      expect(h.verticalSelected, `head ${h.head} (${ctx})`).toEqual([...new Set([0, ...best])].sort((a, b) => a - b));
    }

    const nr = needleRecall({ mask, blockSize: m.blockSize, numBlocks: Nb }, sc.truth);
    expect(r.needleRecall.recall, ctx).toBe(nr.recall);
    expect(r.needleRecall.total).toBe(nr.total);
    expect(r.planMs).toBeGreaterThan(0);
    expect(r.denseMs).toBeGreaterThan(0);
    expect(Number.isFinite(r.speedup)).toBe(true);
  }

  it.skipIf(!have)('runs crisp on a llama-like layer on WebGPU and matches float64', { timeout: 2 * WAIT_MS + 60_000 }, async (t) => {
    const profile: ProfileName = 'llama-like';
    const run = await open({
      profile,
      preset: 'crisp',
      n: 1536,
      heads: 4,
      kvHeads: 2,
      headDim: 64,
      seed: SEED,
      sampleRows: 8,
      repeats: 1,
      warmup: 0,
      autorun: 1,
    });
    shared = run;
    if (!run.result.ok && run.result.code === 'NO_WEBGPU') {
      webgpuMissing = run.result.message;
      console.log(`skipping the demo browser test: WebGPU is unavailable in Chromium here: ${webgpuMissing}`);
      t.skip();
    }
    expect(run.result.ok, JSON.stringify(run.result)).toBe(true);
    const r = run.result as DemoResult;
    expect(r.backend).toBe('webgpu');
    // auto dtype: f16 exactly when the adapter offers shader-f16 (SwiftShader does not)
    expect(r.config.dtype).toBe(run.features.includes('shader-f16') ? 'f16' : 'f32');
    expect(r.kernelError).toBeLessThan(TOL[r.config.dtype]);
    checkAgainstFloat64(r, run.samples!, profile);
    // The page shows it: one table row per head, and the progress line says done.
    expect(await run.page.locator('#heads tr').count()).toBe(1 + r.config.heads);
    expect(await run.page.locator('#progress').textContent()).toMatch(/^done in /);
    // One mass-cliff plot per head, with a dot per selected VS block.
    expect(await run.page.locator('#cliff svg.cliff-head').count()).toBe(r.config.heads);
    const dots = r.heads.reduce((a, h) => a + h.verticalSelected.length + h.slashSelected.length, 0);
    expect(await run.page.locator('#cliff circle').count()).toBe(dots);
    expect(await run.page.locator('#summary').textContent()).toContain(`${(100 * r.overallDensity).toFixed(1)}%`);
    // the kernel the backend chose and its achieved rates are on the page
    expect(r.attentionKernel).toBe((await run.page.evaluate(() => window.__crispAdapter as AdapterReport)).attentionKernel);
    expect(r.denseTflops).toBeGreaterThan(0);
    expect(r.sparseTflops).toBeGreaterThan(0);
    const headFlops = 4 * r.config.headDim * ((r.config.n * (r.config.n + 1)) / 2);
    expect(r.denseTflops).toBeCloseTo((r.config.heads * headFlops) / r.denseMs / 1e9, 12);
    expect(r.sparseTflops).toBeCloseTo((r.heads.reduce((a, h) => a + h.density, 0) * headFlops) / r.attentionMs / 1e9, 12);
    // the length gate of this run's kernel, shown even when it is off
    const tensorCores = r.config.dtype === 'f16' && r.attentionKernel === 'subgroup-matrix';
    expect(r.sparseCrossover).toBe(tensorCores ? TENSOR_CORE_SPARSE_CROSSOVER : FMA_SPARSE_CROSSOVER);
    expect(await run.page.locator('#summary').textContent()).toContain(`length gate (dense below)${r.sparseCrossover} keys, off`);
    expect(await run.page.locator('#summary').textContent()).toContain(`attention kernel${r.attentionKernel}`);
    // the proxy statistics use tensor cores exactly where the attention does
    expect(r.statisticsKernel).toBe(tensorCores ? 'subgroup-matrix' : 'fma');
    expect(await run.page.locator('#summary').textContent()).toContain(`proxy statistics kernel${r.statisticsKernel}`);
    // On SwiftShader (the CI default) the page says its times mean nothing; on a GPU it does not.
    const adapter = await run.page.evaluate(() => window.__crispAdapter as AdapterReport);
    const swiftShader = /swiftshader/i.test(`${adapter.vendor} ${adapter.architecture} ${adapter.description}`);
    if (ARGS === WEBGPU_CHROMIUM_ARGS) expect(swiftShader, JSON.stringify(adapter)).toBe(true);
    expect(adapter.cpuAdapter).toBe(swiftShader ? 'SwiftShader' : adapter.cpuAdapter);
    const banner = run.page.locator('#cpu-banner');
    expect(await banner.isVisible()).toBe(adapter.cpuAdapter !== null);
    if (swiftShader) expect(await banner.textContent()).toMatch(/^CPU adapter: WebGPU runs on SwiftShader here, .* the times and the speed-up say nothing about a GPU/);
    expect(run.errors).toEqual([]);
    if (SHOTS) {
      mkdirSync(SHOTS, { recursive: true });
      await run.page.screenshot({ path: join(SHOTS, 'demo.png'), fullPage: true });
      console.log(`demo screenshot: ${join(SHOTS, 'demo.png')}`);
    }
    console.log(
      `demo in Chromium: ${r.config.dtype}, kernel ${r.attentionKernel} (dense ${r.denseTflops.toFixed(4)}, sparse ${r.sparseTflops.toFixed(4)} TFLOP/s), density ${r.overallDensity.toFixed(3)}, routes ${r.heads.map((h) => h.route).join(',')}, kernel error ${r.kernelError.toExponential(2)}, dense ${r.denseKernelError.toExponential(2)}, output error ${r.outputError.toExponential(2)}, needle recall ${r.needleRecall.recall}`,
    );
  });

  it.skipIf(!have)('then runs flexPrefill on diffuse heads from the form and matches float64', { timeout: 2 * WAIT_MS + 60_000 }, async (t) => {
    if (webgpuMissing) t.skip();
    expect(shared, 'the first test opened the page').toBeDefined();
    const { page, errors } = shared!;
    const profile: ProfileName = 'diffuse';
    // Pick everything in the form and press Run, as a user would.
    await page.selectOption('select[name=profile]', profile);
    await page.selectOption('select[name=preset]', 'flexPrefill');
    await page.fill('input[name=kvHeads]', '1');
    await page.fill('input[name=seed]', String(SEED + 1));
    await page.fill('input[name=sampleRows]', '6');
    await page.click('#run');
    await untilResult(page, true);
    const { result, samples } = await page.evaluate(() => ({ result: window.__crispResult!, samples: window.__crispSamples }));
    expect(result.ok, JSON.stringify(result)).toBe(true);
    const r = result as DemoResult;
    expect(r.policy).toBe('flexPrefill');
    expect(r.config).toMatchObject({ profile, kvHeads: 1, seed: SEED + 1, sampleRows: 6, n: 1536 });
    expect(r.rows).toHaveLength(6);
    expect(r.scoreName).not.toBe('C_struct');
    // The URL follows the form, so a run can be shared as a link.
    expect(new URL(page.url()).searchParams.get('preset')).toBe('flexPrefill');
    checkAgainstFloat64(r, samples!, profile);
    // Typing a size that takes minutes on a CPU adapter warns before the run.
    const warning = page.locator('#size-warning');
    expect(await warning.isVisible()).toBe(false);
    await page.fill('input[name=n]', '16384');
    const cpu = await page.evaluate(() => (window.__crispAdapter as AdapterReport).cpuAdapter);
    expect(await warning.isVisible()).toBe(cpu !== null);
    if (cpu) expect(await warning.textContent()).toMatch(/^This size will take about \d+ minutes on .+ \(n = 16384, H = 4, d = 64, 1 run of dense and of sparse\): try n = 2048 first\.$/);
    expect(errors).toEqual([]);
    console.log(
      `demo in Chromium: flexPrefill on diffuse, density ${r.overallDensity.toFixed(3)}, routes ${r.heads.map((h) => h.route).join(',')}, kernel error ${r.kernelError.toExponential(2)}`,
    );
  });

  it.skipIf(!have)('says what is wrong with a bad parameter instead of running', async () => {
    const run = await open({ n: 1000, heads: 6, kvHeads: 4, autorun: 1 });
    try {
      expect(run.result).toMatchObject({ ok: false, code: 'INVALID_ARGUMENT' });
      expect((run.result as DemoFailure).message).toMatch(/heads \(6\) must be a multiple of kvHeads \(4\)/);
      expect(await run.page.locator('#progress').textContent()).toMatch(/^bad URL parameter: heads \(6\)/);
    } finally {
      await run.page.close();
    }
  });
});
