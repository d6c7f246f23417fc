/**
 * Each preset through sparsePrefill on the reference backend, checked against dense
 * attention with the error the selection implies. For one query row with dense attention
 * P, mass recall r = Σ_{j ∈ S} P_j over the selected keys S, and sparse output
 * O_S = Σ_{j∈S} P_j v_j / r:
 *
 *   O_dense = r · O_S + (1 − r) · O_out   =>   ‖O_S − O_dense‖ = (1 − r) ‖O_S − O_out‖
 *                                                              <= 2 (1 − r) max_j ‖v_j‖.
 *
 * So a selection that keeps 99% of a row's mass moves that row by at most 2% of the largest
 * value vector; the test checks that bound per row and head, and that the sparse output
 * is exactly the attention restricted to the mask (nothing else approximated).
 */
import { type HostTensor, type Policy, sparsePrefill, toFloat32 } from '@crisp/core';
import { attentionRows, createReferenceBackend, massRecall, sampleRows } from '@crisp/reference';
import { cumulativeCoverage, globalCoverage, noiseFloor } from '@crisp/select';
import { describe, expect, it } from 'vitest';
import { freshSeed, type HeadKind, mixedHeads } from './__fixtures__/heads.js';
import { presets } from './index.js';

const n = 2048;
const kinds: Array<{ kind: HeadKind; strength?: number }> = [
  { kind: 'sink', strength: 9 },
  { kind: 'sink', strength: 12 },
  { kind: 'local', strength: 12 },
  { kind: 'diffuse' },
];
const H = kinds.length;
const d = 16;

function maxValueNorm(v: HostTensor, h: number): number {
  const x = toFloat32(v);
  let best = 0;
  for (let j = 0; j < n; j++) {
    let s = 0;
    for (let c = 0; c < d; c++) s += x[(j * H + h) * d + c] ** 2;
    best = Math.max(best, Math.sqrt(s));
  }
  return best;
}

describe.each(Object.keys(presets) as Array<keyof typeof presets>)('sparsePrefill with the %s preset', (name) => {
  it('matches dense attention within 2 (1 − r) max‖v‖ per row, and equals attention restricted to its mask', async () => {
    const seed = freshSeed();
    // B = 64 so n = 2048 has 32 blocks to choose from (the reference runs at unit-test speed).
    const p = name === 'dense' ? presets.dense : withBlock64(presets[name]);
    const x = mixedHeads({ n, heads: kinds, seed });
    const be = createReferenceBackend();
    const inputs = { q: be.upload(x.q), k: be.upload(x.k), v: be.upload(x.v) };
    const out = be.allocate('f32', [n, H, d]);
    be.write(out, 0, new Float32Array(n * H * d).fill(Number.NaN));
    const res = await sparsePrefill(be, inputs, p, { out });
    const got = toFloat32(await be.download(res.output));
    const msg = `seed ${seed} preset ${name}`;
    const rows = sampleRows(n, 96);
    const dense = attentionRows(x.q, x.k, x.v, rows);
    const plan = res.plan;
    if (name === 'dense') {
      expect(plan.mask, msg).toBeUndefined();
      for (let t = 0; t < rows.length; t++) {
        for (let c = 0; c < H * d; c++) {
          expect(Math.abs(got[rows[t] * H * d + c] - dense.output[t * H * d + c]), msg).toBeLessThan(1e-5);
        }
      }
      return;
    }
    const mask = plan.mask!;
    const restricted = attentionRows(x.q, x.k, x.v, rows, mask);
    let minRecall = 1;
    let maxErr = 0;
    let maxRatio = 0;
    const vmax = Array.from({ length: H }, (_, h) => maxValueNorm(x.v, h));
    for (let t = 0; t < rows.length; t++) {
      const recall = massRecall(x.q, x.k, mask, { rows: [rows[t]] }).perHead;
      for (let h = 0; h < H; h++) {
        const r = recall[h];
        let e2 = 0;
        let s2 = 0;
        for (let c = 0; c < d; c++) {
          const g = got[(rows[t] * H + h) * d + c];
          e2 += (g - dense.output[(t * H + h) * d + c]) ** 2;
          s2 += (g - restricted.output[(t * H + h) * d + c]) ** 2;
        }
        const err = Math.sqrt(e2);
        const bound = 2 * (1 - r) * vmax[h];
        // f32 output against float64 references: 1e-5 of the value scale.
        expect(err, `${msg} head ${h} row ${rows[t]} recall ${r}`).toBeLessThanOrEqual(bound + 1e-5 * vmax[h]);
        expect(Math.sqrt(s2), `${msg} head ${h} row ${rows[t]}`).toBeLessThan(1e-5 * vmax[h]);
        minRecall = Math.min(minRecall, r);
        maxErr = Math.max(maxErr, err);
        if (bound > 0) maxRatio = Math.max(maxRatio, err / bound);
      }
    }
    console.log(
      `${name}: density ${plan.overallDensity.toFixed(3)} (per head ${Array.from(plan.density, (x) => x.toFixed(2))}), routes ${plan.routing?.routes}, min recall ${minRecall.toFixed(4)}, max row error ${maxErr.toExponential(2)}, max error/bound ${maxRatio.toFixed(3)}`,
    );
    // The bound was exercised: the plan is sparse, some rows lost mass and moved.
    expect(plan.overallDensity, msg).toBeLessThan(0.9);
    expect(minRecall, msg).toBeLessThan(0.999);
    expect(maxErr, msg).toBeGreaterThan(1e-4);
  });
});


/** The preset with B = 64 and k_min = 256 (4 blocks), so n = 2048 has 32 blocks to choose from. */
function withBlock64(p: Policy): Policy {
  const vs =
    p.vs?.name.startsWith('noiseFloor') === true
      ? noiseFloor({ alpha: (p.vs as unknown as { alpha: number }).alpha, kMin: 256 })
      : cumulativeCoverage({ gamma: 0.95, kMin: 256 });
  return { ...p, blockSize: 64, kMin: 256, vs, pe: globalCoverage({ gamma: 0.95, kMin: 256 }) };
}
