import type { CrispError, HostTensor } from '@crisp/core';
import { crispSmall } from '@crisp/conformance';
import { createReferenceBackend } from '@crisp/reference';
import { scenario } from '@crisp/synth';
import { describe, expect, it } from 'vitest';
import { createLocalGroup } from './local-group.js';
import { shardTensor, zigzagLayout } from './layout.js';
import { parallelPrefill, type ShardInputs } from './prefill.js';

const n = 1200;
const P = 3;
const layout = zigzagLayout(n, P, 64);
const sc = scenario('llama-like', { n, heads: 4, kvHeads: 2, headDim: 32, seed: 5, dtype: 'f32' });
const whole = sc.rows(0, n);
const shard = (r: number): ShardInputs => ({ q: shardTensor(layout, r, whole.q), k: shardTensor(layout, r, whole.k), v: shardTensor(layout, r, whole.v) });

/** Run every rank with its inputs; every rank's outcome (settled, so a hang shows as the test's timeout). */
function runAll(inputs: ShardInputs[], policies = inputs.map(() => crispSmall)) {
  const comms = createLocalGroup(P);
  return Promise.allSettled(comms.map((c, r) => parallelPrefill(c, createReferenceBackend(), layout, inputs[r], policies[r])));
}

function codes(outcomes: PromiseSettledResult<unknown>[]): string[] {
  return outcomes.map((o) => (o.status === 'rejected' ? (o.reason as CrispError).code : 'ok'));
}

describe('parallelPrefill: bad input on one rank stops every rank with the same code', () => {
  it("NaN in one rank's keys: NON_FINITE everywhere, the others naming that rank", async () => {
    const inputs = [0, 1, 2].map(shard);
    const k = inputs[1].k;
    const data = Float32Array.from(k.data as Float32Array);
    data[7] = Number.NaN;
    inputs[1] = { ...inputs[1], k: { ...k, data } as HostTensor };
    const out = await runAll(inputs);
    expect(codes(out)).toEqual(['NON_FINITE', 'NON_FINITE', 'NON_FINITE']);
    expect(String((out[0] as PromiseRejectedResult).reason.message)).toMatch(/rank 1 failed in decoding the shards/);
    expect(String((out[1] as PromiseRejectedResult).reason.message)).toMatch(/rank 1's k shard holds NaN/);
  });

  it('a shard of the wrong length or head count: SHAPE_MISMATCH everywhere', async () => {
    const inputs = [0, 1, 2].map(shard);
    const q = inputs[2].q;
    inputs[2] = { ...inputs[2], q: { ...q, shape: [q.shape[0] - 1, 4, 32], data: q.data.subarray(0, (q.shape[0] - 1) * 128) } };
    expect(codes(await runAll(inputs))).toEqual(['SHAPE_MISMATCH', 'SHAPE_MISMATCH', 'SHAPE_MISMATCH']);
    const other = scenario('llama-like', { n, heads: 2, kvHeads: 2, headDim: 32, seed: 5, dtype: 'f32' }).rows(0, n);
    const mixed = [0, 1, 2].map(shard);
    mixed[0] = { q: shardTensor(layout, 0, other.q), k: shardTensor(layout, 0, other.k), v: shardTensor(layout, 0, other.v) };
    const res = await runAll(mixed);
    expect(codes(res)).toEqual(['SHAPE_MISMATCH', 'SHAPE_MISMATCH', 'SHAPE_MISMATCH']);
    expect(String((res[1] as PromiseRejectedResult).reason.message)).toMatch(/rank 1's shard has .* rank 0's/);
  });

  it("a policy whose block size is not the layout's: INVALID_ARGUMENT everywhere", async () => {
    const inputs = [0, 1, 2].map(shard);
    const wrong = { ...crispSmall, blockSize: 128 };
    expect(codes(await runAll(inputs, [crispSmall, wrong, crispSmall]))).toEqual(['INVALID_ARGUMENT', 'INVALID_ARGUMENT', 'INVALID_ARGUMENT']);
  });

  it('a communicator of another size is refused before any collective', async () => {
    const [c] = createLocalGroup(2);
    await expect(parallelPrefill(c, createReferenceBackend(), layout, shard(0), crispSmall)).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
  });
});
