/**
 * Soak: a few hundred random calls, valid and invalid interleaved (several in flight at
 * once), from a seeded generator (CRISP_SEED replays a run). Every valid answer is matched
 * against @crisp/reference (float64) or an exact host form, every invalid call's code is
 * asserted, every call answers within a timeout, and at the end the backend's live buffer
 * count is back at its baseline.
 */
import { type BlockMask, type DeviceTensor, type HostTensor, expandToRows, hostTensor, mulberry32, toFloat32, vsListsFromArrays } from '@crisp/core';
import { createReferenceBackend } from '@crisp/reference';
import { describe, expect, it } from 'vitest';
import { code, freshSeed, seededValues, settledLiveBuffers, sharedBackend, withTimeout } from './test-support.js';

const { backend, reason } = await sharedBackend();
const ref = createReferenceBackend();
const CALLS = 300;

describe.skipIf(!backend)(`WebGPU soak${reason ? ` (skipped: ${reason})` : ''}`, () => {
  it(`${CALLS} random calls, valid and invalid interleaved: right answers, exact codes, no leak`, async () => {
    const b = backend!;
    const seed = freshSeed();
    const rnd = mulberry32(seed);
    const int = (lo: number, hi: number) => lo + Math.floor(rnd() * (hi - lo + 1));
    const pick = <T>(xs: readonly T[]): T => xs[Math.floor(rnd() * xs.length)];
    const baseline = await settledLiveBuffers(b);
    const tally = { valid: 0, invalid: 0 };
    const codes: Record<string, number> = {};

    type Made = { dev: DeviceTensor[] };
    const up = (m: Made, h: HostTensor) => {
      const t = b.upload(h);
      m.dev.push(t);
      return t;
    };
    const inputs = (s: number, n: number, mq: number, H: number, Hkv: number, d = 64) => ({
      q: hostTensor('f32', [mq, H, d], seededValues(s, mq * H * d)),
      k: hostTensor('f32', [n, Hkv, d], seededValues(s + 1, n * Hkv * d)),
      v: hostTensor('f32', [n, Hkv, d], seededValues(s + 2, n * Hkv * d)),
    });
    const randomRows = (H: number, Nb: number, n: number, mq: number, B: number): BlockMask => {
      const rowPtr = new Int32Array(H * Nb + 1);
      const cols: number[] = [];
      const first = Math.floor((n - mq) / B);
      for (let h = 0; h < H; h++) {
        for (let I = 0; I < Nb; I++) {
          for (let J = 0; J <= I; J++) if (I >= first && (J === I || rnd() < 0.4)) cols.push(J);
          rowPtr[h * Nb + I + 1] = cols.length;
        }
      }
      return { heads: H, numBlocks: Nb, blockSize: B, rows: { rowPtr, cols: Int32Array.from(cols) } };
    };
    const randomVs = (H: number, Nb: number, B: number): BlockMask => {
      const lists = () => Array.from({ length: H }, () => Array.from({ length: Nb }, (_, J) => J).filter(() => rnd() < 0.3));
      // every query block keeps a key block: the sink (vertical 0) or the diagonal (slash 0)
      const [vertical, slash] = [lists(), lists()];
      for (let h = 0; h < H; h++) (rnd() < 0.5 ? vertical : slash)[h].unshift(0);
      return { heads: H, numBlocks: Nb, blockSize: B, vs: vsListsFromArrays(vertical, slash) };
    };
    const close = (got: Float32Array, want: Float32Array, tol: number, what: string) => {
      expect(got.length, what).toBe(want.length);
      let err = 0;
      for (let i = 0; i < got.length; i++) {
        if (want[i] === got[i]) continue;
        err = Math.max(err, Math.abs(got[i] - want[i]));
      }
      expect(err, `${what}, seed ${seed}`).toBeLessThan(tol);
    };

    /** One random call: [what, run]; run resolves once the answer is checked. */
    const call = (): [string, (m: Made) => Promise<void>] => {
      const s = int(0, 2 ** 30);
      const H = pick([2, 4]);
      const Hkv = pick([1, H === 4 ? 2 : 1, H]);
      const B = pick([64, 128]);
      const n = int(1, 4) * 64 - int(0, 63);
      const mq = pick([n, Math.max(1, n - int(1, n - 1 || 1))]);
      const kind = int(0, 19);
      const invalid = (what: string, want: string, f: (m: Made) => unknown): [string, (m: Made) => Promise<void>] => [
        what,
        async (m) => {
          const got = await code(() => f(m));
          expect(got, `${what}, seed ${seed}`).toBe(want);
          tally.invalid++;
          codes[want] = (codes[want] ?? 0) + 1;
        },
      ];
      switch (kind) {
        case 0:
        case 1:
        case 2:
          return [
            `dense n=${n} m=${mq} H=${H}/${Hkv}`,
            async (m) => {
              const h = inputs(s, n, mq, H, Hkv);
              const lseToo = rnd() < 0.5;
              const out = rnd() < 0.3 ? b.allocate('f32', [mq, H, 64]) : undefined;
              if (out) m.dev.push(out);
              const r = await b.denseAttention(up(m, h.q), up(m, h.k), up(m, h.v), { returnLse: lseToo, out });
              m.dev.push(r.output, ...(r.lse ? [r.lse] : []));
              if (out) expect(r.output).toBe(out);
              const rr = await ref.denseAttention(ref.upload(h.q), ref.upload(h.k), ref.upload(h.v), { returnLse: lseToo });
              close(toFloat32(await b.download(r.output)), toFloat32(await ref.download(rr.output)), 3e-5, 'dense output');
              if (lseToo) close(toFloat32(await b.download(r.lse!)), toFloat32(await ref.download(rr.lse!)), 3e-5, 'dense lse');
              tally.valid++;
            },
          ];
        case 3:
        case 4:
        case 5:
          return [
            `sparse n=${n} m=${mq} H=${H}/${Hkv} B=${B}`,
            async (m) => {
              const h = inputs(s, n, mq, H, Hkv);
              const Nb = Math.ceil(n / B);
              const mask = rnd() < 0.5 ? randomRows(H, Nb, n, mq, B) : { ...randomVs(H, Nb, B), rows: randomRows(H, Nb, n, mq, B).rows };
              const r = await b.sparseAttention(up(m, h.q), up(m, h.k), up(m, h.v), mask, { returnLse: true });
              m.dev.push(r.output, r.lse!);
              const rr = await ref.sparseAttention(ref.upload(h.q), ref.upload(h.k), ref.upload(h.v), mask, { returnLse: true });
              close(toFloat32(await b.download(r.output)), toFloat32(await ref.download(rr.output)), 3e-5, 'sparse output');
              close(toFloat32(await b.download(r.lse!)), toFloat32(await ref.download(rr.lse!)), 3e-5, 'sparse lse');
              tally.valid++;
            },
          ];
        case 6:
          return [
            `expandMask H=${H} Nb=${Math.ceil(n / B)}`,
            async () => {
              const mask = randomVs(H, Math.ceil(n / B), B);
              const got = await b.expandMask(mask);
              const want = expandToRows(mask);
              expect(Array.from(got.rowPtr)).toEqual(Array.from(want.rowPtr));
              expect(Array.from(got.cols)).toEqual(Array.from(want.cols));
              tally.valid++;
            },
          ];
        case 7:
          return [
            `upload, write, download [${n}]`,
            async (m) => {
              const dtype = pick(['f32', 'f16'] as const);
              const h = hostTensor(dtype, [n], seededValues(s, n));
              const x = up(m, h);
              const at = int(0, n - 1);
              const patch = hostTensor(dtype, [Math.min(3, n - at)], [7, 8, 9].slice(0, Math.min(3, n - at)));
              b.write(x, at, patch.data);
              const want = Array.from(h.data);
              want.splice(at, patch.data.length, ...Array.from(patch.data));
              expect(Array.from((await b.download(x)).data)).toEqual(want);
              tally.valid++;
            },
          ];
        case 8:
          return invalid('out aliasing q', 'INVALID_ARGUMENT', (m) => {
            const h = inputs(s, n, n, H, H);
            const q = up(m, h.q);
            return b.denseAttention(q, up(m, h.k), up(m, h.v), { out: q });
          });
        case 9:
          return invalid('out of the wrong shape', 'SHAPE_MISMATCH', (m) => {
            const h = inputs(s, n, mq, H, Hkv);
            const out = b.allocate('f32', [mq, H, 32]);
            m.dev.push(out);
            return b.denseAttention(up(m, h.q), up(m, h.k), up(m, h.v), { out });
          });
        case 10:
          return invalid('out of the wrong dtype', 'DTYPE_MISMATCH', (m) => {
            const h = inputs(s, n, mq, H, Hkv);
            const out = b.allocate('f16', [mq, H, 64]);
            m.dev.push(out);
            return b.denseAttention(up(m, h.q), up(m, h.k), up(m, h.v), { out });
          });
        case 11:
          return invalid('a disposed input', 'DISPOSED', (m) => {
            const h = inputs(s, n, mq, H, Hkv);
            const k = up(m, h.k);
            k.dispose();
            return b.sparseAttention(up(m, h.q), k, up(m, h.v), randomRows(H, Math.ceil(n / B), n, mq, B));
          });
        case 12:
          return invalid('a tensor of another backend', 'WRONG_BACKEND', (m) => {
            const h = inputs(s, n, mq, H, Hkv);
            return b.denseAttention(up(m, h.q), ref.upload(h.k), up(m, h.v));
          });
        case 13:
          return invalid('a mask entry past the diagonal', 'INVALID_MASK', (m) => {
            const h = inputs(s, n, n, H, Hkv);
            const Nb = Math.ceil(n / B);
            const mask = randomRows(H, Nb, n, n, B);
            const cols = Int32Array.from(mask.rows!.cols);
            // row 0 of head 0 always holds its diagonal block 0; make it block Nb (out of range)
            cols[0] = Nb;
            return b.sparseAttention(up(m, h.q), up(m, h.k), up(m, h.v), { ...mask, rows: { rowPtr: mask.rows!.rowPtr, cols } });
          });
        case 14:
          return invalid('block size 32', 'INVALID_ARGUMENT', (m) => {
            const h = inputs(s, n, mq, H, Hkv);
            return b.sparseAttention(up(m, h.q), up(m, h.k), up(m, h.v), { ...randomRows(H, Math.ceil(n / 32), n, mq, 32) });
          });
        case 15:
          return invalid('scale not positive and finite', 'INVALID_ARGUMENT', (m) => {
            const h = inputs(s, n, mq, H, Hkv);
            return b.denseAttention(up(m, h.q), up(m, h.k), up(m, h.v), { scale: pick([-1, 0, Number.NaN, Number.POSITIVE_INFINITY]) });
          });
        case 16:
          return invalid('head dim 80', 'UNSUPPORTED', (m) => {
            const h = inputs(s, n, mq, H, Hkv, 80);
            return b.denseAttention(up(m, h.q), up(m, h.k), up(m, h.v));
          });
        case 17:
          return invalid('heads not a multiple of kv heads', 'SHAPE_MISMATCH', (m) => {
            const h = inputs(s, n, mq, 3, 2);
            return b.denseAttention(up(m, h.q), up(m, h.k), up(m, h.v));
          });
        case 18:
          return pick([
            invalid('a tensor past maxBufferSize', 'LIMIT_EXCEEDED', () => b.allocate('f32', [b.gpu.limits.maxBufferSize / 4 + 16])),
            invalid('a write past the end', 'INVALID_ARGUMENT', (m) => b.write(up(m, hostTensor('f32', [n], seededValues(s, n))), n - 1, new Float32Array(2))),
            invalid('bf16', 'UNSUPPORTED', () => b.allocate('bf16', [n])),
            invalid('a mask leaving query block 0 empty', 'INVALID_MASK', () => {
              const Nb = Math.ceil(n / B);
              const far = Array.from({ length: H }, () => [Nb]);
              return b.expandMask({ heads: H, numBlocks: Nb + 1, blockSize: B, vs: vsListsFromArrays(far, far) });
            }),
          ]);
        default:
          return pick([
            invalid('gamma 0', 'INVALID_ARGUMENT', (m) => {
              const h = inputs(s, n, mq, H, Hkv);
              return b.peBlockRows(up(m, h.q), up(m, h.k), { blockSize: B, gamma: 0, heads: [0] });
            }),
            invalid('a negative sink window', 'INVALID_ARGUMENT', (m) => {
              const h = inputs(s, n, mq, H, Hkv);
              return b.proxyStats(up(m, h.q), up(m, h.k), { blockSize: B, wSink: -1, wLocal: 64 });
            }),
            invalid('a null tensor', 'INVALID_ARGUMENT', (m) => b.denseAttention(up(m, inputs(s, n, mq, H, Hkv).q), null as never, null as never)),
          ]);
      }
    };

    // The attention and mask programs compiled first, outside the per-call hang guard: a first
    // compile on SwiftShader takes tens of seconds on a loaded machine (a call that had to build
    // them once ran past the guard in CI), and the guard is for hangs, not compiles.
    {
      const m: Made = { dev: [] };
      const h = inputs(1, 130, 130, 2, 1);
      const [q, k, v] = [up(m, h.q), up(m, h.k), up(m, h.v)];
      const rs = await withTimeout(
        Promise.all([
          b.denseAttention(q, k, v, { returnLse: true }),
          b.sparseAttention(q, k, v, randomVs(2, 3, 64), { returnLse: true }),
          b.sparseAttention(q, k, v, randomRows(2, 3, 130, 130, 64), { returnLse: true }),
        ]),
        900_000,
        `the warm-up calls, seed ${seed}`,
      );
      for (const r of rs) for (const t of [r.output, r.lse]) t?.dispose();
      for (const t of m.dev) t.dispose();
      await b.synchronize();
    }

    let done = 0;
    const t0 = performance.now();
    while (done < CALLS) {
      // one to four calls in flight together
      const batch = Array.from({ length: Math.min(int(1, 4), CALLS - done) }, call);
      const made: Made[] = batch.map(() => ({ dev: [] }));
      await Promise.all(batch.map(([what, run], i) => withTimeout(run(made[i]), 60_000, `call ${done + i} (${what}), seed ${seed}`)));
      for (const m of made) for (const t of m.dev) t.dispose();
      done += batch.length;
    }
    await b.synchronize();
    expect(tally.valid + tally.invalid).toBe(CALLS);
    expect(tally.valid).toBeGreaterThan(CALLS / 5);
    expect(tally.invalid).toBeGreaterThan(CALLS / 5);
    expect(b.gpu.liveBuffers.buffers, `seed ${seed}`).toBe(baseline);
    console.info(
      `[soak] seed ${seed}: ${CALLS} calls (${tally.valid} valid, ${tally.invalid} invalid: ${JSON.stringify(codes)}) in ${Math.round(performance.now() - t0)} ms, live buffers back at ${baseline}`,
    );
  }, 180_000);
});
