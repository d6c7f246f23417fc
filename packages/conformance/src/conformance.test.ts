import {
  type AttentionOptions,
  type AttentionResult,
  type Backend,
  type BlockMask,
  type DeviceTensor,
  expandToRows,
  hostTensor,
  type ProxyStats,
  toFloat32,
} from '@crisp/core';
import { crisp, flexPrefill } from '@crisp/presets';
import { createReferenceBackend } from '@crisp/reference';
import { describe, expect, it } from 'vitest';
import { crispGuardedSmall, crispSmall, flexPrefillSmall, formatReport, listConformanceCases, runConformance } from './index.js';
import { defineConformanceSuite } from './vitest.js';

// The plain reference must pass the suite: every case of every shape in f32 with the three
// scaled policies; in f16 and bf16 every primitive case and the pipeline and varlen cases of
// one policy; and the pipeline cases of the presets as shipped (B = 128, kMin = 1024: nearly
// dense at n = 1100, so the slowest cases) in f32.
// What is left out ran the same code again: the input dtype changes only the values the
// reference decodes (to float64, before anything else runs), which each dtype's primitive
// cases and its crisp pipelines check; the other policies' routing and selection run on those
// float64 statistics whatever the input dtype, and are checked in f32. The lifetime case
// (no values: whether a dropped plan's statistics are collected) is dtype- and
// policy-independent, so it runs once, in f32 with the scaled crisp policy.
defineConformanceSuite('reference', () => createReferenceBackend(), { dtypes: ['f32'], policies: [crispSmall, flexPrefillSmall, crispGuardedSmall] });
defineConformanceSuite('reference, f16 and bf16', () => createReferenceBackend(), {
  dtypes: ['f16', 'bf16'],
  policies: [crispSmall],
  filter: /^(?!pipeline\/lifetime\/)/,
});
defineConformanceSuite('reference, presets as shipped', () => createReferenceBackend(), {
  dtypes: ['f32'],
  filter: /^pipeline\/(?!lifetime\/)/,
  policies: [crisp, flexPrefill],
});

// onResult is called in the vitest form too (checked below, after this suite ran)
const seenByOnResult: string[] = [];
defineConformanceSuite('reference, onResult', () => createReferenceBackend(), {
  dtypes: ['f32'],
  filter: /^transfer\//,
  onResult: (r) => seenByOnResult.push(`${r.name} ${r.passed}`),
});
describe('defineConformanceSuite', () => {
  it('calls options.onResult with each case result', () => {
    expect(seenByOnResult).toEqual(['transfer/n200-h2kv2-d64-b64/f32 true']);
  });
});

/**
 * A backend that delegates to the reference except for the overridden primitives. It keeps
 * the reference's name: its tensors are the reference's, and the pipeline refuses tensors
 * whose backend name is not the backend's (WRONG_BACKEND), which would fail every pipeline
 * case whatever the deliberate bug.
 */
function wrap(_what: string, overrides: (ref: Backend) => Partial<Backend>): () => Backend {
  return () => {
    const ref = createReferenceBackend();
    const o = overrides(ref);
    return {
      name: ref.name,
      capabilities: ref.capabilities,
      sparseCrossover: 0,
      upload: (t) => ref.upload(t),
      allocate: (dt, s) => ref.allocate(dt, s),
      write: (t, off, data) => ref.write(t, off, data),
      download: (t) => ref.download(t),
      proxyStats: (q, k, opts) => ref.proxyStats(q, k, opts),
      peBlockRows: (q, k, opts) => ref.peBlockRows(q, k, opts),
      expandMask: (m) => ref.expandMask(m),
      sparseAttention: (q, k, v, m, opts) => ref.sparseAttention(q, k, v, m, opts),
      denseAttention: (q, k, v, opts) => ref.denseAttention(q, k, v, opts),
      synchronize: () => ref.synchronize(),
      dispose: () => ref.dispose(),
      ...o,
    };
  };
}

/**
 * Plain-loop attention with two deliberate knobs: `slack` future keys visible (0 = causal)
 * and the GQA map. Used to build broken kernels the suite must catch.
 */
function brokenAttention(
  ref: Backend,
  knobs: { slack: number; kvHead: (h: number, H: number, Hkv: number) => number },
): Pick<Backend, 'sparseAttention' | 'denseAttention'> {
  const run = async (q: DeviceTensor, k: DeviceTensor, v: DeviceTensor, mask: BlockMask | undefined, opts: AttentionOptions = {}): Promise<AttentionResult> => {
    const [Q, K, V] = await Promise.all([ref.download(q), ref.download(k), ref.download(v)]);
    const [m, H, d] = Q.shape;
    const [n, Hkv] = K.shape;
    const [qv, kv, vv] = [toFloat32(Q), toFloat32(K), toFloat32(V)];
    const rows = mask ? expandToRows(mask) : undefined;
    const B = mask?.blockSize ?? n;
    const Nb = Math.ceil(n / B);
    const out = new Float32Array(m * H * d);
    const w = new Float64Array(n);
    for (let h = 0; h < H; h++) {
      const g = knobs.kvHead(h, H, Hkv);
      for (let i = 0; i < m; i++) {
        const pos = n - m + i;
        const I = Math.floor(pos / B);
        const allowed = new Uint8Array(Nb).fill(rows ? 0 : 1);
        if (rows) for (let p = rows.rowPtr[h * Nb + I]; p < rows.rowPtr[h * Nb + I + 1]; p++) allowed[rows.cols[p]] = 1;
        let mx = Number.NEGATIVE_INFINITY;
        const last = Math.min(n - 1, pos + knobs.slack);
        for (let j = 0; j <= last; j++) {
          w[j] = Number.NEGATIVE_INFINITY;
          if (!allowed[Math.floor(j / B)]) continue;
          let s = 0;
          for (let c = 0; c < d; c++) s += qv[(i * H + h) * d + c] * kv[(j * Hkv + g) * d + c];
          w[j] = s * (opts.scale ?? 1 / Math.sqrt(d));
          mx = Math.max(mx, w[j]);
        }
        let z = 0;
        for (let j = 0; j <= last; j++) z += (w[j] = Math.exp(w[j] - mx));
        for (let c = 0; c < d; c++) {
          let acc = 0;
          for (let j = 0; j <= last; j++) acc += w[j] * vv[(j * Hkv + g) * d + c];
          out[(i * H + h) * d + c] = acc / z;
        }
      }
    }
    const host = hostTensor(Q.dtype, [m, H, d], out);
    const output = opts.out ?? ref.allocate(Q.dtype, [m, H, d]);
    ref.write(output, 0, host.data);
    // the LSE is not part of the breakage: take the reference's
    const lo = { returnLse: true, scale: opts.scale };
    const lse = opts.returnLse ? (await (mask ? ref.sparseAttention(q, k, v, mask, lo) : ref.denseAttention(q, k, v, lo))).lse : undefined;
    return { output, lse };
  };
  return {
    sparseAttention: (q, k, v, mask, opts) => run(q, k, v, mask, opts),
    denseAttention: (q, k, v, opts) => run(q, k, v, undefined, opts),
  };
}

const gqa = (h: number, H: number, Hkv: number) => Math.floor(h / (H / Hkv));

const fixtures: { name: string; factory: () => Backend; filter: RegExp; mustFail: RegExp }[] = [
  {
    name: 'off-by-one causal mask (each query sees the next key)',
    factory: wrap('off-by-one', (ref) => brokenAttention(ref, { slack: 1, kvHead: gqa })),
    filter: /^(denseAttention|sparseAttention\/rows)\//,
    mustFail: /^(denseAttention|sparseAttention)\//,
  },
  {
    name: 'wrong GQA mapping (h % Hkv instead of floor(h / (H / Hkv)))',
    factory: wrap('wrong-gqa', (ref) => brokenAttention(ref, { slack: 0, kvHead: (h, _H, Hkv) => h % Hkv })),
    filter: /^denseAttention\//,
    mustFail: /^denseAttention\/n100-h8kv2/,
  },
  {
    name: 'one dropped block (the first block of each head\'s last query-block row)',
    factory: wrap('dropped-block', (ref) => ({
      sparseAttention: async (q, k, v, mask, opts) => {
        const rows = expandToRows(mask);
        const Nb = mask.numBlocks;
        const cols = Array.from(rows.cols);
        const rowPtr = Int32Array.from(rows.rowPtr);
        for (let h = mask.heads - 1; h >= 0; h--) {
          const r = h * Nb + Nb - 1;
          if (rowPtr[r + 1] - rowPtr[r] < 2) continue;
          cols.splice(rowPtr[r], 1);
          for (let x = r + 1; x < rowPtr.length; x++) rowPtr[x]--;
        }
        return ref.sparseAttention(q, k, v, { ...mask, vs: undefined, rows: { rowPtr, cols: Int32Array.from(cols) } }, opts);
      },
    })),
    filter: /^(sparseAttention\/mixed|pipeline\/crisp-b64)/,
    mustFail: /^(sparseAttention\/mixed|pipeline\/crisp-b64)/,
  },
  {
    name: 'a broken proxy statistic (slash block scores stored reversed, as FlexPrefill does)',
    factory: wrap('reversed-slash', (ref) => ({
      proxyStats: async (q, k, opts): Promise<ProxyStats> => {
        const s = await ref.proxyStats(q, k, opts);
        const slash = new Float64Array(s.slashBlocks.length);
        for (let h = 0; h < s.heads; h++) {
          for (let O = 0; O < s.numBlocks; O++) slash[h * s.numBlocks + O] = s.slashBlocks[h * s.numBlocks + s.numBlocks - 1 - O];
        }
        return { ...s, slashBlocks: slash };
      },
    })),
    filter: /^(proxyStats|pipeline\/crisp-b64)/,
    mustFail: /^(proxyStats|pipeline\/crisp-b64)/,
  },
  {
    name: 'a varlen kernel that reads every sequence\'s keys from the start of the packed k',
    factory: wrap('varlen-no-key-offset', (ref) => ({
      sliceRows: (t, start, rows) => ref.sliceRows!(t, start, rows),
      varlenAttention: (q, k, v, batch, opts) =>
        ref.varlenAttention!(q, k, v, { ...batch, segments: batch.segments.map((g) => ({ ...g, kStart: 0 })) }, opts),
    })),
    filter: /^varlen\/attention\//,
    mustFail: /^varlen\/attention\//,
  },
  {
    name: 'a varlen kernel that ignores the masks (every sequence dense)',
    factory: wrap('varlen-ignores-masks', (ref) => ({
      sliceRows: (t, start, rows) => ref.sliceRows!(t, start, rows),
      varlenAttention: (q, k, v, batch, opts) => ref.varlenAttention!(q, k, v, { ...batch, masks: batch.masks.map(() => undefined) }, opts),
    })),
    filter: /^varlen\/pipeline\/crisp/,
    mustFail: /^varlen\/pipeline\/crisp/,
  },
  {
    name: 'attention that ignores opts.scale (always 1/sqrt(d))',
    factory: wrap('ignores-attention-scale', (ref) => ({
      sparseAttention: (q, k, v, mask, opts) => ref.sparseAttention(q, k, v, mask, { ...opts, scale: undefined }),
    })),
    filter: /^sparseAttention\//,
    mustFail: /^sparseAttention\//,
  },
  {
    // (peBlockRows gets an explicit scale too, but its small shapes' maps hold 3 to 15
    // entries: the γ cut often keeps the same ones at either scale, so it cannot be required)
    name: 'statistics that ignore opts.scale (always 1/sqrt(d))',
    factory: wrap('ignores-stats-scale', (ref) => ({
      proxyStats: (q, k, opts) => ref.proxyStats(q, k, { ...opts, scale: undefined }),
    })),
    filter: /^proxyStats\//,
    mustFail: /^proxyStats\//,
  },
  {
    name: 'a backend that swallows errors (returns zeros for bad masks and NaN inputs)',
    factory: wrap('swallows-errors', (ref) => ({
      sparseAttention: async (q, k, v, mask, opts) => {
        try {
          return await ref.sparseAttention(q, k, v, mask, opts);
        } catch {
          const out = opts?.out ?? ref.allocate(q.dtype, q.shape);
          ref.write(out, 0, new Float32Array(q.shape.reduce((a, b) => a * b, 1)) as never);
          return { output: out };
        }
      },
    })),
    filter: /^errors\//,
    mustFail: /^errors\//,
  },
  {
    name: 'statistics that read q with its NaN and Inf replaced by zeros',
    factory: wrap('sanitises-q', (ref) => ({
      proxyStats: async (q, k, opts) => {
        const host = await ref.download(q);
        const vals = toFloat32(host).map((x) => (Number.isFinite(x) ? x : 0));
        return ref.proxyStats(ref.upload(hostTensor(host.dtype, host.shape, vals)), k, opts);
      },
    })),
    filter: /^errors\/non-finite\//,
    mustFail: /^errors\/non-finite\//,
  },
  {
    name: 'a kernel that skips the last query row (the poisoned output shows it)',
    factory: wrap('skips-last-row', (ref) => ({
      denseAttention: async (q, k, v, opts) => {
        const r = await ref.denseAttention(q, k, v, {});
        const host = await ref.download(r.output);
        const [m, H, d] = host.shape;
        if (opts?.out) ref.write(opts.out, 0, host.data.subarray(0, (m - 1) * H * d));
        return { output: opts?.out ?? r.output };
      },
    })),
    filter: /^denseAttention\//,
    mustFail: /^denseAttention\//,
  },
  {
    // a WeakRef keeps its target to the job's end
    name: 'a backend that keeps a WeakRef to every plan statistics object',
    factory: (() => {
      const kept: WeakRef<ProxyStats>[] = [];
      return wrap('weakref-stats', (ref) => ({
        proxyStats: async (q, k, opts): Promise<ProxyStats> => {
          const s = await ref.proxyStats(q, k, opts);
          kept.push(new WeakRef(s));
          return s;
        },
      }));
    })(),
    filter: /^pipeline\/lifetime\//,
    mustFail: /^pipeline\/lifetime\//,
  },
];

describe('the suite catches broken backends', () => {
  for (const f of fixtures) {
    it(f.name, async () => {
      const report = await runConformance(f.factory, {
        dtypes: ['f32'],
        filter: f.filter,
        policies: [crispSmall],
      });
      const failed = report.results.filter((r) => !r.passed).map((r) => r.name);
      const ran = report.results.map((r) => r.name);
      expect(ran.length).toBeGreaterThan(0);
      expect(failed.length, `${f.name}: nothing failed\n${formatReport(report)}`).toBeGreaterThan(0);
      // every case of the broken primitive fails, nothing else does
      for (const name of ran) {
        if (f.mustFail.test(name)) expect(failed, `${name} should fail (run seed ${report.seed})`).toContain(name);
      }
      for (const r of report.results.filter((x) => !x.passed)) {
        // failed for the deliberate bug, not because the wrapper's tensors were refused
        expect(r.detail).not.toMatch(/^threw CrispError \[WRONG_BACKEND\]/);
        expect(r.detail).toContain(`seed ${r.seed}`);
        expect(r.detail).toContain(`run seed ${report.seed}`);
      }
    });
  }
});

describe('runConformance', () => {
  it('the reference passes; results are reproducible from the printed seed', async () => {
    const opts = { seed: 12345, dtypes: ['bf16'] as const, filter: /^(sparseAttention\/vs|proxyStats)\/n100/ };
    const a = await runConformance(() => createReferenceBackend(), opts);
    const b = await runConformance(() => createReferenceBackend(), opts);
    expect(a.passed, formatReport(a)).toBe(true);
    expect(a.results.length).toBe(2);
    expect(a.results.map((r) => [r.name, r.seed, r.maxError])).toEqual(b.results.map((r) => [r.name, r.seed, r.maxError]));
    const c = await runConformance(() => createReferenceBackend(), { ...opts, seed: 54321 });
    expect(c.results[0].seed).not.toBe(a.results[0].seed);
  });

  it('checks sampled query rows above fullCheckLimit (the large-n path)', async () => {
    const r = await runConformance(() => createReferenceBackend(), {
      dtypes: ['f16'],
      filter: /^(denseAttention\/n200|sparseAttention\/mixed\/n200|pipeline\/(?!lifetime\/).*n1100)/,
      policies: [crispSmall],
      fullCheckLimit: 150,
      sampleCount: 7,
    });
    expect(r.passed, formatReport(r)).toBe(true);
    expect(r.results.map((x) => x.detail.match(/(\d+) of (\d+) query rows/)?.slice(1))).toEqual([
      ['7', '200'],
      ['7', '200'],
      ['7', '1100'],
      // the chunk of 300 rows over 1100 keys: its own rows sampled
      ['7', '300'],
    ]);
  });

  it('skips by name or pattern, and by declared capabilities, with the reason', async () => {
    const f16Only = wrap('f16-only', (ref) => ({ capabilities: { ...ref.capabilities, dtypes: ['f16'], chunkedPrefill: false } }));
    const r = await runConformance(f16Only, {
      dtypes: ['f32', 'f16'],
      filter: /^denseAttention\//,
      skip: { 'denseAttention/n200-*': 'not today' },
    });
    const by = Object.fromEntries(r.results.map((x) => [x.name, x.skipped]));
    expect(by['denseAttention/n200-h2kv2-d64-b64/f16']).toBe('not today');
    expect(by['denseAttention/n100-h8kv2-d128-b64/f32']).toMatch(/does not take f32/);
    expect(by['denseAttention/n190-m70-h4kv2-d64-b64/f16']).toMatch(/chunked/);
    expect(by['denseAttention/n300-h8kv1-d64-b128/f16']).toBeUndefined();
    expect(r.passed).toBe(true);
    expect(r.counts.passed).toBe(2);
  });

  it('a backend that throws fails its cases with the error code, without stopping the run', async () => {
    const throwing = wrap('throws', () => ({
      proxyStats: async () => {
        throw Object.assign(new Error('kernel launch failed'), { code: 'BACKEND_ERROR' });
      },
    }));
    const r = await runConformance(throwing, { dtypes: ['f32'], filter: /^proxyStats\/n(200|100)/ });
    expect(r.counts.failed).toBe(2);
    expect(r.results[0].detail).toMatch(/\[BACKEND_ERROR\]: kernel launch failed/);
  });

  it('lists edge-case shapes: n % B != 0, n < 2B, GQA 1/4/8, d 64/128, B 64/128, chunked, all three mask forms', () => {
    const names = listConformanceCases({ policies: [crispSmall, flexPrefillSmall] }).map((c) => c.name);
    for (const part of ['n200-h2kv2-d64-b64', 'n100-h8kv2-d128-b64', 'n300-h8kv1-d64-b128', 'n190-m70-h4kv2']) {
      expect(names.some((n) => n.includes(part))).toBe(true);
    }
    for (const form of ['vs', 'rows', 'mixed']) expect(names).toContain(`sparseAttention/${form}/n300-h8kv1-d64-b128/bf16`);
    expect(names).toContain('pipeline/flexPrefill-b64-kmin256/n1100-h4kv2-d64-b64/f16');
  });

  it('splits the suite into shards that hold every case once, and refuses a shard outside its count', () => {
    const opts = { sizes: 'large' as const, dtypes: ['bf16', 'f16'] as const, filter: /^(?!transfer)/ };
    const all = listConformanceCases(opts).map((c) => c.name);
    for (const count of [1, 2, 3, 5]) {
      const shards = Array.from({ length: count }, (_, index) => listConformanceCases({ ...opts, shard: { index, count } }).map((c) => c.name));
      expect(shards.flat().sort()).toEqual([...all].sort());
      // round robin: the sizes (and so the long cases) spread over the shards
      for (const s of shards) expect(Math.abs(s.length - all.length / count)).toBeLessThanOrEqual(1);
    }
    for (const bad of [{ index: 2, count: 2 }, { index: -1, count: 2 }, { index: 0, count: 0 }, { index: 0.5, count: 2 }]) {
      expect(() => listConformanceCases({ ...opts, shard: bad })).toThrow(/shard must be/);
    }
  });
});
