/**
 * @crisp/tfjs in headless Chromium (browser/, built here with vite): TF.js on
 * tfjs-backend-webgpu over the browser's own navigator.gpu (SwiftShader on a CPU-only
 * machine), crispAttention with a small sparse policy and with `dense` on TF.js's device.
 * The float64 answer is recomputed in Node from the same seed, over the mask the page reports.
 * One page load runs both policies: SwiftShader spends most of a run compiling WGSL.
 */
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import type { Server } from 'node:http';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { CHROMIUM, PageStalled, serveStatic, WEBGPU_CHROMIUM_ARGS, waitWithProgress } from '@crisp/browser-test';
import { type BlockMask, causalBlockCount, hostTensor } from '@crisp/core';
import { attentionRows, relativeError } from '@crisp/reference';
import type { Browser } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { PageReport, PolicyRun } from '../browser/main.js';
import { freshSeed, values } from './test-support.js';

const PAGE = join(dirname(fileURLToPath(import.meta.url)), '../browser');
const SEED = freshSeed();
const SIZES = { n: 1024, H: 4, Hkv: 2, d: 64 };
/** relative (Frobenius) error of the page's f32 rows against float64 */
const TOL = 2e-5;
/** a first run on SwiftShader compiles every pipeline (TF.js's and CRISP's) */
const WAIT_MS = 360_000;
/**
 * The page's progress line standing this long is a hang. Its longest step, a policy's first
 * run, compiles every pipeline: about 15 s on 2 idle cores, but over 150 s beside the other
 * suites in CI (SwiftShader in the browser shares the cores with several other SwiftShader
 * processes there).
 */
const STALL_MS = 270_000;
/** Chromium flags in place of the SwiftShader set, space-separated (as CRISP_DEMO_CHROMIUM_ARGS for the demo) */
const ARGS = process.env.CRISP_TFJS_CHROMIUM_ARGS?.split(/\s+/).filter(Boolean) ?? WEBGPU_CHROMIUM_ARGS;

const have = existsSync(CHROMIUM);
if (!have) console.log(`[tfjs] skipping the browser test: ${CHROMIUM} is absent (apt-get install chromium)`);

describe.skipIf(!have)('@crisp/tfjs on tfjs-backend-webgpu in headless Chromium', () => {
  let server: Server | undefined;
  let browser: Browser | undefined;
  let outDir = '';
  let report: PageReport | undefined;
  const errors: string[] = [];
  let skipReason: string | undefined;

  beforeAll(async () => {
    const t0 = performance.now();
    outDir = mkdtempSync(join(tmpdir(), 'crisp-tfjs-page-'));
    const { build, defaultClientConditions } = await import('vite');
    await build({
      root: PAGE,
      configFile: false,
      logLevel: 'warn',
      // workspace packages from their TypeScript sources, as the tests themselves run them
      resolve: { conditions: ['@crisp/source', ...defaultClientConditions] },
      // (TF.js and its WebGPU backend make one large chunk; that is expected here)
      build: { target: 'es2022', outDir, emptyOutDir: true, chunkSizeWarningLimit: 4096 },
    });
    const built = performance.now();
    const s = await serveStatic(outDir);
    server = s.server;
    const { chromium } = await import('playwright-core');
    browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: [...ARGS] });
    const page = await browser.newPage();
    // every Playwright wait (navigation included) gets the hang guard, not Playwright's 30 s
    page.setDefaultTimeout(WAIT_MS);
    page.on('pageerror', (e) => errors.push(e.message));
    page.on('console', (m) => {
      if (m.type() === 'error') errors.push(`console: ${m.text()}`);
    });
    // The hang guard follows the page's progress line (#status); a page that hangs is reported
    // with the line it stood on and loaded once more (as the demo's browser test does).
    const load = async () => {
      await page.goto(`${s.url}?seed=${SEED}&n=${SIZES.n}&H=${SIZES.H}&Hkv=${SIZES.Hkv}&d=${SIZES.d}`);
      await waitWithProgress(
        () => page.evaluate(() => window.__crispTfjs !== undefined),
        () => page.locator('#status').textContent().then((t) => t ?? ''),
        { stallMs: STALL_MS, totalMs: WAIT_MS },
      );
    };
    try {
      await load();
    } catch (e) {
      if (!(e instanceof PageStalled)) throw e;
      console.log(`[tfjs] ${e.message} (page errors: ${JSON.stringify(errors)}); loading the page once more`);
      errors.length = 0;
      await load();
    }
    report = await page.evaluate(() => window.__crispTfjs);
    if (report && !report.ok && report.noWebGpu) {
      skipReason = `WebGPU is unavailable in Chromium here: ${report.noWebGpu}`;
      console.log(`[tfjs] skipping the browser test: ${skipReason}`);
    }
    if (report?.ok) {
      const runs = report.runs.map((r) => `${r.policy} ${r.ms.toFixed(0)} ms`).join(', ');
      console.log(`[tfjs] browser page (seed ${SEED}, replay with CRISP_SEED=${SEED}): built in ${((built - t0) / 1000).toFixed(1)} s, loaded and ran in ${((performance.now() - built) / 1000).toFixed(1)} s (${runs})`);
    }
  }, 2 * WAIT_MS + 60_000);

  afterAll(async () => {
    await browser?.close();
    await new Promise<void>((resolve) => (server ? server.close(() => resolve()) : resolve()));
    if (outDir) rmSync(outDir, { recursive: true, force: true });
  });

  function runOf(policy: string): PolicyRun {
    expect(report?.ok, JSON.stringify(report)).toBe(true);
    const r = report as Extract<PageReport, { ok: true }>;
    expect(r.tfBackend).toBe('webgpu');
    expect(r.seed).toBe(SEED);
    const run = r.runs.find((x) => x.policy === policy);
    expect(run, `the page ran ${policy}`).toBeDefined();
    return run!;
  }

  /** The page's rows against float64 rows from the same seed, over `mask` (dense when absent). */
  function rowError(run: PolicyRun, mask?: BlockMask): { overall: number; worstHead: number } {
    const h = values(SEED, SIZES);
    const t = (x: Float32Array, heads: number) => hostTensor('f32', [SIZES.n, heads, SIZES.d], x);
    const want = attentionRows(t(h.q, SIZES.H), t(h.k, SIZES.Hkv), t(h.v, SIZES.Hkv), run.rows, mask);
    const shape = [run.rows.length, SIZES.H, SIZES.d];
    // (the float64 rows rounded to f32: 6e-8 relative, far below TOL)
    const e = relativeError(hostTensor('f32', shape, run.out), hostTensor('f32', shape, want.output));
    return { overall: e.overall, worstHead: Math.max(...e.perHead) };
  }

  function checkOnDevice(run: PolicyRun): void {
    expect(run.path).toBe('webgpu');
    expect(run.backend).toBe('webgpu');
    expect(run.outputOn).toBe('webgpu');
    expect(run.shape).toEqual([SIZES.n, SIZES.H, SIZES.d]);
    expect(run.out).toHaveLength(run.rows.length * SIZES.H * SIZES.d);
  }

  it('a small sparse policy runs on TF.js\'s device and matches float64 over the plan\'s own mask', (ctx) => {
    if (skipReason) return ctx.skip();
    const run = runOf('crisp-64');
    checkOnDevice(run);
    expect(run.mask, 'the plan is sparse').not.toBeNull();
    const m = run.mask!;
    const mask: BlockMask = { heads: m.heads, numBlocks: m.numBlocks, blockSize: m.blockSize, rows: { rowPtr: Int32Array.from(m.rowPtr), cols: Int32Array.from(m.cols) } };
    expect(m.heads).toBe(SIZES.H);
    expect(m.numBlocks).toBe(Math.ceil(SIZES.n / m.blockSize));
    expect(run.density).toBeGreaterThan(0);
    expect(run.density, `seed ${SEED}`).toBeLessThan(1);
    // the reported density is the mask's: selected causal blocks over all of them
    expect(run.density).toBeCloseTo(m.rowPtr[m.heads * m.numBlocks] / (m.heads * causalBlockCount(m.numBlocks)), 9);
    const e = rowError(run, mask);
    expect(e.worstHead, `seed ${SEED}: rows vs float64 over the mask`).toBeLessThan(TOL);
    console.log(`[tfjs] in Chromium: crisp-64 density ${run.density.toFixed(3)}, rows vs float64 over its mask ${e.overall.toExponential(2)} (worst head ${e.worstHead.toExponential(2)}), dense-vs-sparse ${rowError(run).overall.toExponential(2)}`);
  });

  it('the dense preset runs on TF.js\'s device and matches float64 dense attention', (ctx) => {
    if (skipReason) return ctx.skip();
    const run = runOf('dense');
    checkOnDevice(run);
    expect(run.density).toBe(1);
    const e = rowError(run);
    expect(e.worstHead, `seed ${SEED}: rows vs float64 dense`).toBeLessThan(TOL);
    console.log(`[tfjs] in Chromium: dense rows vs float64 ${e.overall.toExponential(2)} (worst head ${e.worstHead.toExponential(2)})`);
  });

  it('the page logged no errors', (ctx) => {
    if (skipReason) return ctx.skip();
    expect(report?.ok, JSON.stringify(report)).toBe(true);
    expect(errors).toEqual([]);
  });
});
