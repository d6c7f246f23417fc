import { CrispError, isCrispError } from '@crisp/core';
import { createReferenceBackend } from '@crisp/reference';
import { describe, expect, it } from 'vitest';
import { calibrateScenario, PROFILE_NAMES, scenario, uploadScenario } from './index.js';
import { attentionProbs } from './test-support.js';

// Fresh seed per run; printed so a failure can be replayed with SYNTH_SEED=<seed>.
const SEED = Number(process.env.SYNTH_SEED ?? Math.floor(Math.random() * 2 ** 31));
console.log(`synth tests: seed ${SEED} (replay with SYNTH_SEED=${SEED})`);

function bytesOf(t: { data: ArrayBufferView }): Buffer {
  return Buffer.from(t.data.buffer, t.data.byteOffset, t.data.byteLength);
}
// Byte comparison (vitest's deep equality is slow on megabyte arrays).
function sameBytes(a: { data: ArrayBufferView }, b: { data: ArrayBufferView }): boolean {
  return bytesOf(a).equals(bytesOf(b));
}

describe('scenario rows', () => {
  it('are deterministic by seed and differ across seeds', () => {
    const a = scenario('llama-like', { n: 1536, heads: 4, kvHeads: 2, headDim: 64, seed: SEED }).rows(0, 1536);
    const b = scenario('llama-like', { n: 1536, heads: 4, kvHeads: 2, headDim: 64, seed: SEED }).rows(0, 1536);
    const c = scenario('llama-like', { n: 1536, heads: 4, kvHeads: 2, headDim: 64, seed: SEED + 1 }).rows(0, 1536);
    for (const key of ['q', 'k', 'v'] as const) {
      expect(sameBytes(a[key], b[key])).toBe(true);
      expect(sameBytes(a[key], c[key])).toBe(false);
      // Never zeros, never NaN.
      const vals = a[key].data as Float32Array;
      let finite = 0;
      let nonzero = 0;
      for (const x of vals) {
        if (Number.isFinite(x)) finite++;
        if (x !== 0) nonzero++;
      }
      expect(finite).toBe(vals.length);
      expect(nonzero).toBeGreaterThan(vals.length / 2);
    }
  });

  for (const dtype of ['f32', 'bf16', 'f16'] as const) {
    it(`are chunk-invariant (${dtype})`, () => {
      const sc = scenario('retrieval', { n: 2100, heads: 8, kvHeads: 2, headDim: 32, dtype, seed: SEED });
      const whole = sc.rows(0, sc.n);
      expect(whole.q.dtype).toBe(dtype);
      expect(whole.q.shape).toEqual([2100, 8, 32]);
      expect(whole.k.shape).toEqual([2100, 2, 32]);
      const cuts = [0, 1, 97, 610, 611, 1999, 2100];
      for (const key of ['q', 'k', 'v'] as const) {
        const per = whole[key].data.length / sc.n;
        for (let c = 0; c + 1 < cuts.length; c++) {
          const part = sc.rows(cuts[c], cuts[c + 1])[key];
          expect(sameBytes(part, { data: whole[key].data.subarray(cuts[c] * per, cuts[c + 1] * per) })).toBe(true);
          expect(part.data.length).toBe((cuts[c + 1] - cuts[c]) * per);
        }
      }
    });
  }

  it('reject bad options with INVALID_ARGUMENT', () => {
    const bad: [string, object][] = [
      ['nope', {}],
      ['llama-like', { heads: 6, kvHeads: 4 }],
      ['llama-like', { headDim: 16 }],
      ['llama-like', { headDim: 63 }],
      ['llama-like', { n: 0 }],
      ['llama-like', { n: 1.5 }],
      ['llama-like', { dtype: 'f64' }],
    ];
    for (const [p, o] of bad) {
      let err: unknown;
      try {
        scenario(p, o);
      } catch (e) {
        err = e;
      }
      expect(isCrispError(err), `${p} ${JSON.stringify(o)}`).toBe(true);
      expect((err as CrispError).code === 'INVALID_ARGUMENT' || (err as CrispError).code === 'DTYPE_MISMATCH').toBe(true);
    }
    const sc = scenario('llama-like', { n: 300 });
    expect(() => sc.rows(10, 5)).toThrow(/rows\(start, end\)/);
    expect(() => sc.rows(0, 301)).toThrow(CrispError);
  });
});

describe('ground truth holds in the exact attention', () => {
  it('needles are attended by their asker rows and not by others', () => {
    const sc = scenario('retrieval', { n: 4096, heads: 8, kvHeads: 2, headDim: 64, seed: SEED });
    const { q, k } = sc.rows(0, sc.n);
    expect(sc.truth.needles.length).toBeGreaterThan(0);
    let checked = 0;
    for (const nd of sc.truth.needles) {
      for (const h of nd.readers) {
        const [a, b] = nd.askers[0];
        const inNeedle = (p: Float64Array) => {
          let s = 0;
          for (let j = nd.position; j < nd.position + nd.length; j++) s += p[j];
          return s;
        };
        const asker = inNeedle(attentionProbs(q, k, h, b - 1, sc.scale));
        // The planted mass target is 0.04-0.16 at the calibration row.
        expect(asker, `needle ${nd.id} head ${h}`).toBeGreaterThan(0.02);
        // Rows after the needle that do not ask for it give it background mass only. The
        // background is heavy-tailed by design, so judge the median over nine non-asker rows.
        const others: number[] = [];
        for (let t = 0; t < 9; t++) {
          const row = a - 40 - 7 * t;
          if (row <= nd.position + nd.length) break;
          if (nd.askers.some(([x, y]) => row >= x && row < y)) continue;
          others.push(inNeedle(attentionProbs(q, k, h, row, sc.scale)));
        }
        if (others.length >= 3) {
          others.sort((x, y) => x - y);
          expect(others[others.length >> 1], `needle ${nd.id} head ${h}: non-asker rows`).toBeLessThan(asker / 10);
        }
        checked++;
      }
    }
    expect(checked).toBeGreaterThan(1);
  });

  it('slash lines sit at the chosen offsets and stripes on the listed keys', () => {
    const sc = scenario('llama-like', { n: 3072, heads: 16, kvHeads: 4, headDim: 64, seed: SEED, slashOffsets: [700] });
    const { q, k } = sc.rows(0, sc.n);
    const slashHeads = sc.truth.heads.filter((t) => t.kind === 'slash');
    const vertical = sc.truth.heads.filter((t) => t.kind === 'vertical');
    expect(slashHeads.length).toBeGreaterThan(0);
    expect(vertical.length).toBeGreaterThan(0);
    const i = sc.n - 1;
    for (const t of slashHeads) {
      expect(t.slashOffsets.every((o) => o === 700)).toBe(true);
      // Over 24 rows: mass per token on the line (j = i - 700 ± 2) against its neighbours
      // 24-56 tokens to either side; averaging over rows evens out the salience of the spans.
      let line = 0;
      let near = 0;
      for (let r = 0; r < 24; r++) {
        const row = i - 37 * r;
        const p = attentionProbs(q, k, t.head, row, sc.scale);
        for (let e = -2; e <= 2; e++) line += p[row - 700 + e] / 5;
        for (let d = 24; d < 56; d++) near += (p[row - 700 - d] + p[row - 700 + d]) / 64;
      }
      expect(line, `slash head ${t.head}`).toBeGreaterThan(4 * near);
    }
    for (const t of vertical) {
      const stripes = sc.truth.stripes[t.kvHead];
      expect(stripes.length).toBeGreaterThan(0);
      const p = attentionProbs(q, k, t.head, i, sc.scale);
      let onStripes = 0;
      for (const j of stripes) onStripes += p[j];
      // the vertical heads' stripe mass target is 0.06-0.14 at the last row
      expect(onStripes, `vertical head ${t.head}`).toBeGreaterThan(0.03);
      expect(onStripes).toBeLessThan(0.3);
    }
  });

  it('qwen-like spreads the sink over more tokens than llama-like', () => {
    const topShare = (profile: string) => {
      const sc = scenario(profile, { n: 2048, heads: 8, kvHeads: 2, headDim: 64, seed: SEED });
      const { q, k } = sc.rows(0, sc.n);
      const shares: number[] = [];
      for (const t of sc.truth.heads) {
        if (t.expectedRoute !== 'vs') continue;
        const p = attentionProbs(q, k, t.head, sc.n - 1, sc.scale);
        let block = 0;
        for (let j = 0; j < 128; j++) block += p[j];
        shares.push(p[0] / block);
      }
      return shares.reduce((s, x) => s + x, 0) / shares.length;
    };
    const llama = topShare('llama-like');
    const qwen = topShare('qwen-like');
    expect(llama).toBeGreaterThan(0.5);
    expect(qwen).toBeLessThan(0.2);
  });
});

describe('calibration on the reference backend', () => {
  for (const profile of ['llama-like', 'qwen-like'] as const) {
    it(`${profile} meets the paper's targets at n = 4096`, async () => {
      const sc = scenario(profile, { n: 4096, heads: 16, kvHeads: 4, headDim: 64, seed: SEED });
      const rep = await calibrateScenario(createReferenceBackend(), sc, { chunkRows: 1000 });
      expect(rep.failures, `seed ${SEED}`).toEqual([]);
      const vs = rep.perHead.filter((c) => sc.truth.heads[c.head].expectedRoute === 'vs');
      for (const c of vs) {
        expect(c.sinkMass).toBeGreaterThanOrEqual(0.6);
        expect(c.sinkMass).toBeLessThanOrEqual(0.95);
        expect(c.decades).toBeGreaterThanOrEqual(4);
        // C_struct routes every VS head to VS.
        expect(c.route).toBe('vs');
      }
      expect(rep.summary.anchorTop1Share).toBeGreaterThanOrEqual(0.9);
      // Diffuse heads are PE heads: little anchor mass.
      for (const c of rep.perHead.filter((x) => x.kind === 'diffuse')) expect(c.cStruct).toBeLessThan(0.2);
    });
  }

  it('keeps the sink mass when n quadruples (strengths follow n)', async () => {
    const at = async (n: number) => {
      const sc = scenario('llama-like', { n, heads: 3, kvHeads: 1, headDim: 64, seed: SEED });
      const rep = await calibrateScenario(createReferenceBackend(), sc);
      return rep.perHead.map((c) => c.sinkMass);
    };
    const small = await at(4096);
    const large = await at(12288);
    for (let h = 0; h < small.length; h++) expect(Math.abs(small[h] - large[h])).toBeLessThan(0.12);
  });

  it('retrieval and diffuse profiles route heads as their kinds say', async () => {
    expect(PROFILE_NAMES).toEqual(['llama-like', 'qwen-like', 'retrieval', 'diffuse']);
    for (const profile of ['retrieval', 'diffuse']) {
      const sc = scenario(profile, { n: 4096, heads: 8, kvHeads: 2, headDim: 64, seed: SEED });
      const rep = await calibrateScenario(createReferenceBackend(), sc);
      const agree = rep.perHead.filter((c) => c.route === sc.truth.heads[c.head].expectedRoute).length;
      expect(agree / rep.perHead.length, `${profile} seed ${SEED}`).toBeGreaterThanOrEqual(0.85);
    }
  });
});

describe('uploadScenario', () => {
  it('streams chunks that reassemble to the whole tensors', async () => {
    const be = createReferenceBackend();
    const sc = scenario('llama-like', { n: 1000, heads: 4, kvHeads: 2, headDim: 32, dtype: 'bf16', seed: SEED });
    const seen: number[] = [];
    const starts: number[] = [];
    const hostQ = new Uint16Array(sc.n * 4 * 32);
    const t = await uploadScenario(be, sc, {
      chunkRows: 333,
      onProgress: (r) => seen.push(r),
      onChunk: (start, c) => {
        starts.push(start);
        hostQ.set(c.q.data as Uint16Array, start * 4 * 32);
      },
    });
    expect(seen).toEqual([333, 666, 999, 1000]);
    expect(starts).toEqual([0, 333, 666, 999]);
    expect(Buffer.from(hostQ.buffer).equals(Buffer.from((sc.rows(0, sc.n).q.data as Uint16Array).buffer))).toBe(true);
    const whole = sc.rows(0, sc.n);
    for (const key of ['q', 'k', 'v'] as const) {
      const got = await be.download(t[key]);
      expect(got.shape).toEqual(whole[key].shape);
      expect(sameBytes(got, whole[key])).toBe(true);
      t[key].dispose();
    }
    await expect(uploadScenario(be, sc, { chunkRows: 0 })).rejects.toThrow(/chunkRows/);
  });
});
