import { createReferenceBackend } from '@crisp/reference';
import { describe, expect, it } from 'vitest';
import { inputsProgress, latencyInputs } from './inputs.js';

describe('inputsProgress', () => {
  it('logs once each interval while inputs are made, and nothing for quick ones or at the end', () => {
    let t = 1000;
    const lines: string[] = [];
    const p = inputsProgress((m) => lines.push(m), '  latency cuda n=524288', 10_000, () => t);
    t += 4000;
    p(100_000, 524_288);
    expect(lines).toEqual([]);
    t += 7000; // 11 s in
    p(200_000, 524_288);
    expect(lines).toEqual(['  latency cuda n=524288: inputs 38% (200000 of 524288 rows, 11 s)']);
    t += 5000; // 16 s: not 10 s since the last line
    p(300_000, 524_288);
    expect(lines).toHaveLength(1);
    t += 6000; // 22 s
    p(400_000, 524_288);
    expect(lines[1]).toBe('  latency cuda n=524288: inputs 76% (400000 of 524288 rows, 22 s)');
    t += 60_000;
    p(524_288, 524_288); // done: the size's own summary line follows
    expect(lines).toHaveLength(2);
  });
});

describe('latencyInputs', () => {
  for (const kind of ['synth', 'fill'] as const) {
    it(`reports the rows written to onProgress (${kind} inputs, streamed in chunks)`, async () => {
      const b = createReferenceBackend();
      const calls: [number, number][] = [];
      const shape = { heads: 4, kvHeads: 2, headDim: 64 };
      // 4M q values a chunk: n = 20,000 with H·d = 256 is two chunks
      const n = 20_000;
      const t = await latencyInputs(b, 'llama-like', n, shape, 'f32', 7, 1e12, kind, (done, total) => calls.push([done, total]));
      try {
        expect(calls.length).toBe(2);
        expect(calls[0][0]).toBeGreaterThan(0);
        expect(calls[0][0]).toBeLessThan(n);
        expect(calls.at(-1)).toEqual([n, n]);
        // the values are there (not zeros)
        const q = await b.download(t.q);
        expect(q.data.some((x) => x !== 0)).toBe(true);
      } finally {
        t.dispose();
      }
    });
  }
});
