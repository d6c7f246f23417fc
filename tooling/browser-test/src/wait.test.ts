import { describe, expect, it } from 'vitest';
import { PageStalled, waitWithProgress } from './index.js';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe('waitWithProgress', () => {
  it('returns once the page is done', async () => {
    let polls = 0;
    await waitWithProgress(
      async () => ++polls >= 3,
      async () => 'running',
      { stallMs: 1_000, totalMs: 5_000, pollMs: 5 },
    );
    expect(polls).toBe(3);
  });

  it('keeps waiting past the stall limit while the progress line moves', async () => {
    const t0 = Date.now();
    let step = 0;
    await waitWithProgress(
      async () => Date.now() - t0 > 300,
      async () => `step ${step++}`,
      { stallMs: 100, totalMs: 5_000, pollMs: 10 },
    );
    expect(Date.now() - t0).toBeGreaterThan(300);
  });

  it('fails with the line the page stood on', async () => {
    const err = await waitWithProgress(
      async () => false,
      async () => 'warm-up: dense attention',
      { stallMs: 100, totalMs: 5_000, pollMs: 10 },
    ).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(PageStalled);
    expect((err as PageStalled).progress).toBe('warm-up: dense attention');
    expect((err as PageStalled).stoodMs).toBeGreaterThan(100);
    expect((err as PageStalled).message).toMatch(/no progress for 0 s .* last progress line: 'warm-up: dense attention'/);
  });

  it('fails at the total limit even while the line moves', async () => {
    let step = 0;
    const err = await waitWithProgress(
      async () => false,
      async () => `step ${step++}`,
      { stallMs: 1_000, totalMs: 150, pollMs: 10 },
    ).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(PageStalled);
    expect((err as PageStalled).waitedMs).toBeGreaterThan(150);
    expect((err as PageStalled).stoodMs).toBeLessThan(1_000);
  });

  it('fails when the page stops answering', async () => {
    const err = await waitWithProgress(
      () => sleep(10_000).then(() => true),
      async () => 'float64 reference',
      { stallMs: 100, totalMs: 5_000, pollMs: 10 },
    ).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(PageStalled);
    expect((err as PageStalled).message).toMatch(/did not answer in 0 s/);
  });
});
