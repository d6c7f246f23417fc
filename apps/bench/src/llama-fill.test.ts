import { describe, expect, it } from 'vitest';
import { crispHash, llamaRows } from './llama-fill.js';

describe('llama fill (port of kernels-cuda bench.cu)', () => {
  it('hashes like crisp_hash (values computed with the PyTorch peer formula in Python int arithmetic)', () => {
    expect([crispHash(0, 1), crispHash(12345, 7), crispHash(2 ** 31 + 5, 3), crispHash(5 * 2 ** 32 + 77, 9)]).toEqual([
      824515495, 2333044867, 4103894930, 2734161393,
    ]);
  });
  it('is chunk-invariant and puts the sink on the first 4 keys', () => {
    const whole = llamaRows(1, 0, 64, 2, 64, 8, 11);
    const parts = [llamaRows(1, 0, 23, 2, 64, 8, 11), llamaRows(1, 23, 64, 2, 64, 8, 11)];
    expect(Array.from(whole)).toEqual([...parts[0], ...parts[1]]);
    for (let pos = 0; pos < 8; pos++) expect(whole[(pos * 2 + 1) * 64 + 32]).toBe(pos < 4 ? 40 : 0);
    // diffuse query heads (h mod 4 == 3) carry no sink or slash features
    const q = llamaRows(0, 100, 101, 4, 64, 4, 11);
    expect(q[3 * 64 + 32]).toBe(0);
    expect(q[0 * 64 + 32]).toBe(4);
    expect(q[3 * 64 + 40]).toBe(0);
  });
});
