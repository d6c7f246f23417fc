import { describe, expect, it } from 'vitest';
import { ncclMarkdown, ncclTable } from './nccl-table.js';

const rank = (r: number, prefillMs: number[], extra: Record<string, unknown> = {}) =>
  JSON.stringify({
    rank: r,
    prefillMs,
    timings: { planMs: 10 + r, exchangeMs: 2 * r, attentionMs: 100 - r },
    traffic: { kvBytesReceived: 1000 * (r + 1), kvBytesSent: 0, planBytesReceived: 5, denseRingBytes: 8000 },
    ...extra,
  });

describe('the NCCL scaling table', () => {
  it('takes each prefill at its slowest rank, the median over prefills, and the efficiency against one rank', () => {
    const rows = ncclTable([
      { name: 'nccl-p1-n1024.log', text: `{"nccl":"2.28.9","ranks":1}\n${rank(0, [400, 420, 380], { ok: true })}\n{"exitCodes":[0]}\n` },
      {
        name: 'nccl-p2-n1024.log',
        text: `${rank(1, [230, 205, 260])}\n${rank(0, [210, 250, 240], { ok: true })}\n`,
      },
      { name: 'other.log', text: rank(0, [1]) },
    ]);
    expect(rows.map((r) => [r.ranks, r.n])).toEqual([
      [1, 1024],
      [2, 1024],
    ]);
    const [one, two] = rows;
    expect(one.prefillMs).toBe(400);
    expect(one.efficiency).toBe(1);
    // slowest rank per prefill: 230, 250, 260; median 250; 400 / (2 · 250)
    expect(two.prefillMs).toBe(250);
    expect(two.efficiency).toBeCloseTo(0.8, 12);
    expect([two.planMs, two.exchangeMs, two.attentionMs]).toEqual([11, 2, 100]);
    expect(two.kvBytesReceived).toBe(3000);
    expect(two.denseRingBytes).toBe(8000);
    expect(two.check).toBe('ok');
    expect(two.errors).toEqual([]);
    expect(ncclMarkdown(rows)).toContain('| 1024 | 2 | 250.0 | 0.80 | 11.0 | 2.0 | 100.0 | 0.0 | 0.0 | ok |');
  });

  it('reports a rank that failed or never reported, and a check that was off or failed, without times from a partial run', () => {
    const rows = ncclTable([
      { name: 'nccl-p2-n4096.log', text: `${rank(0, [5, 6], { ok: false })}\n${rank(1, [5, 6])}\n` },
      { name: 'nccl-p4-n4096.log', text: `${rank(0, [3])}\n{"rank":1,"error":"NCCL: unhandled cuda error","code":"BACKEND_ERROR"}\n${rank(2, [3])}\n{"rank":3,` },
      { name: 'nccl-p2-n8192.log', text: `${rank(0, [7])}\n${rank(1, [8])}\n` },
    ]);
    const at = (ranks: number, n: number) => rows.find((r) => r.ranks === ranks && r.n === n);
    expect(at(2, 4096)?.check).toBe('failed');
    const four = at(4, 4096);
    expect(four?.errors).toEqual(['rank 1: NCCL: unhandled cuda error', 'rank 3: no report']);
    expect([four?.prefillMs, four?.kvBytesReceived, four?.check]).toEqual([null, null, 'failed']);
    expect(at(2, 8192)?.check).toBe('off');
    // no one-rank run at these lengths: no efficiency
    expect(rows.every((r) => r.efficiency === null)).toBe(true);
    expect(ncclMarkdown(rows)).toContain('failed: rank 1: NCCL: unhandled cuda error; rank 3: no report');
  });
});
