/**
 * Statistics kept on the device (stand-in driver, no GPU): a plan's statistics keep their block
 * scores in a device buffer until read; past 127 kept ones (DEVICE_STATS_KEPT x 2 - 1) the
 * oldest ones are downloaded for their objects and their buffers go back, and statistics the
 * program has let go of leave without a download once their collection is reported.
 * proxyStats does not walk every kept entry on each call (such a walk would sit between the
 * proxy pass's launch and the following launch); these tests hold what the walk did. The
 * entries hold no WeakRef (with one, a loop of awaited calls kept every statistics object alive).
 */
import { COLLECTION_SENTINEL, collectionReported, formatReport, garbageCollector, runConformance } from '@crisp/conformance';
import { describe, expect, it } from 'vitest';
import { CudaBackend, type CudaTensor } from './index.js';
import { standInDriver } from './stand-in-driver.js';

const n = 8192;
const H = 8;
const B = 128;
const Nb = n / B;
// the block statistics' download: p_v, p_s and the pooled estimate, H·Nb f64 each
const blockBytes = 3 * H * Nb * 8;
const opts = { blockSize: B, wSink: 128, wLocal: 256, deferRead: true, optionalStats: [] } as const;

/** A full collection on demand (these tests run in Node, where there is one). */
async function collector(): Promise<() => void> {
  const gc = await garbageCollector();
  if (!gc) throw new Error('no garbage collection on demand in this runtime');
  return gc;
}

/**
 * Runs a full collection and waits until `registry` has reported it (collectionReported;
 * a minute without the report fails: a hang guard). Registries report in tasks of their own,
 * queued together: two timer turns after the sentinel cover the backend's.
 */
async function collectAndSettle(gc: () => void, registry: FinalizationRegistry<unknown>, reported: () => boolean): Promise<void> {
  if (!(await collectionReported(gc, registry, reported))) throw new Error('the collection was not reported within a minute');
  for (let i = 0; i < 2; i++) await new Promise((r) => setTimeout(r, 0));
}

/**
 * Collects what the test let go of and waits until the backend's registry has reported it:
 * collectable after a turn of the event loop, reported on a later one (collectAndSettle).
 */
async function collectDropped(gc: () => void): Promise<void> {
  await new Promise((r) => setTimeout(r, 0));
  let reported = false;
  const registry = new FinalizationRegistry(() => {
    reported = true;
  });
  await collectAndSettle(gc, registry, () => reported);
}

function setup() {
  const s = standInDriver({ heads: H });
  const be = new CudaBackend(s.libs, { cacheDir: null });
  const q = be.allocate('bf16', [n, H, 128]) as CudaTensor;
  const k = be.allocate('bf16', [n, 2, 128]) as CudaTensor;
  const downloads = () => s.log.filter((e) => (e.kind === 'read' || e.kind === 'copyRead') && e.bytes === blockBytes).length;
  return { s, be, q, k, downloads };
}

describe('statistics kept on the device (stand-in driver)', () => {
  it('past 127 kept statistics the oldest live ones are downloaded, once each and oldest first; the rest stay on the device', async () => {
    const { be, q, k, downloads } = setup();
    const kept = [];
    for (let i = 0; i < 130; i++) kept.push(await be.proxyStats(q, k, opts));
    // calls 128 and 129 each found 128 kept: one download each (calls 0 and 1's statistics)
    expect(downloads()).toBe(2);
    void kept[0].verticalBlocks;
    void kept[1].slashBlocks;
    expect(downloads()).toBe(2); // already in their objects
    void kept[2].verticalBlocks;
    expect(downloads()).toBe(3); // still on the device until read
    void kept[129].verticalBlocks;
    expect(downloads()).toBe(4);
    be.dispose();
  });

  // (fails if the backend holds its statistics objects strongly anywhere: they would not be
  // collected, and the eviction past the cap would download them)
  it('statistics the program let go of are not downloaded when newer ones need the room', async () => {
    const gc = await collector();
    const { be, q, k, downloads } = setup();
    for (let i = 0; i < 140; i++) {
      await be.proxyStats(q, k, opts);
      if (i % 16 === 15) await collectDropped(gc);
    }
    expect(downloads()).toBe(0);
    be.dispose();
  });

  // (fails if the backend makes a WeakRef to its statistics: V8 keeps a WeakRef's target alive
  // to the end of the job that made it, so a loop of awaited calls, one job, kept all of them,
  // with what the eviction downloaded into them)
  it('a loop of awaited calls does not keep its statistics alive, downloaded ones included', async () => {
    const gc = await collector();
    const { be, q, k, downloads } = setup();
    let collected = 0;
    let reported = false;
    const registry = new FinalizationRegistry((held) => {
      if (held === COLLECTION_SENTINEL) reported = true;
      else collected++;
    });
    for (let i = 0; i < 140; i++) registry.register(await be.proxyStats(q, k, opts), i);
    // past the cap, the oldest were downloaded (the backend cannot tell that they are garbage)
    expect(downloads()).toBe(12);
    // collected in the same job (the collection runs before any await); the registry reports
    // it in later tasks, which on a loaded machine come after any fixed number of timer turns
    await collectAndSettle(gc, registry, () => reported);
    expect(collected).toBeGreaterThanOrEqual(139);
    be.dispose();
  });

  it('keeps token scores of deferred statistics with them: read back only when asked or evicted, released with the entry', async () => {
    const gc = await collector();
    const { s, be, q, k } = setup();
    const tokenBytes = H * n * 4;
    const tokenReads = () => s.log.filter((e) => (e.kind === 'read' || e.kind === 'copyRead') && e.bytes === tokenBytes).length;
    const withTokens = { ...opts, tokenScores: true } as const;
    const live0 = be.poolStats().liveBytes;
    const a = await be.proxyStats(q, k, withTokens);
    expect(tokenReads()).toBe(0);
    // about 2·H·n·4 bytes more live while kept
    expect(be.poolStats().liveBytes - live0).toBeGreaterThanOrEqual(2 * tokenBytes);
    expect(a.verticalTokens).toHaveLength(H * n);
    expect(a.slashTokens).toHaveLength(H * n);
    expect(tokenReads()).toBe(2);
    // past 127 kept statistics the oldest are downloaded, tokens too (here the count cap
    // decides: 0.5 MiB of tokens each is far below the byte cap)
    const kept = [];
    for (let i = 0; i < 130; i++) kept.push(await be.proxyStats(q, k, withTokens));
    // 131 made, 3 evicted: a (its tokens read already), kept[0] and kept[1] (two reads each)
    expect(tokenReads()).toBe(2 + 2 * 2);
    expect(kept[0].verticalTokens).toHaveLength(H * n);
    expect(tokenReads()).toBe(6);
    // dropped ones leave without a download
    kept.length = 0;
    await collectDropped(gc);
    expect(tokenReads()).toBe(6);
    be.dispose();
    expect(s.memory.badFrees).toBe(0);
  });

  // the same through the whole pipeline, as @crisp/conformance checks every backend (the GPU
  // runs it too; the stand-in's reads are zeros, which does not matter for lifetimes)
  it('passes the conformance lifetime case (awaited prefills in one job) on the stand-in driver', async () => {
    const r = await runConformance(() => new CudaBackend(standInDriver({ heads: 4 }).libs, { cacheDir: null }), {
      filter: /^pipeline\/lifetime\//,
      dtypes: ['bf16'],
    });
    expect(r.results.length).toBe(1);
    expect(r.passed, formatReport(r)).toBe(true);
  });
});
