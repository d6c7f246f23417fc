// Bad dumps and output paths through the whole command: each case asserts the exit code, the
// CrispError code, the advice (a flag the command has), and that nothing was written.
import { existsSync, lstatSync, mkdirSync, readFileSync, symlinkSync, truncateSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { HostTensor } from '@crisp/core';
import { encodeNpyHeader, writeNpy, writeSafetensors } from '@crisp/io';
import { scenario } from '@crisp/synth';
import fc from 'fast-check';
import { beforeAll, describe, expect, it } from 'vitest';
import { checkOutputPath, writeFileAtomic } from './out-file.js';
import type { RunSummary } from './run-job.js';
import { listTree, runCli, tempDir, testSeed } from './test-support.js';

const SEED = testSeed();
const RUN = ['run', '--backend', 'reference', '--sample-rows', '4', '--json'];
const N = 256;
const chunk = scenario('llama-like', { n: N, heads: 2, kvHeads: 1, headDim: 32, seed: SEED }).rows(0, N);
const rows = { q: chunk.q, k: chunk.k, v: chunk.v };

/** [n, H, d] f32 as [H, n, d] (what a head-major dump holds). */
function toHnd(t: HostTensor): HostTensor {
  const [n, H, d] = t.shape;
  const src = t.data as Float32Array;
  const out = new Float32Array(src.length);
  for (let i = 0; i < n; i++) for (let h = 0; h < H; h++) out.set(src.subarray((i * H + h) * d, (i * H + h + 1) * d), (h * n + i) * d);
  return { dtype: 'f32', shape: [H, n, d], data: out };
}

/** A safetensors file from a header object and raw data bytes, exactly as given. */
function rawSafetensors(path: string, header: Record<string, unknown>, data: Uint8Array): void {
  const json = Buffer.from(JSON.stringify(header));
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(BigInt(json.length));
  writeFileSync(path, Buffer.concat([len, json, data]));
}

/** q, k, v with the given dtypes (bytes per element) and shapes, zero data. */
function typedDump(path: string, spec: Record<string, { dtype: string; shape: number[]; bpe: number }>): void {
  const header: Record<string, unknown> = {};
  let off = 0;
  for (const [name, s] of Object.entries(spec)) {
    const bytes = s.shape.reduce((a, b) => a * b, 1) * s.bpe;
    header[name] = { dtype: s.dtype, shape: s.shape, data_offsets: [off, off + bytes] };
    off += bytes;
  }
  rawSafetensors(path, header, new Uint8Array(off));
}

function npyDir(dir: string, files: Record<string, { descr: string; shape: number[]; data: Uint8Array } | HostTensor>): Promise<unknown> {
  mkdirSync(dir, { recursive: true });
  return Promise.all(
    Object.entries(files).map(async ([stem, f]) => {
      if ('descr' in f) writeFileSync(join(dir, `${stem}.npy`), Buffer.concat([encodeNpyHeader(f.descr, f.shape), f.data]));
      else await writeNpy(join(dir, `${stem}.npy`), f);
    }),
  );
}

const u8 = (t: HostTensor) => new Uint8Array(t.data.buffer, t.data.byteOffset, t.data.byteLength);
const bf16 = (t: HostTensor) => {
  const f = t.data as Float32Array;
  const out = new Uint16Array(f.length);
  const u = new Uint32Array(f.buffer, f.byteOffset, f.length);
  for (let i = 0; i < f.length; i++) out[i] = u[i] >>> 16;
  return { descr: '<u2', shape: [...t.shape], data: new Uint8Array(out.buffer) };
};
const f16 = (t: HostTensor) => ({ descr: '<f2', shape: [...t.shape], data: new Uint8Array(t.data.length * 2) });

interface FileCase {
  readonly name: string;
  /** makes the dump under `dir`, returns the argv after `crisp` */
  readonly make: (dir: string) => Promise<string[]> | string[];
  readonly code: 0 | 1;
  readonly err?: RegExp;
  /**
   * The error comes before the work: in under `fastMs`, or, with 'before-estimate', in under
   * half the time the command's own estimate gives the run (printed on stderr for a long run).
   * The estimate is calibrated on the machine as loaded at the time, so the bound holds on a
   * busy machine where a fixed number of seconds does not.
   */
  readonly fastMs?: number | 'before-estimate';
}

const fail = (name: string, make: FileCase['make'], err: RegExp, fastMs?: FileCase['fastMs']): FileCase => ({ name, make, code: 1, err, fastMs });

/** The run time, in ms, of the estimate line on stderr ("this run takes about 12 s" / "3.5 min"). */
function estimatedMs(stderr: string): number | undefined {
  const m = /this run takes about ([\d.]+) (s|min|h) /.exec(stderr);
  return m ? Number(m[1]) * { s: 1e3, min: 6e4, h: 3.6e6 }[m[2] as 's' | 'min' | 'h'] : undefined;
}
const ok = (name: string, make: FileCase['make']): FileCase => ({ name, make, code: 0 });

const CASES: FileCase[] = [
  // layouts: shapes that look transposed get the flag that fixes them
  fail(
    '[H, n, d] file read as the default nhd',
    async (d) => {
      await writeSafetensors(join(d, 'x.safetensors'), { q: toHnd(rows.q), k: toHnd(rows.k), v: toHnd(rows.v) });
      return [...RUN, '--qkv', join(d, 'x.safetensors')];
    },
    /^crisp: error SHAPE_MISMATCH: .*q \[2, 256, 32\], k \[1, 256, 32\], v \[1, 256, 32\] do not fit together as \[n, H, d\]; they fit as \[H, n, d\]: pass --layout hnd\n$/,
  ),
  fail(
    '[H, n, d] file with H == Hkv read as nhd (fits, but more heads than tokens)',
    async (d) => {
      await writeSafetensors(join(d, 'x.safetensors'), { q: toHnd(rows.k), k: toHnd(rows.k), v: toHnd(rows.v) });
      return [...RUN, '--qkv', join(d, 'x.safetensors')];
    },
    /^crisp: error SHAPE_MISMATCH: .*read as \[n, H, d\] give 1 tokens and 256 heads, which looks transposed; they fit as \[H, n, d\]: pass --layout hnd\n$/,
  ),
  fail(
    '[1, n, H, d] file without --layout',
    async (d) => {
      await writeSafetensors(join(d, 'x.safetensors'), { q: rows.q, k: rows.k, v: rows.v }, { layout: '1nhd' });
      return [...RUN, '--qkv', join(d, 'x.safetensors')];
    },
    /^crisp: error SHAPE_MISMATCH: .*q has shape \[1, 256, 2, 32\], but --layout nhd means \[n, H, d\]; they fit as \[1, n, H, d\]: pass --layout 1nhd\n$/,
  ),
  fail(
    '[n, H, d] file read with --layout hnd',
    async (d) => {
      await writeSafetensors(join(d, 'x.safetensors'), rows);
      return [...RUN, '--qkv', join(d, 'x.safetensors'), '--layout', 'hnd'];
    },
    /^crisp: error SHAPE_MISMATCH: .*pass --layout nhd\n$/,
  ),
  fail(
    'a batch of two under --layout 1nhd',
    (d) => {
      typedDump(join(d, 'x.safetensors'), { q: { dtype: 'F32', shape: [2, 8, 2, 32], bpe: 4 }, k: { dtype: 'F32', shape: [2, 8, 1, 32], bpe: 4 }, v: { dtype: 'F32', shape: [2, 8, 1, 32], bpe: 4 } });
      return [...RUN, '--qkv', join(d, 'x.safetensors'), '--layout', '1nhd'];
    },
    /^crisp: error SHAPE_MISMATCH: .*the leading \(batch\) dim is 2: only a batch of one is supported/,
  ),
  fail(
    'q and k of different lengths',
    (d) => {
      typedDump(join(d, 'x.safetensors'), { q: { dtype: 'F32', shape: [128, 2, 32], bpe: 4 }, k: { dtype: 'F32', shape: [256, 1, 32], bpe: 4 }, v: { dtype: 'F32', shape: [256, 1, 32], bpe: 4 } });
      return [...RUN, '--qkv', join(d, 'x.safetensors')];
    },
    /^crisp: error UNSUPPORTED: .*q has 128 rows and k 256; crisp run needs full prefill/,
  ),
  // dtypes are named as the file spells them
  ...(
    [
      ['F64', 8, 'float64'],
      ['I32', 4, 'int32'],
      ['I64', 8, 'int64'],
      ['U8', 1, 'uint8'],
      ['BOOL', 1, 'bool'],
      ['F8_E4M3', 1, 'float8 e4m3'],
    ] as const
  ).map(([dt, bpe, friendly]) =>
    fail(
      `a k tensor of dtype ${dt}`,
      (d) => {
        typedDump(join(d, 'x.safetensors'), { q: { dtype: 'F32', shape: [N, 2, 32], bpe: 4 }, k: { dtype: dt, shape: [N, 1, 32], bpe }, v: { dtype: 'F32', shape: [N, 1, 32], bpe: 4 } });
        return [...RUN, '--qkv', join(d, 'x.safetensors')];
      },
      new RegExp(`^crisp: error UNSUPPORTED: .*: k tensor 'k' is ${dt} \\(${friendly}\\); Q/K/V must be F32, F16 or BF16`),
    ),
  ),
  fail(
    'q, k, v of different dtypes',
    (d) => {
      typedDump(join(d, 'x.safetensors'), { q: { dtype: 'F32', shape: [N, 2, 32], bpe: 4 }, k: { dtype: 'F16', shape: [N, 1, 32], bpe: 2 }, v: { dtype: 'F32', shape: [N, 1, 32], bpe: 4 } });
      return [...RUN, '--qkv', join(d, 'x.safetensors')];
    },
    /^crisp: error DTYPE_MISMATCH: .*q, k, v dtypes differ \(f32, f16, f32\); pass --dtype to convert them/,
  ),
  ok('q, k, v of different dtypes with --dtype f32', async (d) => {
    await writeSafetensors(join(d, 'x.safetensors'), { q: rows.q, k: { ...rows.k, dtype: 'f16', data: new Uint16Array(rows.k.data.length) }, v: rows.v });
    return [...RUN, '--qkv', join(d, 'x.safetensors'), '--dtype', 'f32'];
  }),
  fail(
    'f32 values beyond the f16 range with --dtype f16',
    async (d) => {
      const q = { ...rows.q, data: Float32Array.from(rows.q.data as Float32Array) };
      (q.data as Float32Array)[5] = 1e6;
      await writeSafetensors(join(d, 'x.safetensors'), { q, k: rows.k, v: rows.v });
      return [...RUN, '--qkv', join(d, 'x.safetensors'), '--dtype', 'f16'];
    },
    /^crisp: error NON_FINITE: q holds Infinity at row 0, head 0, column 5 .*holds f32 values and --dtype f16 turns those beyond ±65504 into Infinity: pass --dtype bf16 or f32\)\n$/,
  ),
  // names: the advice is the --names flag
  fail(
    'tensors with unknown names',
    async (d) => {
      await writeSafetensors(join(d, 'x.safetensors'), { a: rows.q, b: rows.k, c: rows.v });
      return [...RUN, '--qkv', join(d, 'x.safetensors')];
    },
    /^crisp: error FORMAT_ERROR: .*has no q tensor: .*found 'a', 'b', 'c'; pass --names q=NAME,k=NAME,v=NAME to say which is which\n$/,
  ),
  ok('tensors with unknown names and --names', async (d) => {
    await writeSafetensors(join(d, 'x.safetensors'), { a: rows.q, b: rows.k, c: rows.v });
    return [...RUN, '--qkv', join(d, 'x.safetensors'), '--names', 'q=a,k=b,v=c'];
  }),
  fail(
    '--names naming a tensor the file lacks',
    async (d) => {
      await writeSafetensors(join(d, 'x.safetensors'), rows);
      return [...RUN, '--qkv', join(d, 'x.safetensors'), '--names', 'q=zzz'];
    },
    /^crisp: error INVALID_ARGUMENT: .*has no tensor 'zzz' \(given for q\); it has 'q', 'k', 'v'/,
  ),
  fail(
    'two tensors that could be q',
    async (d) => {
      await writeSafetensors(join(d, 'x.safetensors'), { 'l0.attn.q': rows.q, 'l1.attn.q': rows.q, k: rows.k, v: rows.v });
      return [...RUN, '--qkv', join(d, 'x.safetensors')];
    },
    /^crisp: error INVALID_ARGUMENT: .*several tensors could be q \('l0\.attn\.q', 'l1\.attn\.q'\); pick one with --names q=NAME\n$/,
  ),
  // .npy directories
  fail(
    'bf16 bit patterns (<u2) without --npy-uint16',
    async (d) => {
      await npyDir(join(d, 'npy'), { q: bf16(rows.q), k: bf16(rows.k), v: bf16(rows.v) });
      return [...RUN, '--qkv', join(d, 'npy')];
    },
    /^crisp: error UNSUPPORTED: .*q\.npy holds uint16 \('<u2'\): if these are bf16 bit patterns .*pass --npy-uint16 bf16; otherwise/,
  ),
  ok('bf16 bit patterns with --npy-uint16 bf16', async (d) => {
    await npyDir(join(d, 'npy'), { q: bf16(rows.q), k: bf16(rows.k), v: bf16(rows.v) });
    return [...RUN, '--qkv', join(d, 'npy'), '--npy-uint16', 'bf16'];
  }),
  fail(
    'float16 .npy with --npy-uint16 bf16',
    async (d) => {
      await npyDir(join(d, 'npy'), { q: f16(rows.q), k: f16(rows.k), v: f16(rows.v) });
      return [...RUN, '--qkv', join(d, 'npy'), '--npy-uint16', 'bf16'];
    },
    /^crisp: error UNSUPPORTED: .*holds float16 \('<f2'\) but --npy-uint16 bf16 was given; drop that flag/,
  ),
  fail(
    'a float64 k.npy',
    async (d) => {
      await npyDir(join(d, 'npy'), { q: rows.q, k: { descr: '<f8', shape: [N, 1, 32], data: new Uint8Array(N * 32 * 8) }, v: rows.v });
      return [...RUN, '--qkv', join(d, 'npy')];
    },
    /^crisp: error UNSUPPORTED: .*k\.npy holds float64 \('<f8'\)/,
  ),
  fail(
    'an int32 q.npy',
    async (d) => {
      await npyDir(join(d, 'npy'), { q: { descr: '<i4', shape: [N, 2, 32], data: new Uint8Array(N * 64 * 4) }, k: rows.k, v: rows.v });
      return [...RUN, '--qkv', join(d, 'npy')];
    },
    /^crisp: error UNSUPPORTED: .*q\.npy holds int32 \('<i4'\)/,
  ),
  fail(
    'a directory named q.npy',
    async (d) => {
      await npyDir(join(d, 'npy'), { k: rows.k, v: rows.v });
      mkdirSync(join(d, 'npy', 'q.npy'));
      return [...RUN, '--qkv', join(d, 'npy')];
    },
    /^crisp: error IO_ERROR: cannot read .*q\.npy \(q of --qkv\): it is a directory, not a regular file/,
  ),
  fail(
    'a directory without k',
    async (d) => {
      await npyDir(join(d, 'npy'), { q: rows.q, v: rows.v });
      return [...RUN, '--qkv', join(d, 'npy')];
    },
    /^crisp: error FORMAT_ERROR: directory .* has no k tensor: .*pass --names q=NAME,k=NAME,v=NAME/,
  ),
  fail(
    'one .npy file as --qkv',
    async (d) => {
      await writeNpy(join(d, 'q.npy'), rows.q);
      return [...RUN, '--qkv', join(d, 'q.npy')];
    },
    /^crisp: error INVALID_ARGUMENT: --qkv .*q\.npy is a single \.npy array; give the directory holding q\.npy, k\.npy and v\.npy/,
  ),
  // limits from the header: a 6 GiB sparse dump is refused without reading its data
  fail(
    'a header announcing n = 2^20 on a backend capped at 65536',
    (d) => {
      const n = 2 ** 20;
      const each = n * 8 * 64 * 4;
      const header = JSON.stringify({
        q: { dtype: 'F32', shape: [n, 8, 64], data_offsets: [0, each] },
        k: { dtype: 'F32', shape: [n, 8, 64], data_offsets: [each, 2 * each] },
        v: { dtype: 'F32', shape: [n, 8, 64], data_offsets: [2 * each, 3 * each] },
      });
      const len = Buffer.alloc(8);
      len.writeBigUInt64LE(BigInt(header.length));
      const path = join(d, 'big.safetensors');
      writeFileSync(path, Buffer.concat([len, Buffer.from(header)]));
      truncateSync(path, 8 + header.length + 3 * each);
      return [...RUN, '--qkv', path];
    },
    /^crisp: error LIMIT_EXCEEDED: n = 1048576 \(from .*big\.safetensors\) exceeds the reference backend's limit of 65536 tokens; use a shorter dump, or pick another --backend\n$/,
    2000,
  ),
  // tensors above io's 16 MiB read chunk, head-major (parallel reads), NaN in v's last value:
  // read in full, then a typed error from the backend, never a crash
  fail(
    '17 MiB head-major .npy tensors with a NaN',
    async (d) => {
      const n = 4352;
      const H = 8;
      const q = new Float32Array(H * n * 128).fill(0.01);
      const k = new Float32Array(n * 128).fill(0.02);
      const v = new Float32Array(n * 128).fill(0.03);
      v[v.length - 1] = Number.NaN;
      await npyDir(join(d, 'npy'), {
        q: { descr: '<f4', shape: [H, n, 128], data: u8({ dtype: 'f32', shape: [H, n, 128], data: q }) },
        k: { descr: '<f4', shape: [1, n, 128], data: u8({ dtype: 'f32', shape: [1, n, 128], data: k }) },
        v: { descr: '<f4', shape: [1, n, 128], data: u8({ dtype: 'f32', shape: [1, n, 128], data: v }) },
      });
      return [...RUN, '--qkv', join(d, 'npy'), '--layout', 'hnd'];
    },
    // (the reference backend's estimate of this long run comes first)
    /^((note|warning): this run takes about [\d.]+ (s|min) on this machine .*\n)?crisp: error NON_FINITE: v holds NaN at row 4351, head 0, column 127/,
    'before-estimate',
  ),
];

describe('crisp: bad dumps', () => {
  for (const c of CASES) {
    it(`${c.name}: exit ${c.code}${c.err ? `, ${/error (\w+)/.exec(c.err.source)?.[1] ?? ''}` : ''}`, async () => {
      const dir = tempDir();
      const args = await c.make(dir);
      const before = listTree(dir);
      const t0 = performance.now();
      const r = await runCli(args);
      const ms = performance.now() - t0;
      expect(r.code, r.stderr).toBe(c.code);
      if (c.code === 0) {
        const s: RunSummary = JSON.parse(r.stdout);
        expect(s.input.n).toBe(N);
        expect(s.policies[0].outputError).toBeLessThan(1);
      } else {
        expect(r.stdout).toBe('');
        expect(r.stderr).toMatch(c.err!);
        // one line of error (after the estimate of a long run, where there is one)
        expect(r.stderr.trimEnd().split('\n').filter((l) => !/^(note|warning): this run takes about /.test(l))).toHaveLength(1);
        expect(r.stderr).not.toMatch(/internal error|\n\s+at /);
      }
      if (typeof c.fastMs === 'number') expect(ms).toBeLessThan(c.fastMs);
      if (c.fastMs === 'before-estimate') {
        const est = estimatedMs(r.stderr);
        if (est !== undefined) expect(ms, `the run was estimated at ${est} ms`).toBeLessThan(est / 2);
      }
      expect(listTree(dir)).toEqual(before);
    });
  }

  it('a corrupted dump (random bytes changed, cut or appended) ends in exit 0 or a one-line CrispError, never a crash', async () => {
    const dir = tempDir();
    const good = join(dir, 'good.safetensors');
    const small = scenario('llama-like', { n: 128, heads: 1, kvHeads: 1, headDim: 32, seed: SEED }).rows(0, 128);
    await writeSafetensors(good, { q: small.q, k: small.k, v: small.v });
    const bytes = readFileSync(good);
    const headerEnd = 8 + Number(bytes.readBigUInt64LE(0));
    const bad = join(dir, 'bad.safetensors');
    const edit = fc.oneof(
      // anywhere in the length field or header: the header fields, offsets, dtypes, shapes
      fc.record({ kind: fc.constant('flip' as const), at: fc.integer({ min: 0, max: headerEnd - 1 }), byte: fc.integer({ min: 0, max: 255 }) }),
      fc.record({ kind: fc.constant('cut' as const), at: fc.integer({ min: 0, max: bytes.length - 1 }), byte: fc.constant(0) }),
      fc.record({ kind: fc.constant('grow' as const), at: fc.integer({ min: 1, max: 64 }), byte: fc.integer({ min: 0, max: 255 }) }),
    );
    const codes = new Map<string, number>();
    await fc.assert(
      fc.asyncProperty(fc.array(edit, { minLength: 1, maxLength: 3 }), async (edits) => {
        let b = Buffer.from(bytes);
        for (const e of edits) {
          if (e.kind === 'flip' && e.at < b.length) b[e.at] = e.byte;
          else if (e.kind === 'cut') b = b.subarray(0, Math.min(e.at, b.length));
          else if (e.kind === 'grow') b = Buffer.concat([b, Buffer.alloc(e.at, e.byte)]);
        }
        writeFileSync(bad, b);
        const r = await runCli(['run', '--backend', 'reference', '--sample-rows', '2', '--json', '--qkv', bad]);
        const code = r.code === 0 ? 'ok' : (/^crisp: error (\w+): /.exec(r.stderr)?.[1] ?? `unexpected: ${r.stderr}`);
        codes.set(code, (codes.get(code) ?? 0) + 1);
        expect([0, 1]).toContain(r.code);
        if (r.code === 1) {
          expect(r.stderr).toMatch(/^crisp: error (FORMAT_ERROR|UNSUPPORTED|SHAPE_MISMATCH|DTYPE_MISMATCH|INVALID_ARGUMENT|NON_FINITE|LIMIT_EXCEEDED|IO_ERROR): [^\n]+\n$/);
          expect(r.stdout).toBe('');
        }
      }),
      { seed: SEED, numRuns: 40 },
    );
    console.log(`corrupted dumps by outcome: ${JSON.stringify(Object.fromEntries(codes))}`);
    expect(listTree(dir)).toEqual(['bad.safetensors', 'good.safetensors']);
  });
});

describe('crisp report: the page is written whole or not at all', () => {
  let dump: string;
  beforeAll(async () => {
    dump = join(tempDir(), 'x.safetensors');
    await writeSafetensors(dump, rows);
  });

  it('a run that fails leaves no page and no temporary file', async () => {
    const dir = tempDir();
    const r = await runCli(['report', '--backend', 'reference', '--qkv', dump, '--layout', 'hnd', '--out', join(dir, 'r.html')]);
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(/^crisp: error SHAPE_MISMATCH: .*pass --layout nhd/);
    expect(listTree(dir)).toEqual([]);
  });

  it('an existing page is replaced in one step, through a symbolic link too, with nothing left beside it', async () => {
    const dir = tempDir();
    const out = join(dir, 'r.html');
    writeFileSync(out, 'old page');
    const r = await runCli(['report', '--backend', 'reference', '--qkv', dump, '--sample-rows', '4', '--out', out]);
    expect(r.code, r.stderr).toBe(0);
    expect(readFileSync(out, 'utf8')).toMatch(/^<!doctype html>[\s\S]*<\/html>\n$/);
    expect(listTree(dir)).toEqual(['r.html']);

    writeFileSync(out, 'old page');
    symlinkSync(out, join(dir, 'link.html'));
    const viaLink = await runCli(['report', '--backend', 'reference', '--qkv', dump, '--sample-rows', '4', '--out', join(dir, 'link.html')]);
    expect(viaLink.code, viaLink.stderr).toBe(0);
    expect(lstatSync(join(dir, 'link.html')).isSymbolicLink()).toBe(true);
    expect(readFileSync(out, 'utf8')).toMatch(/^<!doctype html>/);
    expect(listTree(dir)).toEqual(['link.html', 'r.html']);
  });

  it('writeFileAtomic refuses a target that became a directory after the check, and removes its temporary file', async () => {
    const dir = tempDir();
    const path = await checkOutputPath('--out', join(dir, 'r.html'));
    mkdirSync(path);
    await expect(writeFileAtomic('--out', path, 'page')).rejects.toMatchObject({ code: 'IO_ERROR', message: expect.stringMatching(/it is now a directory, not a regular file/) });
    expect(listTree(dir)).toEqual(['r.html']);
    expect(existsSync(join(path, 'page'))).toBe(false);
  });
});
