/**
 * The host path's plumbing (stand-in driver, no GPU). What a launch hands the kernel: each argument's bytes read back
 * through cuLaunchKernel's kernelParams, with device addresses above 2^32 (the high half of a
 * pointer must arrive too). The kernels' arithmetic on these arguments is the conformance
 * suite's, on the H200. Device marks: which pairs msSince takes.
 */
import { describe, expect, it } from 'vitest';
import { CudaBackend, type CudaTensor } from './index.js';
import { standInDriver } from './stand-in-driver.js';

const split = (x: number): [number, number] => [x % 2 ** 32, Math.floor(x / 2 ** 32)];

describe('kernel arguments (stand-in driver)', () => {
  it("passes pointers above 2^32, ints and floats through kernelParams, launch after launch", async () => {
    const s = standInDriver({ heads: 8, baseAddress: 2 ** 40 + 2 ** 33 + 4096, decodeArgs: 16 });
    const be = new CudaBackend(s.libs, { cacheDir: null });
    const n = 8192;
    const k = be.allocate('bf16', [n, 2, 128]) as CudaTensor;
    // a whole prompt, a chunk of a few blocks and a chunk shorter than one block over a prefix
    for (const m of [n, 1000, 100]) {
      const q = be.allocate('bf16', [m, 8, 128]) as CudaTensor;
      expect(q.ptr).toBeGreaterThan(2 ** 40);
      for (let round = 0; round < 2; round++) {
        s.log.length = 0;
        await be.proxyStats(q, k, { blockSize: 128, wSink: 128 + round, wLocal: 256, deferRead: true, optionalStats: [] });
        const pass = s.log.find((e) => e.kind === 'launch' && /^proxy_(wg_)?pass1/.test(e.name ?? ''));
        expect(pass?.args).toBeDefined();
        const a = pass!.args!;
        expect(a[0]).toEqual(split(q.ptr));
        expect(a[1]).toEqual(split(k.ptr));
        // n, H, Hkv, b, q's first position as int32 in the low half; then scale·log2(e) as a
        // float32; the windows
        expect([a[8][0], a[9][0], a[10][0], a[11][0], a[12][0]]).toEqual([n, 8, 2, Math.min(128, m), n - m]);
        const f = new DataView(new ArrayBuffer(4));
        f.setUint32(0, a[13][0], true);
        expect(f.getFloat32(0, true)).toBeCloseTo(Math.LOG2E / Math.sqrt(128), 6);
        expect([a[14][0], a[15][0]]).toEqual([128 + round, 256]);
      }
      q.dispose();
    }
    be.dispose();
  });
});

describe('chunked PE rows (stand-in driver)', () => {
  it("hands the PE kernels q's first position and the first query block", async () => {
    const s = standInDriver({ heads: 8, baseAddress: 2 ** 40 + 4096, decodeArgs: 12 });
    const be = new CudaBackend(s.libs, { cacheDir: null });
    const n = 8192;
    const m = 1000;
    const q = be.allocate('bf16', [m, 8, 128]) as CudaTensor;
    const k = be.allocate('bf16', [n, 2, 128]) as CudaTensor;
    s.log.length = 0;
    await be.peBlockRows(q, k, { blockSize: 128, gamma: 0.9, heads: [1, 4] });
    const args = (name: string) => s.log.find((e) => e.kind === 'launch' && e.name?.startsWith(name))?.args;
    // pe_q_means(q, hl, out, n, H, D, B, qOff)
    const qm = args('pe_q_means')!;
    expect(qm[0]).toEqual(split(q.ptr));
    expect([qm[3][0], qm[4][0], qm[5][0], qm[6][0], qm[7][0]]).toEqual([n, 8, 128, 128, n - m]);
    // the rows before floor((n - m) / B) stay empty: pe_softmax, pe_row_counts and pe_write take I0 last
    const I0 = Math.floor((n - m) / 128);
    expect(args('pe_softmax')![7][0]).toBe(I0);
    expect(args('pe_row_counts')![6][0]).toBe(I0);
    expect(args('pe_write')![7][0]).toBe(I0);
    be.dispose();
  });
});

describe('device marks (stand-in driver)', () => {
  it('msSince takes a mark of the same backend that is still in the ring; others are typed errors', () => {
    const a = new CudaBackend(standInDriver().libs, { cacheDir: null });
    const b = new CudaBackend(standInDriver().libs, { cacheDir: null });
    const m0 = a.mark();
    const m1 = a.mark();
    expect(m1.msSince(m0)).toBe(0); // the stand-in's elapsed time
    expect(() => m1.msSince(b.mark())).toThrow(expect.objectContaining({ code: 'INVALID_ARGUMENT' }));
    expect(() => m1.msSince({ msSince: () => 0 })).toThrow(/same CUDA backend/);
    for (let i = 0; i < 64; i++) a.mark();
    expect(() => m1.msSince(m0)).toThrow(/good for the next 64 marks/);
    a.dispose();
    b.dispose();
  });
});

describe('varlen batches (stand-in driver)', () => {
  it('slices share memory at 64-bit offsets and die with their parent', () => {
    const s = standInDriver({ baseAddress: 2 ** 40 });
    const be = new CudaBackend(s.libs, { cacheDir: null });
    const k = be.allocate('bf16', [5000, 8, 128]) as CudaTensor;
    const slice = be.sliceRows(k, 4000, 1000) as CudaTensor;
    expect(slice.shape).toEqual([1000, 8, 128]);
    expect(slice.ptr).toBe(k.ptr + 4000 * 8 * 128 * 2);
    slice.dispose();
    expect(k.disposed).toBe(false);
    const again = be.sliceRows(k, 0, 1);
    k.dispose();
    expect(again.disposed).toBe(true);
    expect(() => be.sliceRows(be.allocate('bf16', [10, 8, 128]), 5, 6)).toThrow(expect.objectContaining({ code: 'INVALID_ARGUMENT' }));
    be.dispose();
  });

  it('runs a ragged batch as one launch: grid z the sequences, y the longest one, the segment table and Mq last', async () => {
    const s = standInDriver({ heads: 8, baseAddress: 2 ** 40 + 4096, decodeArgs: 17 });
    const be = new CudaBackend(s.libs, { cacheDir: null });
    const lens = [1, 300, 129];
    const Mq = lens.reduce((a, b) => a + b, 0);
    const q = be.allocate('bf16', [Mq, 8, 128]);
    const k = be.allocate('bf16', [Mq, 2, 128]);
    const v = be.allocate('bf16', [Mq, 2, 128]);
    for (const t of [q, k, v]) be.write(t, 0, new Uint16Array(t.shape.reduce((a, b) => a * b, 1)).fill(0x3f80));
    const segments = [
      { qStart: 0, queries: 1, kStart: 0, keys: 1 },
      { qStart: 1, queries: 300, kStart: 1, keys: 300 },
      { qStart: 301, queries: 129, kStart: 301, keys: 129 },
    ];
    s.log.length = 0;
    const res = await be.varlenAttention(q, k, v, { blockSize: 128, segments, masks: [undefined, undefined, undefined] }, { returnLse: true });
    const launches = s.log.filter((e) => e.kind === 'launch' && /^attn_/.test(e.name ?? ''));
    expect(launches.length).toBe(1);
    expect(launches[0].shape?.slice(0, 3)).toEqual([8, 3, 3]);
    const a = launches[0].args!;
    expect(a[15][0] + a[15][1] * 2 ** 32).toBeGreaterThan(0);
    expect(a[16][0]).toBe(Mq);
    expect(res.output.shape).toEqual([Mq, 8, 128]);
    expect(res.lse?.shape).toEqual([8, Mq]);
    await expect(
      be.varlenAttention(q, k, v, { blockSize: 128, segments: [{ qStart: 0, queries: 2, kStart: 0, keys: 1 }], masks: [undefined] }),
    ).rejects.toMatchObject({ code: 'SHAPE_MISMATCH' });
    be.dispose();
  });
});

describe('TMA attention layout (stand-in driver)', () => {
  it('passes the K and V tensor maps by value after the common arguments, and later launches get their slots back', async () => {
    const s = standInDriver({ heads: 8, baseAddress: 2 ** 40 + 4096, decodeArgs: 19 });
    const be = new CudaBackend(s.libs, { cacheDir: null });
    const [n, H, Hkv, D] = [1000, 8, 2, 128];
    const q = be.allocate('bf16', [n, H, D]) as CudaTensor;
    const k = be.allocate('bf16', [n, Hkv, D]) as CudaTensor;
    const v = be.allocate('bf16', [n, Hkv, D]) as CudaTensor;
    const attention = () => s.log.find((e) => e.kind === 'launch' && e.name?.startsWith('attn_'))!;
    be.attentionVariant = 'wgt';
    expect(be.attentionVariantFallback).toBeUndefined();
    s.log.length = 0;
    await be.denseAttention(q, k, v);
    const maps = s.log.filter((e) => e.kind === 'tensorMap').map((e) => e.tensorMap!);
    expect(maps.map((m) => Number(m.address))).toEqual([k.ptr, v.ptr]);
    for (const m of maps) {
      // [rows, Hkv, D] innermost first, 16-bit elements; boxes of 64 columns × 1 head × B rows, 128-byte swizzle
      expect(m.dims).toEqual([BigInt(D), BigInt(Hkv), BigInt(n)]);
      expect(m.strides).toEqual([BigInt(D * 2), BigInt(Hkv * D * 2)]);
      expect(m.box).toEqual([64, 1, 128]);
      expect(m.swizzle).toBe(3);
      expect(m.at % 64n).toBe(0n);
    }
    const a = attention();
    expect(a.name).toBe('attn_wgt_bf16_d128_b128');
    expect(a.argPtrs!.slice(17)).toEqual(maps.map((m) => m.at));
    expect(maps[1].at - maps[0].at).toBe(128n);
    // the same slots hold ordinary values again for the next launch
    be.attentionVariant = 'wgw';
    s.log.length = 0;
    await be.denseAttention(q, k, v);
    expect(s.log.some((e) => e.kind === 'tensorMap')).toBe(false);
    const b = attention();
    expect(b.name).toBe('attn_wgw_bf16_d128_b128');
    const ptrs = b.argPtrs!;
    for (let i = 1; i < ptrs.length; i++) expect(ptrs[i] - ptrs[i - 1]).toBe(8n);
    be.dispose();
  });
});

describe('three-warpgroup d 64 layout (stand-in driver)', () => {
  it('launches 192-row query tiles for dense d 64 (chunks counted in those tiles) and wgt for everything else', async () => {
    const s = standInDriver({ heads: 8, baseAddress: 2 ** 40 + 4096, decodeArgs: 17 });
    const be = new CudaBackend(s.libs, { cacheDir: null });
    be.attentionVariant = 'wg3';
    expect(be.attentionVariantFallback).toBeUndefined();
    const launch = () => s.log.find((e) => e.kind === 'launch' && e.name?.startsWith('attn_'))!;
    const dense = async (m: number, n: number, D: number) => {
      const q = be.allocate('bf16', [m, 8, D]);
      const k = be.allocate('bf16', [n, 2, D]);
      s.log.length = 0;
      const r = await be.denseAttention(q, k, k);
      for (const t of [q, k, r.output]) t.dispose();
      return launch();
    };
    // 1,000 keys: 6 query tiles of 192 rows; 512 threads; Nb (argument 9) counts query tiles
    const a = await dense(1000, 1000, 64);
    expect(a.name).toBe('attn_wg3_bf16_d64_b128');
    expect(a.shape?.slice(0, 4)).toEqual([8, 6, 1, 512]);
    expect(a.args![9][0]).toBe(6);
    // (192 + 2 · 3 · 128) rows of 128 bytes, the swizzle's slack, 3 stages' mbarriers
    expect(a.shape![6]).toBe(192 * 128 + 6 * 128 * 128 + 1024 + 96);
    // a chunk: the last 500 of 1,000 positions start in tile 2 (positions 384..575)
    const c = await dense(500, 1000, 64);
    expect(c.shape?.slice(0, 2)).toEqual([8, 4]);
    // d 128: wgt, in 128-row blocks
    const d = await dense(1000, 1000, 128);
    expect(d.name).toBe('attn_wgt_bf16_d128_b128');
    expect(d.shape?.slice(0, 4)).toEqual([8, 8, 1, 384]);
    be.dispose();
  });
});

describe('TMA attention layout without cuTensorMapEncodeTiled (stand-in driver)', () => {
  it('launches the cp.async Hopper layout instead and says why', async () => {
    const s = standInDriver({ heads: 8 });
    const be = new CudaBackend({ ...s.libs, cu: { ...s.libs.cu, cuTensorMapEncodeTiled: undefined } }, { cacheDir: null });
    expect(be.attentionVariant).toBe('wg3');
    expect(be.attentionVariantFallback).toMatch(/cuTensorMapEncodeTiled.*so wgw runs instead/);
    const q = be.allocate('f16', [300, 8, 64]) as CudaTensor;
    const k = be.allocate('f16', [300, 2, 64]) as CudaTensor;
    s.log.length = 0;
    await be.denseAttention(q, k, k);
    expect(s.log.find((e) => e.kind === 'launch' && e.name?.startsWith('attn_'))?.name).toBe('attn_wgw_f16_d64_b128');
    be.dispose();
  });
});
