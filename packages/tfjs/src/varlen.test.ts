/**
 * crispAttentionVarlen on TF.js's cpu backend (the host path to the float64 reference): a
 * ragged batch equals one crispAttention call per sequence, chunked sequences equal core's
 * sparsePrefill on the reference, a 16-bit-only backend gets cast inputs, and bad input is
 * refused with the core's typed errors before any value is read.
 */
import { type Backend, type BlockMask, CrispError, castHost, hostTensor, sparsePrefill, toFloat32 } from '@crisp/core';
import { dense } from '@crisp/presets';
import { createReferenceBackend } from '@crisp/reference';
import { beforeAll, describe, expect, it } from 'vitest';
import { crispAttention, crispAttentionVarlen } from './index.js';
import { freshSeed, maxAbsDiff, sixteenBitOnly, smallCrisp, startTfCpu, tf, values } from './test-support.js';

beforeAll(startTfCpu);

const [H, Hkv, d] = [4, 2, 64];

/** Sequences of these lengths, packed along the rows, with their own values each. */
function packed(seed: number, lengths: readonly number[]) {
  const seqs = lengths.map((n, i) => ({ n, ...values(seed + i, { n, H, Hkv, d }) }));
  const cat = (part: 'q' | 'k' | 'v') => {
    const out = new Float32Array(seqs.reduce((a, s) => a + s[part].length, 0));
    let at = 0;
    for (const s of seqs) {
      out.set(s[part], at);
      at += s[part].length;
    }
    return out;
  };
  const total = lengths.reduce((a, n) => a + n, 0);
  const cu = [0];
  for (const n of lengths) cu.push(cu[cu.length - 1] + n);
  return {
    seqs,
    cu,
    q: tf.tensor(cat('q'), [total, H, d], 'float32'),
    k: tf.tensor(cat('k'), [total, Hkv, d], 'float32'),
    v: tf.tensor(cat('v'), [total, Hkv, d], 'float32'),
  };
}

describe('crispAttentionVarlen on TF.js cpu', () => {
  it('a ragged batch: each sequence planned on its own, its rows as one crispAttention call on it', async () => {
    const seed = freshSeed();
    const lengths = [1100, 300, 777];
    const x = packed(seed, lengths);
    const before = tf.memory().numTensors;
    const r = await crispAttentionVarlen(x.q, x.k, x.v, { cuSeqlensQ: x.cu }, { policy: smallCrisp, minSparseLength: 0, backend: 'reference' });
    expect(r.path).toBe('host');
    expect(r.backend).toBe('reference');
    expect(r.output.shape).toEqual([x.cu[3], H, d]);
    expect(r.output.dtype).toBe('float32');
    expect(r.plans).toHaveLength(3);
    expect(r.routes.map((x) => x.length)).toEqual([H, H, H]);
    expect(r.plans[0].mask, `seed ${seed}: the long sequence's plan is sparse`).toBeDefined();
    const got = await r.output.data();
    for (let s = 0; s < lengths.length; s++) {
      const n = lengths[s];
      const one = x.seqs[s];
      const [q, k, v] = [
        tf.tensor(one.q, [n, H, d], 'float32'),
        tf.tensor(one.k, [n, Hkv, d], 'float32'),
        tf.tensor(one.v, [n, Hkv, d], 'float32'),
      ];
      const alone = await crispAttention(q, k, v, { policy: smallCrisp, minSparseLength: 0, backend: 'reference' });
      expect(r.plans[s].overallDensity, `sequence ${s}, seed ${seed}`).toBe(alone.plans[0].overallDensity);
      expect(r.routes[s]).toEqual(alone.routes[0]);
      const rows = got.subarray(x.cu[s] * H * d, x.cu[s + 1] * H * d);
      expect(maxAbsDiff(rows, await alone.output.data()), `sequence ${s}, seed ${seed}`).toBeLessThan(1e-6);
      tf.dispose([q, k, v, alone.output]);
    }
    // the density over the batch: the sequences' selected causal blocks over all of theirs
    const causal = r.plans.map((p) => p.shape.heads * ((p.numBlocks * (p.numBlocks + 1)) / 2));
    const selected = r.plans.reduce((a, p, s) => a + p.overallDensity * causal[s], 0);
    expect(r.density).toBeCloseTo(selected / causal.reduce((a, c) => a + c, 0), 12);
    expect(tf.memory().numTensors).toBe(before + 1);
    tf.dispose([x.q, x.k, x.v, r.output]);
  });

  it("chunked sequences (queries the last m_s of n_s positions): each equals core's sparsePrefill of that chunk on the reference", async () => {
    const seed = freshSeed();
    const keys = [900, 400];
    const queries = [250, 400];
    const x = packed(seed, keys);
    // q holds each sequence's last m_s rows
    const qRows = queries.map((m, s) => x.seqs[s].q.subarray((keys[s] - m) * H * d));
    const qPacked = tf.tensor(Float32Array.from([...qRows[0], ...qRows[1]]), [queries[0] + queries[1], H, d], 'float32');
    const cuQ = [0, queries[0], queries[0] + queries[1]];
    const r = await crispAttentionVarlen(qPacked, x.k, x.v, { cuSeqlensQ: cuQ, cuSeqlensK: x.cu }, { policy: smallCrisp, minSparseLength: 0 });
    expect(r.output.shape).toEqual([cuQ[2], H, d]);
    expect(r.plans[0].mask, `seed ${seed}: the long sequence's plan is sparse`).toBeDefined();
    const got = await r.output.data();
    const ref = createReferenceBackend();
    for (let s = 0; s < 2; s++) {
      const one = x.seqs[s];
      const want = await sparsePrefill(
        ref,
        {
          q: ref.upload(hostTensor('f32', [queries[s], H, d], qRows[s])),
          k: ref.upload(hostTensor('f32', [keys[s], Hkv, d], one.k)),
          v: ref.upload(hostTensor('f32', [keys[s], Hkv, d], one.v)),
        },
        smallCrisp,
        { minSparseLength: 0 },
      );
      expect(r.plans[s].overallDensity, `sequence ${s}, seed ${seed}`).toBe(want.plan.overallDensity);
      const rows = got.subarray(cuQ[s] * H * d, cuQ[s + 1] * H * d);
      expect(maxAbsDiff(rows, toFloat32(await ref.download(want.output))), `sequence ${s}, seed ${seed}`).toBeLessThan(1e-6);
    }
    tf.dispose([qPacked, x.q, x.k, x.v, r.output]);
  });

  it('a backend without f32 gets the inputs cast to the asked 16-bit dtype', async () => {
    const ref = createReferenceBackend();
    const sixteen = sixteenBitOnly(ref);
    const seed = freshSeed();
    const x = packed(seed, [200, 130]);
    const r = await crispAttentionVarlen(x.q, x.k, x.v, { cuSeqlensQ: x.cu }, { policy: dense, backend: sixteen, deviceDtype: 'f16' });
    const got = await r.output.data();
    for (let s = 0; s < 2; s++) {
      const one = x.seqs[s];
      const n = one.n;
      const up = (vals: Float32Array, heads: number) => ref.upload(castHost(hostTensor('f32', [n, heads, d], vals), 'f16'));
      const want = toFloat32(await ref.download((await ref.denseAttention(up(one.q, H), up(one.k, Hkv), up(one.v, Hkv))).output));
      expect(maxAbsDiff(got.subarray(x.cu[s] * H * d, x.cu[s + 1] * H * d), want), `sequence ${s}, seed ${seed}`).toBe(0);
    }
    tf.dispose([x.q, x.k, x.v, r.output]);
  });

  it('bad input: typed errors naming crispAttentionVarlen, before any value is read, and no tensor left behind', async () => {
    const x = packed(freshSeed(), [300, 200]);
    let reads = 0;
    for (const t of [x.q, x.k, x.v]) {
      const data = t.data.bind(t);
      t.data = (() => {
        reads++;
        return data();
      }) as typeof t.data;
    }
    const before = tf.memory().numTensors;
    const fails = async (f: () => Promise<unknown>): Promise<CrispError> => {
      const e = await f().then(
        () => undefined,
        (err: unknown) => err,
      );
      expect(e).toBeInstanceOf(CrispError);
      return e as CrispError;
    };
    // cu_seqlens that do not end at the packed rows
    let e = await fails(() => crispAttentionVarlen(x.q, x.k, x.v, { cuSeqlensQ: [0, 300, 499] }, { backend: 'reference' }));
    expect(e.message).toMatch(/cuSeqlensQ/);
    // not non-decreasing
    e = await fails(() => crispAttentionVarlen(x.q, x.k, x.v, { cuSeqlensQ: [0, 350, 300, 500] }, { backend: 'reference' }));
    expect(e.code).toBe('INVALID_ARGUMENT');
    // q and k of different row counts without cuSeqlensK
    const kShort = tf.slice(x.k, [0, 0, 0], [400, Hkv, d]);
    const vShort = tf.slice(x.v, [0, 0, 0], [400, Hkv, d]);
    e = await fails(() => crispAttentionVarlen(x.q, kShort, vShort, { cuSeqlensQ: x.cu }, { backend: 'reference' }));
    expect(e.code).toBe('SHAPE_MISMATCH');
    // a batched (rank 4) q
    const q4 = tf.reshape(x.q, [1, 500, H, d]);
    e = await fails(() => crispAttentionVarlen(q4, x.k, x.v, { cuSeqlensQ: x.cu }, { backend: 'reference' }));
    expect(e.code).toBe('SHAPE_MISMATCH');
    expect(e.message).toMatch(/crispAttentionVarlen: q must be the packed sequences/);
    // an unknown option
    e = await fails(() => crispAttentionVarlen(x.q, x.k, x.v, { cuSeqlensQ: x.cu }, { backnd: 'reference' } as never));
    expect(e.code).toBe('INVALID_ARGUMENT');
    expect(e.message).toMatch(/crispAttentionVarlen/);
    // a backend that runs no ragged batches
    const ref = createReferenceBackend();
    const plain: Backend = new Proxy(ref, {
      get(t, p) {
        if (p === 'varlenAttention') return undefined;
        const v = Reflect.get(t, p);
        return typeof v === 'function' ? v.bind(t) : v;
      },
    });
    e = await fails(() => crispAttentionVarlen(x.q, x.k, x.v, { cuSeqlensQ: x.cu }, { backend: plain }));
    expect(e.code).toBe('UNSUPPORTED');
    expect(reads).toBe(0);
    expect(tf.memory().numTensors).toBe(before + 3);
    tf.dispose([kShort, vShort, q4, x.q, x.k, x.v]);
  });

  it('an empty sequence (no query rows) gets a dense, empty plan and no output rows', async () => {
    const x = packed(freshSeed(), [260, 0, 140]);
    const r = await crispAttentionVarlen(x.q, x.k, x.v, { cuSeqlensQ: x.cu }, { policy: dense });
    expect(r.plans).toHaveLength(3);
    expect(r.plans[1].denseReason).toBe('empty');
    expect(r.output.shape).toEqual([400, H, d]);
    const mask: BlockMask | undefined = r.plans[0].mask;
    expect(mask).toBeUndefined();
    tf.dispose([x.q, x.k, x.v, r.output]);
  });
});
