/** Phase proxy: the proxy-statistics kernels checked against float64 and timed at the Llama shape. */
import { type DeviceTensor, decode, numBlocks } from '@crisp/core';
import { type CudaBackend, createCudaBackend } from '@crisp/kernels-cuda';
import { arg, list, PROXY_TIMED_LAYOUTS } from './args.js';
import { be, proxyLayout, timeIt } from './backend.js';
import { log, step, median } from './harness.js';
import { H, Hkv, D, B } from './shapes.js';

/** ProxyStats fields the proxy phase compares */
const PROXY_FIELDS = ['cStruct', 'rowEntropy', 'verticalBlocks', 'slashBlocks', 'pooledEstimate', 'verticalTokens', 'slashTokens'] as const;
/** the fields of block-level statistics (no token scores asked for: pass 2b) */
const BLOCK_FIELDS = ['cStruct', 'rowEntropy', 'verticalBlocks', 'slashBlocks', 'pooledEstimate'] as const;

export async function proxyPhase(): Promise<void> {
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
