/**
 * The example model block (examples/attention-block.ts): its attention call swapped for
 * crispAttention, against TF.js's own dense attention on the same weights and input.
 */
import { dense } from '@crisp/presets';
import { beforeAll, describe, expect, it } from 'vitest';
import { compare } from '../examples/attention-block.js';
import { freshSeed, smallCrisp, startTfCpu } from './test-support.js';

beforeAll(startTfCpu);

const config = { dModel: 256, heads: 4, kvHeads: 2, headDim: 64 };

describe('examples/attention-block', () => {
  it('with the dense policy the block output equals the TF.js dense block', async () => {
    const seed = freshSeed();
    const rel = await compare(256, config, seed, { policy: dense });
    expect(rel, `seed ${seed}`).toBeLessThan(1e-5);
  });

  it('with a sparse CRISP policy the block output stays close to the dense block', async () => {
    const seed = freshSeed();
    const rel = await compare(1024, config, seed, { policy: smallCrisp, minSparseLength: 0 });
    console.log(`[tfjs] attention block, n = 1024, CRISP (64-token blocks) vs dense: max rel. difference ${rel.toExponential(2)} (seed ${seed})`);
    expect(rel, `seed ${seed}`).toBeGreaterThan(0);
    expect(rel, `seed ${seed}`).toBeLessThan(0.25);
  });
});
