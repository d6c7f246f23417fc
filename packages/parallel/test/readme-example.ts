import { hostTensor, mulberry32, sparsePrefill } from '@crisp/core';
import { createLocalGroup, parallelPrefill, shardTensor, unshardTensor, zigzagLayout } from '@crisp/parallel';
import { crisp } from '@crisp/presets';
import { createReferenceBackend } from '@crisp/reference';

export async function parallelExample(seed = 1) {
  // One layer: q [n, H, d], k and v [n, Hkv, d], sharded over 3 ranks in blocks of crisp's B = 128.
  const [n, H, Hkv, d, ranks] = [2500, 2, 1, 32, 3];
  const uniform = mulberry32(seed);
  const random = (shape: number[]) => hostTensor('f32', shape, Array.from({ length: shape[0] * shape[1] * shape[2] }, () => uniform() * 2 - 1));
  const [q, k, v] = [random([n, H, d]), random([n, Hkv, d]), random([n, Hkv, d])];
  const layout = zigzagLayout(n, ranks, 128); // rank r holds chunks r and 2P - 1 - r of 2P

  // Every rank calls parallelPrefill with its own rows; here the ranks share one thread.
  const comms = createLocalGroup(ranks);
  const results = await Promise.all(
    comms.map((comm, r) => {
      const shard = { q: shardTensor(layout, r, q), k: shardTensor(layout, r, k), v: shardTensor(layout, r, v) };
      return parallelPrefill(comm, createReferenceBackend(), layout, shard, crisp);
    }),
  );
  const output = unshardTensor(layout, results.map((x) => x.output)); // [n, H, d]
  for (const [r, x] of results.entries()) {
    console.log(`rank ${r}: received ${x.traffic.kvBytesReceived} K/V bytes (a dense ring: ${x.traffic.denseRingBytes} in all)`);
  }

  // The same layer on one backend: the same plan, the same output.
  const one = createReferenceBackend();
  const single = await sparsePrefill(one, { q: one.upload(q), k: one.upload(k), v: one.upload(v) }, crisp, { minSparseLength: 0 });
  return { output, single: await one.download(single.output), plans: results.map((x) => x.plan), singlePlan: single.plan };
}
