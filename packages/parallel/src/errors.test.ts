import type { CrispError, HostTensor } from '@crisp/core';
import { crispSmall } from '@crisp/conformance';
import { createReferenceBackend } from '@crisp/reference';
import { scenario } from '@crisp/synth';
import { describe, expect, it } from 'vitest';
import { createLocalGroup } from './local-group.js';
import { shardFromRows, shardTensor, unshardTensor, zigzagLayout } from './layout.js';
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

  it('a layout for another number of ranks: INVALID_ARGUMENT on every rank of the communicator', async () => {
    const comms = createLocalGroup(2);
    const out = await Promise.allSettled(comms.map((c, r) => parallelPrefill(c, createReferenceBackend(), layout, shard(r), crispSmall)));
    expect(codes(out)).toEqual(['INVALID_ARGUMENT', 'INVALID_ARGUMENT']);
  });

  it('a policy only one rank finds invalid: INVALID_ARGUMENT everywhere, no rank left waiting', async () => {
    const inputs = [0, 1, 2].map(shard);
    const bad = { ...crispSmall, vs: { ...crispSmall.vs!, kMin: -1 } };
    const out = await runAll(inputs, [crispSmall, bad, crispSmall]);
    expect(codes(out)).toEqual(['INVALID_ARGUMENT', 'INVALID_ARGUMENT', 'INVALID_ARGUMENT']);
    expect(String((out[0] as PromiseRejectedResult).reason.message)).toMatch(/rank 1 failed in checking the shards/);
  });

  it('a backend that is not one, on one rank: INVALID_ARGUMENT everywhere', async () => {
    const comms = createLocalGroup(P);
    const out = await Promise.allSettled(
      comms.map((c, r) => parallelPrefill(c, r === 2 ? ({} as ReturnType<typeof createReferenceBackend>) : createReferenceBackend(), layout, shard(r), crispSmall)),
    );
    expect(codes(out)).toEqual(['INVALID_ARGUMENT', 'INVALID_ARGUMENT', 'INVALID_ARGUMENT']);
  });

  it('options: a bad scale is refused before the plan; ranks given different scales or layouts are refused', async () => {
    const comms = () => createLocalGroup(P);
    const run = (opts: (r: number) => object, lay: (r: number) => typeof layout = () => layout) =>
      Promise.allSettled(comms().map((c, r) => parallelPrefill(c, createReferenceBackend(), lay(r), shard(r), crispSmall, opts(r))));
    for (const scale of [Number.NaN, -1, 'x']) {
      const out = await run(() => ({ scale }));
      expect(codes(out), String(scale)).toEqual(['INVALID_ARGUMENT', 'INVALID_ARGUMENT', 'INVALID_ARGUMENT']);
      expect(String((out[0] as PromiseRejectedResult).reason.message)).toMatch(/scale must be a positive finite number/);
    }
    const differ = await run((r) => ({ scale: r === 1 ? 0.2 : 0.1 }));
    expect(codes(differ)).toEqual(['INVALID_ARGUMENT', 'INVALID_ARGUMENT', 'INVALID_ARGUMENT']);
    expect(String((differ[0] as PromiseRejectedResult).reason.message)).toMatch(/rank 1 was given another scale than rank 0/);
    // the same block size and rank count, cut differently: another n
    const other = zigzagLayout(n - 64, P, 64);
    const moved = await run(() => ({}), (r) => (r === 2 ? other : layout));
    expect(codes(moved)).not.toContain('ok');
    expect(new Set(codes(moved)).size).toBe(1);
  });
});

describe('layout helpers: a layout that is not one is INVALID_ARGUMENT, not a TypeError', () => {
  it('shardTensor, shardFromRows, unshardTensor', () => {
    const bad = [null, undefined, { n: 512, size: 2 }, { ...layout, ranges: [] }];
    for (const l of bad) {
      expect(() => shardTensor(l as never, 0, whole.q)).toThrow(expect.objectContaining({ code: 'INVALID_ARGUMENT' }));
      expect(() => shardFromRows(l as never, 0, () => whole.q)).toThrow(expect.objectContaining({ code: 'INVALID_ARGUMENT' }));
      expect(() => unshardTensor(l as never, [])).toThrow(expect.objectContaining({ code: 'INVALID_ARGUMENT' }));
    }
    expect(() => unshardTensor(layout, null as never)).toThrow(expect.objectContaining({ code: 'INVALID_ARGUMENT' }));
    expect(() => unshardTensor(layout, [null, null, null] as never)).toThrow(expect.objectContaining({ code: 'INVALID_ARGUMENT' }));
    expect(() => shardTensor(layout, 3, whole.q)).toThrow(/rank must be an integer in \[0, 3\)/);
  });
});
