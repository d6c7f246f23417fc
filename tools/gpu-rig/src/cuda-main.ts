/**
 * One device-machine run: conformance (n <= 16k), correctness at 64k..512k against the
 * dense kernel (and files for the PyTorch peer), dense and sparse timings at the Llama
 * shape, CRISP end to end on the llama-like layer, and the sparse/dense crossover.
 * Writes JSON to --out after every step, so a run cut short still reports.
 *
 *   node .device/app/cuda-main.mjs --phase all --out $OUT --budget 420
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import {
  type BlockMask,
  type DeviceTensor,
  decode,
  maskDensity,
  numBlocks,
  sparsePrefill,
  toFloat32,
  selectVsLists,
  vsListsFromArrays,
} from '@crisp/core';
import { LARGE_SIZES, SMALL_SIZES, formatReport, runConformance } from '@crisp/conformance';
import { crisp } from '@crisp/presets';
import { scenario, uploadScenario } from '@crisp/synth';
import {
  ATTENTION_VARIANTS,
  type AttentionVariant,
  type CudaBackend,
  type ProxyLayout,
  createCudaBackend,
} from '@crisp/kernels-cuda';

const argv = process.argv.slice(2);
const arg = (name: string, dflt: string) => {
  const i = argv.indexOf(`--${name}`);
  return i >= 0 ? argv[i + 1] : dflt;
};
const phase = arg('phase', 'all');
const outDir = arg('out', '/tmp/crisp-out');
const budget = Number(arg('budget', '400')) * 1000;
/** 'none' (or an empty list) skips a step list */
const list = (name: string, dflt: string) => (arg(name, dflt) === 'none' ? [] : arg(name, dflt).split(',').filter(Boolean).map(Number));
const ns = list('ns', '65536,131072,262144,524288');
const crossNs = list('cross', '8192,16384,32768');
const peerDir = arg('peer', '/tmp/crisp-cuda');
const reps = Number(arg('reps', '3'));
/** e2e inputs: the device llama fill, or the @crisp/synth llama-like scenario from the host */
const inputsKind = arg('inputs', 'fill');
const e2eNs = arg('e2e', '').split(',').filter(Boolean).map(Number);
/** conformance dtypes (run bf16 and f16 as two processes to halve the wall time) */
const confDtypes = arg('dtypes', 'bf16,f16').split(',') as ('bf16' | 'f16')[];
/** attention kernel layout for conformance and the e2e/bench phases ('' = the backend's default for the GPU) */
const variantArg = arg('variant', '') as AttentionVariant | '';
/** sizes for the kernel-layout sweep (phase kernels) */
const sweepNs = arg('sweep', '16384,65536,131072,524288').split(',').map(Number);
const layouts = arg('layouts', Object.keys(ATTENTION_VARIANTS).join(',')).split(',') as AttentionVariant[];
/** phase kernels: the self-check size run before any timing ('none' skips it) */
const checkN = arg('check', '4096') === 'none' ? 0 : Number(arg('check', '4096'));
const t0 = performance.now();
const elapsed = () => performance.now() - t0;
mkdirSync(outDir, { recursive: true });
mkdirSync(peerDir, { recursive: true });

// biome-ignore lint/suspicious/noExplicitAny: a free-form results record
const results: Record<string, any> = { started: new Date().toISOString(), phase, steps: {} };
const save = () => writeFileSync(join(outDir, 'cuda-bench.json'), JSON.stringify(results, null, 1));
const log = (s: string) => console.log(`[${(elapsed() / 1000).toFixed(1)}s] ${s}`);

async function step(name: string, fn: () => Promise<unknown>): Promise<void> {
  if (elapsed() > budget) {
    results.steps[name] = { skipped: `time budget ${budget / 1000}s used` };
    log(`skip ${name}`);
    save();
    return;
  }
  const s = performance.now();
  try {
    results.steps[name] = await fn();
  } catch (e) {
    results.steps[name] = { error: String((e as Error)?.stack ?? e) };
    log(`ERROR in ${name}: ${(e as Error).message}`);
  }
  results.steps[name] = { ...(results.steps[name] ?? {}), wallMs: performance.now() - s };
  log(`done ${name}`);
  save();
}

const median = (a: number[]) => {
  const s = [...a].sort((x, y) => x - y);
  return s[Math.floor(s.length / 2)];
};
const causalFlops = (n: number, H: number, d: number) => 2 * n * n * H * d; // 4·n²/2·H·d

/** proxy statistics kernel layout for every phase (the proxy phase times both) */
const proxyLayoutArg = (arg('proxyLayout', '') || undefined) as ProxyLayout | undefined;
/** --pdl off: every kernel launched plainly (CudaBackendOptions.programmaticLaunch), for A/B runs */
const pdlArg = arg('pdl', 'on');
if (pdlArg !== 'on' && pdlArg !== 'off') throw new Error(`--pdl must be on or off; got ${pdlArg}`);
const be: CudaBackend = await createCudaBackend({
  kernelDir: 'packages/kernels-cuda/kernels',
  cacheDir: '/tmp/crisp-cubin',
  ...(variantArg ? { attentionVariant: variantArg } : {}),
  ...(proxyLayoutArg ? { proxyLayout: proxyLayoutArg } : {}),
  programmaticLaunch: pdlArg === 'on',
});
log(`programmatic launches: ${be.programmaticLaunch ? 'on' : 'off'}${pdlArg === 'on' && !be.programmaticLaunch ? ' (the GPU or driver lacks them)' : ''}`);
/** the backend's proxy layout (the GPU's default unless --proxyLayout) */
const proxyLayout = be.proxyLayout;
const variant = be.attentionVariant;
results.variant = variant;
results.proxyLayout = proxyLayout;
results.device = be.info;
log(`device ${be.info.name} cc ${be.info.computeCapability.join('.')} driver ${be.info.driverVersion}`);

async function timeIt(fn: () => Promise<unknown>, n: number, warm = 1): Promise<number[]> {
  for (let i = 0; i < warm; i++) await be.timeMs(fn);
  const t: number[] = [];
  for (let i = 0; i < n; i++) t.push(await be.timeMs(fn));
  return t;
}

if (phase === 'all' || phase === 'conformance') {
  await step('conformance', async () => {
    const maxN = Number(arg('confMaxN', '16384'));
    const sizes = [...SMALL_SIZES, ...LARGE_SIZES.filter((s) => s.n <= maxN)];
    // runConformance disposes the backend it is given: give it its own
    const confFilter = arg('confFilter', '');
    const rep = await runConformance(() => createCudaBackend({ kernelDir: 'packages/kernels-cuda/kernels', cacheDir: '/tmp/crisp-cubin', attentionVariant: variant, proxyLayout: proxyLayoutArg }), {
      sizes,
      dtypes: confDtypes,
      ...(confFilter ? { filter: new RegExp(confFilter) } : {}),
      onResult: (r) => {
        log(`${r.skipped ? 'skip' : r.passed ? 'pass' : 'FAIL'} ${r.name}${r.passed ? '' : `: ${r.detail.slice(0, 300)}`}`);
        // progressive: a run cut short by its time limit still reports what it checked
        const c = (results.conformanceSoFar ??= { passed: 0, failed: [], skipped: 0 });
        if (r.skipped) c.skipped++;
        else if (r.passed) c.passed++;
        else c.failed.push(`${r.name}: ${r.detail.slice(0, 300)}`);
        save();
      },
    });
    log(formatReport(rep).split('\n').slice(-3).join(' | '));
    return {
      passed: rep.passed,
      counts: rep.counts,
      seed: rep.seed,
      failures: rep.results.filter((r) => !r.passed && !r.skipped).map((r) => ({ name: r.name, detail: r.detail.slice(0, 600) })),
      skipped: rep.results.filter((r) => r.skipped).map((r) => `${r.name}: ${r.skipped}`),
    };
  });
}

const H = 32;
const Hkv = 8;
const D = 128;
const B = 128;

/** why a layout failed its self-check (build error, launch error, wrong output); absent when it passed */
const layoutFailed = new Map<string, string>();

/** Max |a − b| over max |b| (host, float64 sums), plus the device's norm-relative error and NaN/Inf count. */
async function compareOutputs(a: DeviceTensor, ref: DeviceTensor) {
  const x = toFloat32(await be.download(a));
  const y = toFloat32(await be.download(ref));
  let maxDiff = 0;
  let maxRef = 0;
  let worst = -1;
  for (let i = 0; i < x.length; i++) {
    const d = Math.abs(x[i] - y[i]);
    if (!(d <= maxDiff)) {
      maxDiff = Number.isNaN(d) ? Number.POSITIVE_INFINITY : d;
      worst = i;
    }
    maxRef = Math.max(maxRef, Math.abs(y[i]));
  }
  return { maxRelErr: maxDiff / maxRef, worstIndex: worst, ...be.relError(a, ref) };
}

if (phase === 'kernels' && checkN > 0) {
  // Self-check before any timing: every layout against w32 at a small size, dense (bf16 and
  // f16, and chunked prefill with a partial last block), sparse at block sizes 128 and 64. A
  // layout that does not build, fails to launch or differs is reported and not timed.
  await step(`check_${checkN}`, async () => {
    const n = checkN;
    const out: Record<string, unknown> = { n };
    const mc = 1000;
    const nc = n + 37;
    const t = {
      q: be.allocate('bf16', [n, H, D]),
      k: be.allocate('bf16', [n, Hkv, D]),
      v: be.allocate('bf16', [n, Hkv, D]),
      qh: be.allocate('f16', [n, H, D]),
      kh: be.allocate('f16', [n, Hkv, D]),
      vh: be.allocate('f16', [n, Hkv, D]),
      qc: be.allocate('bf16', [mc, H, D]),
      kc: be.allocate('bf16', [nc, Hkv, D]),
      vc: be.allocate('bf16', [nc, Hkv, D]),
    };
    const outShape = (c: string) => (c === 'chunk' ? [mc, H, D] : [n, H, D]);
    const outType = (c: string) => (c === 'f16' ? 'f16' : 'bf16');
    const outs = Object.fromEntries(
      ['dense', 'f16', 'chunk', 'sp128', 'sp64'].map((c) => [c, [0, 1].map(() => be.allocate(outType(c), outShape(c)))]),
    );
    try {
      be.fillHash(t.q, 11, 2);
      be.fillHash(t.k, 12, 2);
      be.fillHash(t.v, 13, 1);
      be.fillHash(t.qc, 14, 2);
      be.fillHash(t.kc, 15, 2);
      be.fillHash(t.vc, 16, 1);
      be.fillHash(t.qh, 17, 2);
      be.fillHash(t.kh, 18, 2);
      be.fillHash(t.vh, 19, 1);
      const m128 = patternMask(numBlocks(n, 128), 7, 5, 128);
      const m64 = patternMask(numBlocks(n, 64), 7, 5, 64);
      const cases: Record<string, (o: DeviceTensor) => Promise<unknown>> = {
        dense: (o) => be.denseAttention(t.q, t.k, t.v, { out: o }),
        f16: (o) => be.denseAttention(t.qh, t.kh, t.vh, { out: o }),
        chunk: (o) => be.denseAttention(t.qc, t.kc, t.vc, { out: o }),
        sp128: (o) => be.sparseAttention(t.q, t.k, t.v, m128, { out: o }),
        sp64: (o) => be.sparseAttention(t.q, t.k, t.v, m64, { out: o }),
      };
      be.attentionVariant = 'w32';
      for (const [c, run] of Object.entries(cases)) {
        be.poison(outs[c][0]);
        await run(outs[c][0]);
      }
      // lse (natural log, f32 [H, n]) of the dense case, the same math in another order
      const lseOf = async (o: DeviceTensor) => {
        const res = await be.denseAttention(t.q, t.k, t.v, { out: o, returnLse: true });
        const l = res.lse as DeviceTensor;
        try {
          return toFloat32(await be.download(l));
        } finally {
          l.dispose();
        }
      };
      const lseRef = await lseOf(outs.dense[0]);
      await be.synchronize();
      for (const name of layouts) {
        const r: Record<string, unknown> = {};
        out[name] = r;
        try {
          be.attentionVariant = name;
          r.fallback = be.attentionVariantFallback;
          for (const [c, run] of Object.entries(cases)) {
            be.poison(outs[c][1]);
            await run(outs[c][1]);
            await be.synchronize();
            const e = await compareOutputs(outs[c][1], outs[c][0]);
            r[c] = e;
            // bf16 rounding of another f32 summation order differs by ~1e-3
            if (!(e.maxRelErr < 2e-2 && e.relErr < 5e-3 && e.nonFinite === 0)) {
              layoutFailed.set(name, `${c}: maxRelErr ${e.maxRelErr} relErr ${e.relErr} nonFinite ${e.nonFinite} (worst index ${e.worstIndex})`);
            }
          }
          const l = await lseOf(outs.dense[1]);
          let lseMaxAbs = 0;
          for (let i = 0; i < l.length; i++) {
            const d = Math.abs(l[i] - lseRef[i]);
            lseMaxAbs = Number.isNaN(d) ? Number.POSITIVE_INFINITY : Math.max(lseMaxAbs, d);
          }
          r.lseMaxAbsDiff = lseMaxAbs;
          if (!(lseMaxAbs < 1e-3)) layoutFailed.set(name, `lse: max |Δ| ${lseMaxAbs}`);
        } catch (e) {
          const err = e as Error & { details?: { log?: string } };
          r.error = String(err?.stack ?? e);
          if (err?.details?.log) r.buildLog = err.details.log;
          layoutFailed.set(name, `error: ${err?.message ?? e}`.slice(0, 2000));
        }
        log(`check ${name} n=${n}: ${layoutFailed.get(name) ?? 'ok'} ${JSON.stringify(Object.fromEntries(Object.keys(cases).map((c) => [c, (r[c] as { maxRelErr?: number })?.maxRelErr])))}`);
      }
      be.attentionVariant = variant;
      out.failed = Object.fromEntries(layoutFailed);
      return out;
    } finally {
      for (const x of [...Object.values(t), ...Object.values(outs).flat()]) x.dispose();
    }
  });
}

/** ProxyStats fields the proxy phase compares (before the phase: top-level code runs in order) */
const PROXY_FIELDS = ['cStruct', 'rowEntropy', 'verticalBlocks', 'slashBlocks', 'pooledEstimate', 'verticalTokens', 'slashTokens'] as const;
/** the layouts the proxy phase times at 128k / 512k (--proxyLayouts) */
const PROXY_TIMED_LAYOUTS = arg('proxyLayouts', 'w32,wg').split(',') as ProxyLayout[];
/** the fields of block-level statistics (no token scores asked for: pass 2b) */
const BLOCK_FIELDS = ['cStruct', 'rowEntropy', 'verticalBlocks', 'slashBlocks', 'pooledEstimate'] as const;

if (phase === 'proxy') {
  // Proxy statistics, both kernel layouts (PROXY_LAYOUTS). Small and odd shapes (n < B,
  // partial parts and blocks, B 64, d 64, f16): both layouts bit-for-bit equal and every
  // statistic of two heads within 2e-5 of a float64 recomputation here on the host. Llama
  // shape at 128k / 512k on the device llama fill: wall time of proxyStats after a
  // synchronize (what a plan's statsMs holds), device-profiled kernels, two runs and the
  // two layouts bit-for-bit equal, head 0 against float64.
  const small: ProxyShape[] = [
    { n: 100, H: 4, Hkv: 1, D: 128, B: 128, dtype: 'bf16' },
    { n: 300, H: 8, Hkv: 2, D: 64, B: 128, dtype: 'f16' },
    { n: 1000, H: 4, Hkv: 2, D: 64, B: 64, dtype: 'bf16' },
    { n: 4000, H: 8, Hkv: 2, D: 128, B: 64, dtype: 'bf16' },
    { n: 16461, H: 8, Hkv: 1, D: 128, B: 128, dtype: 'f16' },
  ];
  // --proxySmall 0: skip the small shapes (a profiler then meets the 128k launch first)
  await step('proxy_small', async () => {
    const out = [];
    for (const sh of arg('proxySmall', '1') === '0' ? [] : small) {
      const q = be.allocate(sh.dtype, [sh.n, sh.H, sh.D]);
      const k = be.allocate(sh.dtype, [sh.n, sh.Hkv, sh.D]);
      try {
        be.fillHash(q, 11, 3);
        be.fillHash(k, 12, 3);
        const opts = { blockSize: sh.B, wSink: Math.floor(sh.B * 0.75), wLocal: sh.B + 5, tokenScores: true };
        be.proxyLayout = 'w16';
        const a = await be.proxyStats(q, k, opts);
        be.proxyLayout = 'w32';
        const c = await be.proxyStats(q, k, opts);
        // block level (no token scores), every layout, fused and two-pass (pass 1, pass 2b);
        // wg (Hopper) with token scores too
        const blocks = [];
        for (const layout of ['w16', 'w32', 'wg'] as const) {
          be.proxyLayout = layout;
          for (const fused of [true, false]) {
            be.proxyFused = fused;
            blocks.push(await be.proxyStats(q, k, { ...opts, tokenScores: false }));
          }
          be.proxyFused = true;
        }
        be.proxyLayout = 'wg';
        // the lean pass (a device plan's statistics when the router reads no optional
        // statistic); the entropy and the pooled estimate from a full pass when read
        blocks.push(await be.proxyStats(q, k, { ...opts, tokenScores: false, deferRead: true, optionalStats: [] }));
        const wgTokens = await be.proxyStats(q, k, opts);
        const vsF64 = [];
        const blockVsF64 = [];
        for (const h of [0, sh.H - 1]) {
          vsF64.push(await proxyReference(sh, h, a, q, k, opts.wSink, opts.wLocal));
          vsF64.push(await proxyReference(sh, h, wgTokens, q, k, opts.wSink, opts.wLocal));
          for (const bl of blocks) blockVsF64.push(await proxyReference(sh, h, bl, q, k, opts.wSink, opts.wLocal));
        }
        // block statistics download on first read: statistics read only after their backend
        // was disposed (the buffer released) must equal the same statistics read at once
        const other = await createCudaBackend({ kernelDir: 'packages/kernels-cuda/kernels', cacheDir: '/tmp/crisp-cubin' });
        const oq = other.allocate(sh.dtype, [sh.n, sh.H, sh.D]);
        const ok = other.allocate(sh.dtype, [sh.n, sh.Hkv, sh.D]);
        other.fillHash(oq, 11, 3);
        other.fillHash(ok, 12, 3);
        const late = await other.proxyStats(oq, ok, { ...opts, tokenScores: false });
        other.dispose();
        const early = await be.proxyStats(q, k, { ...opts, tokenScores: false });
        const lateVsEarly = bitDiffs(late, { ...early });
        const worst = Math.max(...vsF64.flatMap((r) => PROXY_FIELDS.map((f) => r[f])));
        const blockWorst = Math.max(...blockVsF64.flatMap((r) => BLOCK_FIELDS.map((f) => r[f])));
        const pass = worst <= 2e-5 && blockWorst <= 2e-5 && Object.values(lateVsEarly).every((c) => c === 0);
        const r = { ...sh, layoutBitDiffs: bitDiffs(a, c), lateVsEarly, worstVsF64: worst, blockWorstVsF64: blockWorst, pass, vsF64, blockVsF64 };
        log(
          `proxy ${JSON.stringify(sh)}: w16 vs w32 bit diffs ${JSON.stringify(r.layoutBitDiffs)}; read after dispose vs at once ${JSON.stringify(lateVsEarly)}; worst vs f64 ${worst.toExponential(2)}, block level (fused and two-pass, 3 layouts) ${blockWorst.toExponential(2)} ${pass ? 'PASS' : 'FAIL'}`,
        );
        out.push(r);
      } finally {
        q.dispose();
        k.dispose();
        be.proxyLayout = proxyLayout;
      }
    }
    return { shapes: out };
  });
  for (const n of list('proxyNs', '131072,524288')) {
    await step(`proxy_${n}`, async () => {
      const q = be.allocate('bf16', [n, H, D]);
      const k = be.allocate('bf16', [n, Hkv, D]);
      const v = be.allocate('bf16', [n, Hkv, D]);
      try {
        be.fillLlamaLike(q, k, v, 7);
        const opts = { blockSize: B, wSink: 128, wLocal: 128 };
        const res: Record<string, unknown> = { n };
        const got: Record<string, Awaited<ReturnType<CudaBackend['proxyStats']>>> = {};
        const blockStats: Record<string, Awaited<ReturnType<CudaBackend['proxyStats']>>> = {};
        for (const [layout, fused] of PROXY_TIMED_LAYOUTS.flatMap((l) => [[l, true], [l, false]] as const)) {
          be.proxyLayout = layout;
          be.proxyFused = fused;
          const key = fused ? layout : `${layout}-2pass`;
          await be.proxyStats(q, k, opts); // warm-up: compile, pool, the one NaN/Inf check
          const wall: number[] = [];
          for (let i = 0; i < 7; i++) {
            await be.synchronize();
            const t = performance.now();
            await be.proxyStats(q, k, opts);
            wall.push(performance.now() - t);
          }
          const device = await timeIt(() => be.proxyStats(q, k, opts), 5, 0);
          be.startProfile();
          await be.proxyStats(q, k, opts);
          const kernels = be.stopProfile();
          const a = await be.proxyStats(q, k, { ...opts, tokenScores: true });
          const a2 = await be.proxyStats(q, k, { ...opts, tokenScores: true });
          if (fused) got[layout] = a;
          else res[`${layout}-fusedVs2pass`] = maxDiffs(await be.proxyStats(q, k, opts), blockStats[layout]);
          if (fused) blockStats[layout] = await be.proxyStats(q, k, opts);
          res[key] = { wallMs: wall, medianWallMs: median(wall), deviceMs: device, kernels, runToRunBitDiffs: bitDiffs(a, a2) };
          log(
            `proxy n=${n} ${key}: wall median ${median(wall).toFixed(2)} ms (${wall.map((x) => x.toFixed(2)).join(' ')}), device ${median(device).toFixed(2)} ms; kernels ${kernels.map((x) => `${x.kernel} ${x.ms.toFixed(3)}`).join(', ')}; run-to-run bit diffs ${JSON.stringify(bitDiffs(a, a2))}`,
          );
        }
        be.proxyLayout = proxyLayout;
        be.proxyFused = true;
        log(`proxy n=${n}: fused vs two-pass block statistics, max |diff| ${JSON.stringify(PROXY_TIMED_LAYOUTS.map((l) => res[`${l}-fusedVs2pass`]))}`);
        if (PROXY_TIMED_LAYOUTS.includes('wg')) {
          // the lean pass (no optional statistics: a device plan's with the C_struct router)
          // against the full fused pass: the same bits in every statistic it computes, and the
          // optional ones, computed by a full pass when read, equal too
          be.proxyLayout = 'wg';
          const leanOpts = { ...opts, deferRead: true, optionalStats: [] as const };
          await be.proxyStats(q, k, leanOpts);
          const device = await timeIt(() => be.proxyStats(q, k, leanOpts), 5, 0);
          be.startProfile();
          await be.proxyStats(q, k, leanOpts);
          const kernels = be.stopProfile();
          const full = await be.proxyStats(q, k, opts);
          const lean = await be.proxyStats(q, k, leanOpts);
          const differ = (fields: readonly (keyof typeof full)[]) =>
            Object.fromEntries(
              fields.map((f) => {
                const a = lean[f] as ArrayLike<number>;
                const b = full[f] as ArrayLike<number>;
                let c = Math.abs(a.length - b.length);
                for (let i = 0; i < Math.min(a.length, b.length); i++) if (!Object.is(a[i], b[i])) c++;
                return [f, c];
              }),
            );
          const diffs = differ(['cStruct', 'verticalBlocks', 'slashBlocks']);
          const later = differ(['rowEntropy', 'pooledEstimate']);
          res.lean = { deviceMs: device, kernels, bitDiffsVsFull: diffs, optionalLaterBitDiffs: later };
          log(
            `proxy n=${n} wg lean: device ${median(device).toFixed(2)} ms; kernels ${kernels.map((x) => `${x.kernel} ${x.ms.toFixed(3)}`).join(', ')}; lean vs full bit diffs ${JSON.stringify(diffs)}, optional statistics read later vs full ${JSON.stringify(later)}`,
          );
          be.proxyLayout = proxyLayout;
        }
        // (one layout timed: nothing to compare)
        res.layoutBitDiffs = PROXY_TIMED_LAYOUTS.length > 1 ? bitDiffs(got[PROXY_TIMED_LAYOUTS[0]], got[PROXY_TIMED_LAYOUTS[1]]) : {};
        const sh: ProxyShape = { n, H, Hkv, D, B, dtype: 'bf16' };
        // --proxyRef 0: timings and bit checks only (the float64 recomputation takes 7 s at
        // 128k and 26 s at 512k a head)
        const check = [];
        if (arg('proxyRef', '1') !== '0') {
          for (const layout of PROXY_TIMED_LAYOUTS) {
            const r0 = await proxyReference(sh, 0, got[layout], q, k, opts.wSink, opts.wLocal);
            check.push({ layout, ...r0 });
          }
          // the timed path (no token scores: the fused pass), default layout
          const blk = await be.proxyStats(q, k, opts);
          const rb = await proxyReference(sh, 0, blk, q, k, opts.wSink, opts.wLocal);
          check.push({ blockLevel: 1, ...Object.fromEntries(BLOCK_FIELDS.map((f) => [f, rb[f]])) });
          if (n <= 131072) check.push(await proxyReference(sh, H - 1, got[PROXY_TIMED_LAYOUTS[1]], q, k, opts.wSink, opts.wLocal));
        }
        res.vsF64 = check;
        log(`proxy n=${n}: ${PROXY_TIMED_LAYOUTS.join(' vs ')} bit diffs ${JSON.stringify(res.layoutBitDiffs)}; vs f64 ${JSON.stringify(check)}`);
        return res;
      } finally {
        for (const t of [q, k, v]) t.dispose();
      }
    });
  }
}

interface ProxyShape {
  n: number;
  H: number;
  Hkv: number;
  D: number;
  B: number;
  dtype: 'bf16' | 'f16';
}
type Stats = Awaited<ReturnType<CudaBackend['proxyStats']>>;

/** per block-level field, the largest absolute difference */
function maxDiffs(x: Stats, y: Stats): Record<string, number> {
  const out: Record<string, number> = {};
  for (const f of BLOCK_FIELDS) {
    const a = x[f];
    const b = y[f];
    let m = a.length === b.length ? 0 : Number.POSITIVE_INFINITY;
    for (let i = 0; i < Math.min(a.length, b.length); i++) m = Math.max(m, Math.abs(a[i] - b[i]));
    out[f] = m;
  }
  return out;
}

/** per field, how many values differ in their bits */
function bitDiffs(x: Stats, y: Stats): Record<string, number> {
  const out: Record<string, number> = {};
  for (const f of PROXY_FIELDS) {
    const a = x[f] as ArrayLike<number> | undefined;
    const b = y[f] as ArrayLike<number> | undefined;
    if (!a || !b) continue;
    let c = Math.abs(a.length - b.length);
    for (let i = 0; i < Math.min(a.length, b.length); i++) if (!Object.is(a[i], b[i])) c++;
    out[f] = c;
  }
  return out;
}

/**
 * One head's proxy statistics in float64 from the device tensors (downloaded here), and the
 * largest |got − ref| / max(1, |ref|) per field (the conformance suite's error measure).
 */
async function proxyReference(
  sh: ProxyShape,
  h: number,
  got: Stats,
  q: DeviceTensor,
  k: DeviceTensor,
  wSink: number,
  wLocal: number,
): Promise<Record<string, number>> {
  const t0 = performance.now();
  const { n, H: nH, Hkv: nKv, D: d, B: bs, dtype } = sh;
  const b = Math.min(bs, n);
  const Nb = numBlocks(n, bs);
  const kvh = Math.floor(h / (nH / nKv));
  const scale = 1 / Math.sqrt(d);
  const qRows = decode(dtype, be.readRows(q, Int32Array.from({ length: b }, (_, i) => n - b + i)).data as Uint16Array);
  const kAll = (await be.download(k)).data as Uint16Array;
  const kh = new Float64Array(n * d);
  // decode one kv head's slice (a whole decode of k at 512k would be a 2 GB Float32Array)
  const rowU = new Uint16Array(d);
  for (let j = 0; j < n; j++) {
    rowU.set(kAll.subarray((j * nKv + kvh) * d, (j * nKv + kvh + 1) * d));
    const f = decode(dtype, rowU);
    for (let x = 0; x < d; x++) kh[j * d + x] = f[x];
  }
  const av = new Float64Array(n);
  const as = new Float64Array(n);
  const s = new Float64Array(n);
  const qv = new Float64Array(d);
  const qMean = new Float64Array(d);
  let ent = 0;
  for (let r = 0; r < b; r++) {
    const pos = n - b + r;
    for (let x = 0; x < d; x++) {
      qv[x] = qRows[(r * nH + h) * d + x];
      qMean[x] += qv[x] / b;
    }
    let m = Number.NEGATIVE_INFINITY;
    for (let j = 0; j <= pos; j++) {
      let x = 0;
      const o = j * d;
      for (let e = 0; e < d; e++) x += qv[e] * kh[o + e];
      x *= scale;
      s[j] = x;
      if (x > m) m = x;
    }
    let l = 0;
    for (let j = 0; j <= pos; j++) l += Math.exp(s[j] - m);
    const lse = m + Math.log(l);
    let hrow = 0;
    for (let j = 0; j <= pos; j++) {
      const p = Math.exp(s[j] - lse);
      av[j] += p / b;
      as[pos - j] += p / b;
      hrow -= p * (s[j] - lse);
    }
    ent += hrow / b;
  }
  const pv = new Float64Array(Nb);
  const ps = new Float64Array(Nb);
  for (let j = 0; j < n; j++) {
    pv[Math.floor(j / bs)] += av[j];
    ps[Math.floor(j / bs)] += as[j];
  }
  let cs = 0;
  const s0 = Math.min(wSink, n);
  for (let j = 0; j < s0; j++) cs += av[j];
  for (let j = Math.max(n - wLocal, s0); j < n; j++) cs += av[j];
  const lg = new Float64Array(Nb);
  for (let J = 0; J < Nb; J++) {
    const r1 = Math.min(n, (J + 1) * bs);
    let dot = 0;
    for (let x = 0; x < d; x++) {
      let km = 0;
      for (let j = J * bs; j < r1; j++) km += kh[j * d + x];
      dot += qMean[x] * (km / (r1 - J * bs));
    }
    lg[J] = dot * scale;
  }
  let lm = Number.NEGATIVE_INFINITY;
  for (const x of lg) lm = Math.max(lm, x);
  let ls = 0;
  for (const x of lg) ls += Math.exp(x - lm);
  const pooled = lg.map((x) => Math.exp(x - lm) / ls);
  const err = (a: ArrayLike<number> | undefined, off: number, e: ArrayLike<number>) => {
    if (!a) return Number.POSITIVE_INFINITY;
    let w = 0;
    for (let i = 0; i < e.length; i++) {
      const x = a[off + i];
      const r = Number.isFinite(x) ? Math.abs(x - e[i]) / Math.max(1, Math.abs(e[i])) : Number.POSITIVE_INFINITY;
      if (r > w) w = r;
    }
    return w;
  };
  return {
    head: h,
    cStruct: err(got.cStruct, h, [cs]),
    rowEntropy: err(got.rowEntropy, h, [ent]),
    verticalBlocks: err(got.verticalBlocks, h * Nb, pv),
    slashBlocks: err(got.slashBlocks, h * Nb, ps),
    pooledEstimate: err(got.pooledEstimate, h * Nb, pooled),
    verticalTokens: err(got.verticalTokens, h * n, av),
    slashTokens: err(got.slashTokens, h * n, as),
    refCStruct: cs,
    refEntropy: ent,
    ms: performance.now() - t0,
  };
}

if (phase === 'kernels') {
  // Every attention layout on the same inputs: dense time, TFLOP/s, output vs the w32 layout
  // (same math, f32 sums in another order), and a regular sparse mask's per-block cost.
  for (const n of sweepNs) {
    await step(`layouts_${n}`, async () => {
      const Nb = numBlocks(n, B);
      const q = be.allocate('bf16', [n, H, D]);
      const k = be.allocate('bf16', [n, Hkv, D]);
      const v = be.allocate('bf16', [n, Hkv, D]);
      const ref = be.allocate('bf16', [n, H, D]);
      const o = be.allocate('bf16', [n, H, D]);
      const out: Record<string, unknown> = { n };
      try {
        be.fillHash(q, 1, 2);
        be.fillHash(k, 2, 2);
        be.fillHash(v, 3, 1);
        be.attentionVariant = 'w32';
        be.poison(ref);
        await be.denseAttention(q, k, v, { out: ref });
        const pm = patternMask(Nb, 16, 64);
        const rows = await be.expandMask(pm);
        const blocks = rows.rowPtr[rows.rowPtr.length - 1];
        const causal = H * ((Nb * (Nb + 1)) / 2);
        const big = n >= 262144;
        // the sparse reference: w32 on the same pattern mask
        const refSp = be.allocate('bf16', [n, H, D]);
        be.poison(refSp);
        await be.sparseAttention(q, k, v, pm, { out: refSp });
        try {
          for (const name of layouts) {
            if (elapsed() > budget) break;
            if (layoutFailed.has(name)) {
              out[name] = { skipped: `failed its self-check: ${layoutFailed.get(name)}` };
              continue;
            }
            try {
              be.attentionVariant = name;
              be.poison(o);
              const dense = await timeIt(() => be.denseAttention(q, k, v, { out: o }), big ? 2 : reps, 1);
              const err = be.relError(o, ref);
              be.poison(o);
              const sp = await timeIt(() => be.sparseAttention(q, k, v, pm, { out: o }), big ? 2 : reps, 1);
              const spErr = be.relError(o, refSp);
              const dMs = median(dense);
              const sMs = median(sp);
              out[name] = {
                fallback: be.attentionVariantFallback,
                denseMs: dense,
                denseTflops: causalFlops(n, H, D) / (dMs * 1e-3) / 1e12,
                vsV1: err,
                sparseVsV1: spErr,
                sparsePatternMs: sp,
                patternDensity: blocks / causal,
                perBlockSparseOverDense: sMs / blocks / (dMs / causal),
              };
              log(
                `layout ${name} n=${n}: dense ${dMs.toFixed(2)} ms (${(causalFlops(n, H, D) / (dMs * 1e-3) / 1e12).toFixed(0)} TFLOP/s) vs w32 relErr ${err.relErr.toExponential(2)} nonfinite ${err.nonFinite}; pattern ${sMs.toFixed(2)} ms per-block ${(sMs / blocks / (dMs / causal)).toFixed(3)}x dense, vs w32 relErr ${spErr.relErr.toExponential(2)} nonfinite ${spErr.nonFinite}`,
              );
            } catch (e) {
              out[name] = { error: String((e as Error)?.stack ?? e) };
              log(`layout ${name} n=${n}: ERROR ${(e as Error)?.message ?? e}`);
            }
          }
        } finally {
          refSp.dispose();
        }
        be.attentionVariant = variant;
        return out;
      } finally {
        for (const t of [q, k, v, ref, o]) t.dispose();
      }
    });
  }
}

function fullVsMask(Nb: number): BlockMask {
  const all = Int32Array.from({ length: Nb }, (_, i) => i);
  return { heads: H, numBlocks: Nb, blockSize: B, vs: vsListsFromArrays(Array(H).fill([]), Array(H).fill(all)) };
}
function patternMask(Nb: number, every: number, band: number, blockSize = B): BlockMask {
  const v: number[][] = [];
  const s: number[][] = [];
  for (let h = 0; h < H; h++) {
    v.push(Array.from({ length: Math.ceil(Nb / every) }, (_, i) => (i * every + h) % Nb));
    s.push(Array.from({ length: band }, (_, i) => i));
  }
  return { heads: H, numBlocks: Nb, blockSize, vs: vsListsFromArrays(v, s) };
}

const peerManifest: {
  ns: number[];
  rows: Record<string, string>;
  files: Record<string, string[]>;
  probe: Record<string, string>;
} = {
  ns: [],
  probe: {},
  rows: {},
  files: {},
};

if (phase === 'all' || phase === 'bench') {
  for (const n of ns) {
    await step(`dense_vs_sparse_${n}`, async () => {
      const Nb = numBlocks(n, B);
      const q = be.allocate('bf16', [n, H, D]);
      const k = be.allocate('bf16', [n, Hkv, D]);
      const v = be.allocate('bf16', [n, Hkv, D]);
      const od = be.allocate('bf16', [n, H, D]);
      const os = be.allocate('bf16', [n, H, D]);
      try {
        be.fillHash(q, 1, 2);
        be.fillHash(k, 2, 2);
        be.fillHash(v, 3, 1);
        be.poison(od);
        be.poison(os);
        const big = n >= 262144;
        const r = big ? 2 : reps;
        const dense = await timeIt(() => be.denseAttention(q, k, v, { out: od }), r, big ? 0 : 1);
        const full = fullVsMask(Nb);
        const sparseFull = await timeIt(() => be.sparseAttention(q, k, v, full, { out: os }), big ? 1 : r, big ? 0 : 1);
        const eq = be.relError(os, od);
        const selfD = be.relError(od, od);
        const pm = patternMask(Nb, 16, 64);
        const rows = await be.expandMask(pm);
        const blocks = rows.rowPtr[rows.rowPtr.length - 1];
        const os2 = be.allocate('bf16', [n, H, D]);
        const sparsePat = await timeIt(() => be.sparseAttention(q, k, v, pm, { out: os2 }), 2);
        os2.dispose();
        const causal = H * ((Nb * (Nb + 1)) / 2);
        const dMs = median(dense);
        const pMs = median(sparsePat);
        // rows for the PyTorch peer: every 61st row plus the last 128
        const sample: number[] = [];
        for (let i = 0; i < n; i += 61) sample.push(i);
        for (let i = n - 128; i < n; i++) if (i % 61 !== 0) sample.push(i);
        const idx = Int32Array.from(sample);
        const rowsFile = join(peerDir, `rows_${n}.i32`);
        writeFileSync(rowsFile, idx);
        const denseRows = be.readRows(od, idx);
        writeFileSync(join(peerDir, `dense_${n}.bf16`), denseRows.data as Uint16Array);
        writeFileSync(join(peerDir, `sparsefull_${n}.bf16`), be.readRows(os, idx).data as Uint16Array);
        const probe = join(peerDir, `qprobe_${n}.bf16`);
        writeFileSync(probe, be.readRows(q, Int32Array.from([0, 1, n - 1])).data as Uint16Array);
        peerManifest.probe[n] = probe;
        peerManifest.ns.push(n);
        peerManifest.rows[n] = rowsFile;
        peerManifest.files[n] = [join(peerDir, `dense_${n}.bf16`), join(peerDir, `sparsefull_${n}.bf16`)];
        writeFileSync(join(peerDir, 'manifest.json'), JSON.stringify({ H, Hkv, D, seeds: [1, 2, 3], amps: [2, 2, 1], ...peerManifest }));
        const res = {
          n,
          denseMs: dense,
          denseTflops: causalFlops(n, H, D) / (dMs * 1e-3) / 1e12,
          sparseFullMaskMs: sparseFull,
          sparseFullVsDense: eq,
          denseNonFinite: selfD.nonFinite,
          pattern: { blocks, causalBlocks: causal, density: blocks / causal, ms: sparsePat },
          usPerBlockDense: (dMs * 1000) / causal,
          usPerBlockSparse: (pMs * 1000) / blocks,
          usPerBlockSparseFull: (median(sparseFull) * 1000) / causal,
        };
        log(
          `n=${n} dense ${dMs.toFixed(1)} ms (${res.denseTflops.toFixed(0)} TFLOP/s) sparse(full) ${median(sparseFull).toFixed(1)} ms relErr ${eq.relErr.toExponential(2)} nonfinite ${eq.nonFinite}; pattern d=${res.pattern.density.toFixed(3)} ${pMs.toFixed(1)} ms, us/block ${res.usPerBlockSparse.toFixed(3)} vs dense ${res.usPerBlockDense.toFixed(3)}`,
        );
        return res;
      } finally {
        for (const t of [q, k, v, od, os]) t.dispose();
      }
    });
  }

  const makeInputs = async (n: number): Promise<{ q: DeviceTensor; k: DeviceTensor; v: DeviceTensor }> => {
    if (inputsKind !== 'synth') {
      const t = { q: be.allocate('bf16', [n, H, D]), k: be.allocate('bf16', [n, Hkv, D]), v: be.allocate('bf16', [n, Hkv, D]) };
      be.fillLlamaLike(t.q, t.k, t.v, 7);
      return t;
    }
    const sc = scenario('llama-like', { n, heads: H, kvHeads: Hkv, headDim: D, dtype: 'bf16', seed: 1 });
    const tg = performance.now();
    let lastLog = tg;
    const up = await uploadScenario(be, sc, {
      onProgress: (done, total) => {
        if (performance.now() - lastLog > 15000) {
          lastLog = performance.now();
          log(`  synth ${done}/${total} rows`);
        }
      },
    });
    log(`  synth llama-like n=${n} generated and uploaded in ${((performance.now() - tg) / 1000).toFixed(1)} s`);
    return up;
  };

  const e2e = async (n: number, r: number, withDense: boolean) => {
    const { q, k, v } = await makeInputs(n);
    const os = be.allocate('bf16', [n, H, D]);
    const od = be.allocate('bf16', [n, H, D]);
    const oh = be.allocate('bf16', [n, H, D]);
    const inputs = { q, k, v } as { q: DeviceTensor; k: DeviceTensor; v: DeviceTensor };
    try {
      be.poison(os);
      await sparsePrefill(be, inputs, crisp, { minSparseLength: 0, out: os }); // warm-up
      await be.synchronize();
      const runs: { planMs: number; attentionMs: number; totalMs: number }[] = [];
      let last: Awaited<ReturnType<typeof sparsePrefill>> | undefined;
      for (let i = 0; i < r; i++) {
        await be.synchronize();
        last = await sparsePrefill(be, inputs, crisp, { minSparseLength: 0, out: os });
        runs.push(last.timings);
      }
      const plan = last?.plan;
      const total = median(runs.map((x) => x.totalMs));
      const planMs = median(runs.map((x) => x.planMs));
      // --headstart MS: the same prefill r more times, each behind a device wait of MS ms, so
      // the host has queued the whole plan before the device starts it: the plan's device
      // critical path alone, against planMs above (which also holds the host's launch time
      // wherever the device waited for it)
      let headstart: { ms: number; planMs: number[]; totalMs: number[] } | undefined;
      const hs = Number(arg('headstart', '0'));
      if (hs > 0) {
        const hr: { planMs: number; totalMs: number }[] = [];
        for (let i = 0; i < r; i++) {
          await be.synchronize();
          be.deviceSleep(hs);
          hr.push((await sparsePrefill(be, inputs, crisp, { minSparseLength: 0, out: os })).timings);
        }
        headstart = { ms: hs, planMs: hr.map((x) => x.planMs), totalMs: hr.map((x) => x.totalMs) };
        log(
          `  ${n} plan ${planMs.toFixed(3)} ms; behind a ${hs} ms device head start ${median(headstart.planMs).toFixed(3)} ms (runs ${headstart.planMs.map((x) => x.toFixed(3)).join(' ')})`,
        );
      }
      // pieces of the plan, device-timed
      const proxyMs = await be.timeMs(() =>
        be.proxyStats(q, k, { blockSize: B, wSink: 128, wLocal: 128 }),
      );
      const peHeads = plan?.routing ? plan.routing.routes.flatMap((x, h) => (x === 'pe' ? [h] : [])) : [];
      const peMs = peHeads.length
        ? await be.timeMs(() => be.peBlockRows(q, k, { blockSize: B, gamma: 0.95, heads: peHeads }))
        : 0;
      // the host path on the plan's (complete) mask: expanded again from the host arrays;
      // must give the prepared path's output bit for bit, and the host density count the
      // device's
      be.poison(oh);
      const sparseKernelMs = plan?.mask ? await be.timeMs(() => be.sparseAttention(q, k, v, plan.mask as BlockMask, { out: oh })) : 0;
      const preparedVsHost = plan?.mask ? be.relError(os, oh) : undefined;
      // the VS lists (selected on the device when the backend offers it) against the host
      // selector on the plan's own statistics: must be equal
      let vsVsHost: string | undefined;
      if (plan?.stats && plan.routing && plan.mask?.vs) {
        const want = selectVsLists(plan.stats, plan.routing.routes, crisp.vs!, Math.ceil(crisp.pe!.kMin / B));
        const got = plan.mask.vs;
        const same = (a: Int32Array, b: Int32Array) => a.length === b.length && a.every((x, i) => x === b[i]);
        vsVsHost =
          same(got.verticalPtr, want.verticalPtr) && same(got.vertical, want.vertical) && same(got.slashPtr, want.slashPtr) && same(got.slash, want.slash)
            ? 'equal'
            : 'DIFFERENT';
      }
      const hostDensity = plan?.mask ? maskDensity(plan.mask).overall : undefined;
      // --profileToo 1: one more prefill with every launch serialised and device-timed, on
      // the same inputs (synth inputs at 512k take ~80 s to make)
      let profile: { kernels: unknown; phases: unknown } | undefined;
      if (arg('profileToo', '') === '1') {
        be.startProfile();
        const pr = await sparsePrefill(be, inputs, crisp, { minSparseLength: 0, out: os });
        const kernels = be.stopProfile();
        profile = { kernels, phases: pr.plan.phases };
        for (const x of kernels.slice(0, 16)) log(`  ${n} ${x.kernel}: ${x.ms.toFixed(3)} ms (${x.calls} calls)`);
        log(`  ${n} plan phases (profiled, serialised) ${JSON.stringify(pr.plan.phases)}`);
      }
      // --trace 1: one more prefill with a timeline of its launches (not serialised): device
      // start/end of each kernel and the host's clock at each launch and synchronous read
      let trace: unknown;
      if (arg('trace', '') === '1') {
        await be.synchronize();
        be.startTrace();
        const tr = await sparsePrefill(be, inputs, crisp, { minSparseLength: 0, out: os });
        const entries = be.stopTrace();
        trace = { entries, timings: tr.timings };
        // idle-before per stream: a device plan's router and PE kernels run on a second one
        const prevEnd = { main: 0, side: -1, tail: -1 };
        for (const e of entries) {
          if (e.startMs === undefined) {
            log(`  trace ${n} host ${e.hostMs.toFixed(3)}..${e.hostEndMs?.toFixed(3)} ${e.name}`);
            continue;
          }
          const st = e.stream ?? 'main';
          const gap = prevEnd[st] < 0 ? 0 : e.startMs - prevEnd[st];
          log(
            `  trace ${n} host ${e.hostMs.toFixed(3)} dev ${e.startMs.toFixed(3)}..${e.endMs!.toFixed(3)} (${(e.endMs! - e.startMs).toFixed(3)}) idle-before ${gap.toFixed(3)}${st === 'main' ? '' : ` [${st}]`} ${e.name}`,
          );
          prevEnd[st] = e.endMs!;
        }
        log(`  trace ${n} timings ${JSON.stringify(tr.timings)}`);
      }
      let dense: number[] = [];
      let err: unknown;
      if (withDense) {
        dense = await timeIt(() => be.denseAttention(q, k, v, { out: od }), n >= 262144 ? 1 : r, n >= 262144 ? 0 : 1);
        err = be.relError(os, od);
      }
      return {
        n,
        inputs: inputsKind,
        policy: crisp.name,
        phases: last?.plan.phases,
        totalMs: runs.map((x) => x.totalMs),
        planMs: runs.map((x) => x.planMs),
        attentionMs: runs.map((x) => x.attentionMs),
        medianTotalMs: total,
        planShare: planMs / total,
        proxyStatsMs: proxyMs,
        peRowsMs: peMs,
        sparseKernelMs,
        density: plan?.overallDensity,
        hostDensity,
        preparedVsHost,
        vsListsVsHostSelector: vsVsHost,
        denseReason: plan?.denseReason,
        routes: plan?.routing ? { vs: plan.routing.routes.filter((x) => x === 'vs').length, pe: peHeads.length } : undefined,
        denseMs: dense,
        speedupVsOwnDense: dense.length ? median(dense) / total : undefined,
        outputVsDense: err,
        profile,
        trace,
        headstart,
      };
    } finally {
      for (const t of [q, k, v, os, od, oh]) t.dispose();
    }
  };

  if (arg('profile', '') === '1') {
    // One profiled CRISP prefill per size: each kernel's time on the device (launches serialised).
    for (const n of e2eNs) {
      await step(`profile_${n}`, async () => {
        const { q, k, v } = await makeInputs(n);
        const os = be.allocate('bf16', [n, H, D]);
        try {
          const inputs = { q, k, v };
          await sparsePrefill(be, inputs, crisp, { minSparseLength: 0, out: os });
          await be.synchronize();
          be.startProfile();
          const r = await sparsePrefill(be, inputs, crisp, { minSparseLength: 0, out: os });
          const kernels = be.stopProfile();
          for (const x of kernels.slice(0, 14)) log(`  ${n} ${x.kernel}: ${x.ms.toFixed(2)} ms (${x.calls} calls)`);
          log(`  ${n} plan phases (profiled, serialised) ${JSON.stringify(r.plan.phases)} density ${r.plan.overallDensity.toFixed(4)}`);
          return { n, inputs: inputsKind, kernels, phases: r.plan.phases, density: r.plan.overallDensity };
        } finally {
          for (const t of [q, k, v, os]) t.dispose();
        }
      });
    }
  }

  // --profile 1 profiles the --e2e sizes instead of timing them (each size's inputs are made
  // once: synth inputs at 512k take ~80 s on the GPU machine's host)
  const e2eList =
    arg('e2e', '') === 'none' || arg('profile', '') === '1' ? [] : e2eNs.length ? e2eNs : ns.filter((x) => x >= 131072).sort((x, y) => y - x);
  for (const n of e2eList) {
    await step(`crisp_e2e_${n}`, async () => {
      const r = await e2e(n, inputsKind === 'synth' || n < 262144 ? 3 : 1, true);
      log(
        `crisp n=${n}: total ${r.medianTotalMs.toFixed(1)} ms (plan share ${(100 * r.planShare).toFixed(1)}%, proxy ${r.proxyStatsMs.toFixed(1)} ms, pe ${Number(r.peRowsMs).toFixed(1)} ms, kernel ${r.sparseKernelMs.toFixed(1)} ms) density ${r.density?.toFixed(4)} (host count ${r.hostDensity?.toFixed(4)}, prepared vs host ${JSON.stringify(r.preparedVsHost)}, VS lists vs host selector ${r.vsListsVsHostSelector}) phases ${JSON.stringify(r.phases)} routes ${JSON.stringify(r.routes)} dense ${r.denseMs.map((x) => x.toFixed(0))} err ${JSON.stringify(r.outputVsDense)}`,
      );
      return r;
    });
  }
  if (crossNs.length) await step('crossover', async () => {
    const pts = [];
    for (const n of crossNs) {
      if (elapsed() > budget) break;
      const r = await e2e(n, 5, true);
      pts.push({ n, crispMs: r.medianTotalMs, denseMs: median(r.denseMs), density: r.density, planShare: r.planShare });
      log(`crossover n=${n}: crisp ${r.medianTotalMs.toFixed(2)} ms vs dense ${median(r.denseMs).toFixed(2)} ms (density ${r.density?.toFixed(3)})`);
    }
    return { points: pts };
  });
}
results.finished = new Date().toISOString();
results.compileMs = be.compileMs;
save();
be.dispose();
log('end');
