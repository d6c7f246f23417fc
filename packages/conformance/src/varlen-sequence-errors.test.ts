/**
 * varlenPrefill on the reference: an error raised inside one sequence (a NaN in its rows,
 * found while planning it or while attending over it) names that sequence and its packed
 * rows, since the row in the inner message counts from the sequence's first; the same batch
 * without the NaN matches exact float64 attention over each sequence alone.
 *
 * Shape legend: q [Mq, H, d], k and v [Nk, Hkv, d] packed.
 */
import { type CrispError, type HostTensor, NonFiniteError, hostTensor, isCrispError, mulberry32, toFloat32, varlenPrefill } from '@crisp/core';
import { crisp, dense } from '@crisp/presets';
import { attentionRows, createReferenceBackend } from '@crisp/reference';
import { describe, expect, it } from 'vitest';

const [H, Hkv, d] = [4, 2, 64];

function random(rows: number, heads: number, seed: number): HostTensor {
  const r = mulberry32(seed);
  return hostTensor('f32', [rows, heads, d], Array.from({ length: rows * heads * d }, () => 2 * r() - 1));
}

/** rows [r0, r1) of a [rows, heads, d] host tensor */
function rows(t: HostTensor, r0: number, r1: number): HostTensor {
  const per = t.shape[1] * t.shape[2];
  return { dtype: t.dtype, shape: [r1 - r0, t.shape[1], t.shape[2]], data: t.data.subarray(r0 * per, r1 * per) };
}

async function thrown(p: Promise<unknown>): Promise<CrispError> {
  try {
    await p;
  } catch (e) {
    if (isCrispError(e)) return e;
    throw e;
  }
  throw new Error('expected a CrispError');
}

describe('varlenPrefill names the sequence an error comes from', () => {
  it('a NaN in a dense sequence: NON_FINITE naming the sequence and its packed rows; the clean batch is exact', async () => {
    const be = createReferenceBackend();
    const cu = [0, 50, 100, 130];
    const q = random(130, H, 1);
    const k = random(130, Hkv, 2);
    const v = random(130, Hkv, 3);
    const res = await varlenPrefill(be, { q: be.upload(q), k: be.upload(k), v: be.upload(v) }, { cuSeqlensQ: cu }, dense);
    const out = toFloat32(await be.download(res.output));
    const seqRows = Array.from({ length: 50 }, (_, i) => i);
    const exact = attentionRows(rows(q, 50, 100), rows(k, 50, 100), rows(v, 50, 100), seqRows);
    let err = 0;
    for (let i = 0; i < exact.output.length; i++) err = Math.max(err, Math.abs(out[50 * H * d + i] - exact.output[i]));
    expect(err).toBeLessThan(1e-6);

    const bad = random(130, H, 1);
    (bad.data as Float32Array)[(70 * H + 1) * d + 3] = Number.NaN; // packed row 70: sequence 1's row 20
    const e = await thrown(varlenPrefill(be, { q: be.upload(bad), k: be.upload(k), v: be.upload(v) }, { cuSeqlensQ: cu }, dense));
    expect(e.code).toBe('NON_FINITE');
    expect(e).toBeInstanceOf(NonFiniteError);
    expect(e.message).toMatch(/sequence 1 \(packed q rows \[50, 100\), k rows \[50, 100\)/);
    expect(e.message).toMatch(/row 20, head 1, column 3/);
    expect(e.details?.sequence).toBe(1);
    be.dispose();
  });

  it('a NaN in the keys of a sparse sequence, found while planning it, names that sequence', async () => {
    const be = createReferenceBackend();
    const cuQ = [0, 40, 1140];
    const k = random(1140, Hkv, 5);
    (k.data as Float32Array)[(47 * Hkv + 0) * d + 9] = Number.POSITIVE_INFINITY; // packed key row 47: sequence 1's row 7
    const e = await thrown(
      varlenPrefill(be, { q: be.upload(random(1140, H, 4)), k: be.upload(k), v: be.upload(random(1140, Hkv, 6)) }, { cuSeqlensQ: cuQ }, crisp, {
        minSparseLength: 0,
      }),
    );
    expect(e.code).toBe('NON_FINITE');
    expect(e.message).toMatch(/sequence 1 \(packed q rows \[40, 1140\), k rows \[40, 1140\)/);
    expect(e.message).toMatch(/row 7\b/);
    be.dispose();
  });
});
