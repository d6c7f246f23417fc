/**
 * The README's user-written policy is examples/custom-policy.ts verbatim; this test checks
 * the copy and runs the file, asserting what the policy must do.
 */
import { readFileSync } from 'node:fs';
import { toFloat32, vsHead } from '@crisp/core';
import { attentionRows, sampleRows } from '@crisp/reference';
import { describe, expect, it } from 'vitest';
import { anchorsOrConcentrated, jsdRobust, mine, prefill, twiceTheMean } from '../examples/custom-policy.js';
import { freshSeed, mixedHeads } from './__fixtures__/heads.js';

const readme = readFileSync(new URL('../README.md', import.meta.url), 'utf8');
const example = readFileSync(new URL('../examples/custom-policy.ts', import.meta.url), 'utf8');

describe('the README example', () => {
  it('is examples/custom-policy.ts verbatim', () => {
    const marker = '<!-- example:custom-policy';
    const at = readme.indexOf(marker);
    expect(at).toBeGreaterThan(0);
    const open = readme.indexOf('```ts\n', at) + '```ts\n'.length;
    const close = readme.indexOf('```\n', open);
    expect(readme.slice(open, close)).toBe(example);
  });

  it('runs: the custom router and selector decide, and the output is exact attention over the mask', async () => {
    const seed = freshSeed();
    const n = 2048;
    const x = mixedHeads({ n, heads: [{ kind: 'sink', strength: 11 }, { kind: 'local', strength: 12 }, { kind: 'diffuse' }], seed });
    const { output, plan } = await prefill(mine, x.q, x.k, x.v);
    const msg = `seed ${seed}`;
    const stats = plan.stats!;
    // The router's decisions are its formula on the statistics the pipeline measured.
    const expected = Array.from(stats.cStruct, (c, h) => (Math.max(c, 1 - stats.rowEntropy[h] / Math.log(n)) >= 0.2 ? 'vs' : 'pe'));
    expect(plan.routing?.routes, msg).toEqual(expected);
    expect(plan.routing?.routes, msg).toEqual(['vs', 'vs', 'pe']);
    expect(plan.routing?.scoreName).toBe(anchorsOrConcentrated.route(stats).scoreName);
    // VS heads carry exactly the selector's blocks.
    const Nb = plan.numBlocks;
    for (const h of [0, 1]) {
      const p = stats.verticalBlocks.subarray(h * Nb, (h + 1) * Nb);
      const mu = (1 - p[0] - p[Nb - 1]) / (Nb - 2);
      const v = Array.from(vsHead(plan.mask!.vs!, h).vertical);
      expect(v, msg).toEqual(Array.from(twiceTheMean.select({ direction: 'vertical', head: h, blockScores: p, blockSize: 128, n })));
      const top4 = [...p.keys()].sort((a, b) => p[b] - p[a] || a - b).slice(0, 4);
      const want = [...new Set([...[...p.keys()].filter((J) => p[J] > 2 * mu), ...top4, 0, Nb - 1])].sort((a, b) => a - b);
      expect(v, msg).toEqual(want);
    }
    // The output is attention restricted to the plan's blocks (f32 vs float64).
    const rows = sampleRows(n, 64);
    const exact = attentionRows(x.q, x.k, x.v, rows, plan.mask);
    const got = toFloat32(output);
    const H = 3;
    const d = 16;
    for (let t = 0; t < rows.length; t++) {
      for (let c = 0; c < H * d; c++) {
        expect(Math.abs(got[rows[t] * H * d + c] - exact.output[t * H * d + c]), msg).toBeLessThan(1e-5);
      }
    }
    expect(plan.overallDensity, msg).toBeLessThan(0.9);

    // The mixed policy (JSD router + robust floor) runs through the same path.
    const mixed = await prefill(jsdRobust, x.q, x.k, x.v);
    expect(mixed.plan.routing?.scoreName, msg).toBe('JSD distance');
    expect(mixed.plan.routing?.routes[0], msg).toBe('vs');
    expect(mixed.plan.routing?.routes[2], msg).toBe('pe');
  });
});
