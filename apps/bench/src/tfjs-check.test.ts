/**
 * The tfjs suite's float64 row check (checkRows): over a sparse mask it must agree with the
 * reference backend's masked attention, and it must see a wrong row.
 */
import { type BlockMask, hostTensor, mulberry32, toFloat32, vsListsFromArrays } from '@crisp/core';
import { createReferenceBackend } from '@crisp/reference';
import { describe, expect, it } from 'vitest';
import { checkRows } from './suites/tfjs.js';

describe('tfjs suite: checkRows', () => {
  it('agrees with the reference on a VS mask, and catches a changed output row', async () => {
    const seed = Math.floor(Math.random() * 2 ** 31);
    const r = mulberry32(seed);
    const [n, H, Hkv, d, B] = [512, 4, 2, 64, 64];
    const u = (len: number) => Float32Array.from({ length: len }, () => r() * 2 - 1);
    const host = [u(n * H * d), u(n * Hkv * d), u(n * Hkv * d)];
    const Nb = n / B;
    // vertical block 0 and the diagonal for every head; head 1 also slash offset 2
    const mask: BlockMask = { heads: H, numBlocks: Nb, blockSize: B, vs: vsListsFromArrays([[0], [0, 3], [0], [0]], [[0], [0, 2], [0], [0]]) };
    const ref = createReferenceBackend();
    const [q, k, v] = host.map((x, i) => ref.upload(hostTensor('f32', [n, i === 0 ? H : Hkv, d], x)));
    const sparse = toFloat32(await ref.download((await ref.sparseAttention(q, k, v, mask)).output));
    const dense = toFloat32(await ref.download((await ref.denseAttention(q, k, v)).output));
    const shape = { heads: H, kvHeads: Hkv, headDim: d };
    const data = (x: Float32Array) => ({ data: async () => x });
    expect(await checkRows(data(sparse), host, n, shape, mask), `seed ${seed}`).toBeLessThan(1e-6);
    expect(await checkRows(data(dense), host, n, shape), `seed ${seed}`).toBeLessThan(1e-6);
    // the sparse output is not the dense one on the checked rows, and vice versa
    expect(await checkRows(data(sparse), host, n, shape)).toBeGreaterThan(1e-3);
    expect(await checkRows(data(dense), host, n, shape, mask)).toBeGreaterThan(1e-3);
    // one changed value in a checked row (row n-1 of the last head) is seen
    const bad = sparse.slice();
    bad[((n - 1) * H + H - 1) * d + 5] += 0.5;
    expect(await checkRows(data(bad), host, n, shape, mask)).toBeGreaterThan(0.1);
  });
});
