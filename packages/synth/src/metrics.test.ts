import { type ProxyStats, vsListsFromArrays } from '@crisp/core';
import { describe, expect, it } from 'vitest';
import { calibrate, type GroundTruth, needleRecall } from './index.js';


/** Proxy statistics with hand-set block masses (only the fields calibrate reads matter). */
function stats(pv: number[][], cStruct: number[]): ProxyStats {
  const H = pv.length;
  const Nb = pv[0].length;
  return {
    n: Nb * 128,
    heads: H,
    blockSize: 128,
    numBlocks: Nb,
    proxyRows: 128,
    cStruct: Float64Array.from(cStruct),
    verticalBlocks: Float64Array.from(pv.flat()),
    slashBlocks: new Float64Array(H * Nb),
    pooledEstimate: new Float64Array(H * Nb),
    rowEntropy: new Float64Array(H),
  };
}

describe('calibrate', () => {
  it('reads sink mass, top-1 place, percentiles and decades off p_v', () => {
    // head 0: sink head spanning 5 decades; head 1: local top; head 2: diffuse, top elsewhere.
    const s = stats(
      [
        [0.9, 1e-5, 0.02, 0.03, 0.04, 0.00999],
        [0.3, 0.01, 0.02, 0.03, 0.04, 0.6],
        [0.05, 0.3, 0.2, 0.2, 0.15, 0.1],
      ],
      [0.93, 0.9, 0.12],
    );
    const rep = calibrate(s);
    const [a, b, c] = rep.perHead;
    expect(a.sinkMass).toBe(0.9);
    expect(a.top1Where).toBe('sink');
    expect(a.decades).toBeCloseTo(5 - Math.log10(1 / 0.9), 10);
    expect(a.percentiles.p0).toBe(1e-5);
    expect(a.percentiles.p100).toBe(0.9);
    // p50 of 6 sorted values: halfway between the 3rd and 4th
    expect(a.percentiles.p50).toBeCloseTo((0.02 + 0.03) / 2, 12);
    expect(b.top1Where).toBe('local');
    expect(b.top1Block).toBe(5);
    expect(c.top1Where).toBe('other');
    expect(c.top1Block).toBe(1);
    expect(c.route).toBe('pe');
    expect(rep.summary.vsHeads).toBe(2);
    expect(rep.summary.anchorTop1Share).toBeCloseTo(2 / 3, 12);
    expect(rep.summary.vsSinkMin).toBe(0.3);
    // head 1's sink 0.3 is outside [0.6, 0.95], its masses span < 4 decades; 67% < 90%.
    expect(rep.failures.length).toBe(3);
    expect(rep.failures.join('\n')).toMatch(/head 1: VS sink mass 0.300/);
    expect(rep.failures.join('\n')).toMatch(/66.7% of heads/);
    expect(() => calibrate(s, { tauProxy: 2 })).toThrow(/tauProxy/);
  });
});

describe('needleRecall', () => {
  const truth: Pick<GroundTruth, 'needles'> = {
    needles: [
      // key block 3 (tokens 400..415 at B = 128), asked by rows in query blocks 7 and 8
      { id: 0, kvHead: 0, position: 400, length: 16, readers: [0, 1], askers: [[950, 1030]], visibleToProxy: true },
      // key block 5, asked only by block 6 rows
      { id: 1, kvHead: 0, position: 650, length: 8, readers: [1], askers: [[800, 832]], visibleToProxy: false },
    ],
  };
  const Nb = 9;

  it('counts a needle only when every asker block selects its key block', () => {
    // head 0: vertical block 3 (all query blocks >= 3 see it) -> needle 0 recalled
    // head 1: slash offset 4 -> (7, 3) selected, (8, 3) not -> needle 0 missed in block 8;
    //         vertical 5 -> needle 1 recalled
    const vs = vsListsFromArrays([[0, 3], [0, 5]], [[0], [0, 4]]);
    const rep = needleRecall({ mask: { heads: 2, numBlocks: Nb, blockSize: 128, vs }, blockSize: 128, numBlocks: Nb }, truth);
    expect(rep.total).toBe(3);
    expect(rep.recalled).toBe(2);
    expect(rep.recall).toBeCloseTo(2 / 3, 12);
    const miss = rep.hits.find((x) => !x.recalled)!;
    expect(miss).toMatchObject({ needle: 0, head: 1, keyBlocks: [3], queryBlocks: [7, 8], missedIn: [8] });
    // visible needle 0: 1 of 2 reader heads
    expect(rep.visibleRecall).toBe(0.5);
    expect(rep.visibleTotal).toBe(2);
  });

  it('is 1 for a dense plan and rejects needles beyond the plan', () => {
    expect(needleRecall({ blockSize: 128, numBlocks: Nb }, truth).recall).toBe(1);
    expect(() => needleRecall({ blockSize: 64, numBlocks: 4 }, truth)).toThrow(/beyond/);
  });
});
