// Bad flags: a table of command lines, each with its exit code, the exact error (usage text or
// CrispError code) and proof that nothing was written; then fast-check over the numeric flags.
import { existsSync, mkdirSync, symlinkSync, writeFileSync } from 'node:fs';
import { execFileSync } from 'node:child_process';
import { totalmem } from 'node:os';
import { join } from 'node:path';
import { writeSafetensors } from '@crisp/io';
import { scenario } from '@crisp/synth';
import fc from 'fast-check';
import { beforeAll, describe, expect, it } from 'vitest';
import { UsageError } from './cli-io.js';
import { intFlag, namesFlag, numFlag } from './options.js';
import { listTree, runCli, tempDir, testSeed } from './test-support.js';

const SEED = testSeed();
const R = ['run', '--backend', 'reference'];

interface Case {
  readonly args: (dir: string, file: string) => string[];
  readonly code: 1 | 2;
  /** usage: the message after 'crisp: '; runtime: the CrispError code and message */
  readonly err: RegExp;
  readonly skip?: string;
}

const usage = (args: string[] | ((dir: string, file: string) => string[]), err: RegExp): Case => ({
  args: typeof args === 'function' ? args : () => args,
  code: 2,
  err,
});
const runtime = (args: (dir: string, file: string) => string[], code: string, msg: RegExp, skip?: string): Case => ({
  args,
  code: 1,
  err: new RegExp(`^crisp: error ${code}: ${msg.source}`),
  skip,
});

// Bigger than any machine the suite runs on (512 GiB of block masses); skipped on one that big.
const HUGE_SAMPLE_BYTES = 65536 * 1024 * 1024 * 8;

const CASES: Case[] = [
  // --qkv: empty paths, and scenario flags beside it, are refused instead of ignored
  usage(['run', '--qkv', ''], /--qkv needs a safetensors file or a directory of \.npy or layer files; got ''/),
  usage(['run', '--qkv', '   '], /--qkv needs a safetensors file/),
  usage((_, f) => ['run', '--qkv', f, '--n', '512'], /--n describes a generated scenario and does not apply with --qkv \(the dump gives the shape\); drop it or drop --qkv/),
  usage((_, f) => ['run', '--qkv', f, '--profile', 'retrieval', '--seed', '3'], /--profile, --seed describe a generated scenario and do not apply with --qkv/),
  usage((_, f) => ['run', '--qkv', f, '--heads', '4', '--kv-heads', '1', '--head-dim', '32'], /--heads, --kv-heads, --head-dim describe a generated scenario/),
  usage((d, f) => ['report', '--qkv', f, '--seed', '1', '--out', join(d, 'r.html')], /--seed describes a generated scenario/),
  usage((_, f) => ['run', '--qkv', f, '--seed', '1'], /--seed describes/),
  usage((_, f) => ['run', '--qkv', f, '--threads', '4'], /--threads describes a generated scenario and does not apply with --qkv/),
  // dump flags without a dump
  usage(['run', '--layout', 'nhd'], /--layout only applies with --qkv FILE/),
  usage(['run', '--names', 'q=a'], /--names only applies with --qkv FILE/),
  usage(['run', '--npy-uint16', 'bf16', '--layout', 'hnd'], /--layout, --npy-uint16 only apply with --qkv FILE/),
  usage(['run', '--npy-uint16', 'f16'], /--npy-uint16 must be one of bf16; got 'f16'/),
  usage(['run', '--layout', 'nhwc'], /--layout must be one of nhd \(\[n,H,d\]\), 1nhd \(\[1,n,H,d\]\) or hnd \(\[H,n,d\]\); got 'nhwc'/),
  usage(['run', '--names', 'x=a'], /--names takes q=NAME,k=NAME,v=NAME \(any of the three\); 'x' is not q, k or v/),
  usage(['run', '--names', 'q=a,q=b'], /--names takes .*; q is given twice/),
  usage(['run', '--names', ''], /--names takes .*; it is empty/),
  usage(['run', '--names', 'q='], /--names takes .*; q has an empty name/),
  usage(['run', '--names', 'qkv'], /--names takes .*; 'qkv' has no '='/),
  // numbers
  ...['', ' ', '1e3', '0x10', '0b11', '-5', '0', 'NaN', 'Infinity', '1.5', '99999999999999999999', '67108865', '4k'].map((v) =>
    usage(['run', '--n', v], new RegExp(`--n must be an integer in \\[1, 67108864\\]; got '${v.replace(/[.+]/g, '\\$&')}'`)),
  ),
  ...['0x10', 'Infinity', '-Infinity', 'NaN', '', '0', '1e400', '1,5'].map((v) => usage(['run', '--alpha', v], /--alpha must be a number in \(0, 1000000\)/)),
  usage(['run', '--gamma', '1'], /--gamma must be a number in \(0, 1\); got '1'/),
  usage(['run', '--tau-proxy', '0'], /--tau-proxy must be a number in \(0, 1\); got '0'/),
  usage(['run', '--seed', '-1'], /--seed must be an integer in \[0, 4294967295\]/),
  usage(['run', '--seed', '4294967296'], /--seed must be an integer in \[0, 4294967295\]/),
  usage(['run', '--heads', '0'], /--heads must be an integer in \[1, 1024\]/),
  usage(['run', '--kv-heads', '2000'], /--kv-heads must be an integer in \[1, 1024\]/),
  usage(['run', '--head-dim', '16'], /--head-dim must be an integer in \[32, 1024\]/),
  usage(['run', '--sample-rows', '0'], /--sample-rows must be an integer/),
  usage(['run', '--repeats', '101'], /--repeats must be an integer in \[1, 100\]/),
  ...['0', '-2', '257', '1.5', 'many'].map((v) => usage(['run', '--threads', v], new RegExp(`--threads must be an integer in \\[1, 256\\]; got '${v.replace(/[.+]/g, '\\$&')}'`))),
  usage(['run', '--no-dense=1'], /unknown option '--no-dense=1'/),
  usage(['run', '--dense'], /unknown option '--dense'/),
  usage(['run', '--dtype', 'f64'], /--dtype must be one of f32, f16, bf16; got 'f64'/),
  // combinations
  usage([...R, '--head-dim', '33', '--n', '256'], /--head-dim must be even \(rotary pairs\); got 33/),
  usage([...R, '--kv-heads', '3', '--n', '256'], /the query heads \(8, the default\) must be a multiple of --kv-heads \(3\)/),
  usage([...R, '--kv-heads', '16', '--n', '256'], /--kv-heads \(16\) cannot exceed the query heads \(8, the default\)/),
  usage(['run', '--heads', '2', '--kv-heads', '4'], /--heads \(2\) must be a multiple of --kv-heads \(4\)/),
  usage(['run', '--heads', '9'], /--heads 9 has no default kv-head count \(H \/ 4 rounded down, 2, does not divide it\); pass --kv-heads/),
  usage(['help', 'nope'], /unknown command 'nope'; the commands are run, report, calibrate/),
  usage(['report', '--compare', 'flexPrefill', '--compare', 'crispFast,flexPrefill'], /--compare names flexPrefill twice/),
  usage(['run', '--preset', 'dense', '--gamma', '0.9'], /--alpha, --gamma and --tau-proxy do not apply to the dense preset/),
  usage((d) => ['report', '--compare', 'flexPrefill,flexPrefill', '--out', join(d, 'r.html')], /--compare names flexPrefill twice/),
  usage((d) => ['report', '--compare', 'flexPrefill,nope', '--out', join(d, 'r.html')], /--compare must be one of/),
  usage(['report', '--out', ''], /--out needs a file path; got ''/),
  // commander's own errors, in the same one-line form
  usage(['run', '--n'], /option '--n <tokens>' argument missing/),
  usage(['run', 'extra'], /too many arguments for 'run'/),
  usage(['run', '--bogus'], /unknown option '--bogus'/),
  usage(['--n', '5'], /unknown option '--n'/),
  usage(['frobnicate'], /unknown command 'frobnicate'/),
  usage(['calibrate', '--qkv', 'x'], /unknown option '--qkv'/),
  // limits, from the flags, before anything is generated
  runtime(() => [...R, '--n', '67108864'], 'LIMIT_EXCEEDED', /n = 67108864 exceeds the reference backend's limit of 65536 tokens; pass --n 65536 or less/),
  runtime(() => ['calibrate', '--backend', 'reference', '--n', '100000'], 'LIMIT_EXCEEDED', /n = 100000 exceeds the reference backend's limit of 65536/),
  runtime((d) => ['report', '--backend', 'reference', '--n', '67108864', '--out', join(d, 'r.html')], 'LIMIT_EXCEEDED', /n = 67108864 exceeds/),
  runtime(() => [...R, '--head-dim', '1024'], 'UNSUPPORTED', /the reference backend has no kernel for head dim 1024; it supports 16, 32, .*, 256: pass one with --head-dim/),
  runtime(
    () => [...R, '--n', '65536', '--heads', '1024', '--kv-heads', '1024', '--head-dim', '256'],
    'LIMIT_EXCEEDED',
    /n·H·d = 65536·1024·256 = 17179869184 values is more than one JS typed array holds \(4294967296\)/,
  ),
  runtime(
    () => [...R, '--n', '65536', '--heads', '1024', '--kv-heads', '1', '--head-dim', '32', '--block', '64', '--sample-rows', '1000000'],
    'LIMIT_EXCEEDED',
    /this run needs about [\d.]+ GiB of host memory \(most of it block masses of 65536 exact rows \(--sample-rows\): 512\.0 GiB\); this machine has [\d.]+ GiB; pass a smaller --sample-rows, --n or --heads/,
    totalmem() > HUGE_SAMPLE_BYTES / 2 ? 'this machine has more memory than the case asks for' : undefined,
  ),
  // output paths, checked before the run (the default run takes many seconds)
  runtime((d) => ['report', '--backend', 'reference', '--out', d], 'IO_ERROR', /cannot write .* \(--out\): it is a directory; give a file path such as .*crisp-report\.html; pick another --out/),
  runtime((d) => ['report', '--backend', 'reference', '--out', `${d}/`], 'IO_ERROR', /cannot write .* \(--out\): it names a directory/),
  runtime((d) => ['run', '--backend', 'reference', '--out', d], 'IO_ERROR', /cannot write .* \(--out\): it is a directory; give a file path such as .*crisp-out\.safetensors; pick another --out/),
  runtime(() => ['report', '--backend', 'reference', '--out', '/dev/null'], 'IO_ERROR', /cannot write \/dev\/null \(--out\): it is a character device, not a regular file/),
  runtime((d) => ['report', '--backend', 'reference', '--out', join(d, 'fifo')], 'IO_ERROR', /.*\(--out\): it is a FIFO \(named pipe\), not a regular file/),
  runtime((d) => ['report', '--backend', 'reference', '--out', join(d, 'dangling')], 'IO_ERROR', /.*\(--out\): it is a symbolic link to a missing or unreachable target/),
  runtime((d) => ['report', '--backend', 'reference', '--out', join(d, 'plain', 'r.html')], 'IO_ERROR', /.*plain\/r\.html \(--out\): a part of the path is not a directory/),
  // inputs that are not tensor files
  runtime(() => [...R, '--qkv', '/nonexistent/layer.safetensors'], 'IO_ERROR', /cannot open \/nonexistent\/layer\.safetensors \(--qkv\): no such file or directory/),
  runtime(() => [...R, '--qkv', '/dev/null'], 'IO_ERROR', /cannot read \/dev\/null \(--qkv\): it is a character device, not a regular file/),
  runtime((d) => [...R, '--qkv', join(d, 'fifo')], 'IO_ERROR', /.*\(--qkv\): it is a FIFO \(named pipe\), not a regular file/),
  runtime((d) => [...R, '--qkv', join(d, 'empty')], 'FORMAT_ERROR', /--qkv .*empty is a directory with no layers: no \.safetensors files .* and no q\/k\/v \.npy files/),
];

describe('crisp: the bad-flag matrix', () => {
  let file: string;
  beforeAll(async () => {
    file = join(tempDir(), 'layer.safetensors');
    const { q, k, v } = scenario('llama-like', { n: 256, heads: 2, kvHeads: 1, headDim: 32, seed: SEED }).rows(0, 256);
    await writeSafetensors(file, { q, k, v });
  });

  for (const c of CASES) {
    const shown = c.args('DIR', 'FILE').map((a) => (a === '' ? "''" : a)).join(' ');
    it.skipIf(c.skip !== undefined)(`crisp ${shown} exits ${c.code}${c.skip ? ` (skipped: ${c.skip})` : ''}`, async () => {
      const dir = tempDir();
      mkdirSync(join(dir, 'empty'));
      execFileSync('mkfifo', [join(dir, 'fifo')]);
      writeFileSync(join(dir, 'plain'), 'x');
      symlinkSync(join(dir, 'missing-target'), join(dir, 'dangling'));
      const before = listTree(dir);
      const r = await runCli(c.args(dir, file));
      expect(r.code, r.stderr).toBe(c.code);
      expect(r.stdout).toBe('');
      if (c.code === 2) {
        expect(r.stderr).toMatch(new RegExp(`^crisp: ${c.err.source}.* \\(see --help\\)\\n$`));
      } else {
        expect(r.stderr).toMatch(c.err);
        expect(r.stderr).not.toMatch(/\(see --help\)/);
      }
      expect(r.stderr.trimEnd().split('\n')).toHaveLength(1);
      expect(r.stderr).not.toMatch(/\n\s+at /);
      expect(listTree(dir)).toEqual(before);
      expect(existsSync('crisp-report.html')).toBe(false);
    });
  }
});


describe('numeric flags, property-based', () => {
  const INT_FLAGS: [string, number, number, string[]][] = [
    ['--n', 1, 2 ** 26, []],
    ['--heads', 1, 1024, ['--kv-heads', '1']],
    ['--head-dim', 32, 1024, []],
    ['--seed', 0, 2 ** 32 - 1, []],
    ['--sample-rows', 1, 1e6, []],
    ['--repeats', 1, 100, []],
  ];
  const NUM_FLAGS: [string, number, number][] = [
    ['--alpha', 0, 1e6],
    ['--gamma', 0, 1],
    ['--tau-proxy', 0, 1],
  ];
  const junk = fc.oneof(
    fc.string({ maxLength: 12 }),
    fc.constantFrom('', ' ', 'NaN', 'Infinity', '-Infinity', '0x1f', '0o7', '0b1', '1_000', '1,5', '١٢', '½', '1e', 'e1', '.', '+', '-'),
    fc.double().map((x) => String(x)),
    fc.bigInt({ min: -(10n ** 30n), max: 10n ** 30n }).map((x) => x.toString()),
  );

  it('intFlag accepts exactly the decimal integers in range, and returns their value', () => {
    for (const [flag, lo, hi] of INT_FLAGS) {
      const parse = intFlag(flag, lo, hi);
      fc.assert(
        fc.property(junk, (s) => {
          const t = s.trim();
          const want = /^[+-]?\d+$/.test(t) && Number.isSafeInteger(Number(t)) && Number(t) >= lo && Number(t) <= hi;
          let got: number | undefined;
          try {
            got = parse(s);
          } catch (e) {
            expect(e).toBeInstanceOf(UsageError);
            expect((e as Error).message).toBe(`${flag} must be an integer in [${lo}, ${hi}]; got '${s}'`);
          }
          expect(got !== undefined).toBe(want);
          if (want) expect(got).toBe(Number(t) === 0 ? 0 : Number(t));
        }),
        { seed: SEED, numRuns: 300 },
      );
      fc.assert(
        fc.property(fc.integer({ min: lo, max: hi }), (x) => parse(String(x)) === x),
        { seed: SEED, numRuns: 100 },
      );
    }
  });

  it('numFlag accepts exactly the finite decimal numbers inside its open range', () => {
    for (const [flag, lo, hi] of NUM_FLAGS) {
      const parse = numFlag(flag, lo, hi, true);
      fc.assert(
        fc.property(fc.oneof(junk, fc.double({ min: lo, max: hi, noNaN: true }).map(String)), (s) => {
          const t = s.trim();
          const x = Number(t);
          const want = /^[+-]?(\d+\.?\d*|\.\d+)(e[+-]?\d+)?$/i.test(t) && Number.isFinite(x) && x > lo && x < hi;
          let got: number | undefined;
          try {
            got = parse(s);
          } catch (e) {
            expect(e).toBeInstanceOf(UsageError);
            expect((e as Error).message).toMatch(new RegExp(`^${flag} must be a number in \\(${lo}, ${hi}\\); got '`));
          }
          expect(got !== undefined).toBe(want);
          if (want) expect(got).toBe(x);
        }),
        { seed: SEED, numRuns: 300 },
      );
    }
  });

  it('namesFlag: every well-formed list parses back to itself, every other string is a usage error', () => {
    const name = fc.stringMatching(/^[A-Za-z_][\w.]{0,8}$/);
    fc.assert(
      fc.property(fc.subarray(['q', 'k', 'v'], { minLength: 1 }), fc.array(name, { minLength: 3, maxLength: 3 }), (roles, names) => {
        const raw = roles.map((r, i) => `${r}=${names[i]}`).join(',');
        expect(namesFlag(raw)).toEqual(Object.fromEntries(roles.map((r, i) => [r, names[i]])));
      }),
      { seed: SEED, numRuns: 100 },
    );
    fc.assert(
      fc.property(fc.string({ maxLength: 10 }), (s) => {
        fc.pre(!/^\s*[qkv]\s*=\s*[^,=\s][^,]*$/.test(s) && !s.includes(','));
        expect(() => namesFlag(s)).toThrow(UsageError);
      }),
      { seed: SEED, numRuns: 200 },
    );
  });

  it('the command exits 2 with one line naming the flag for any bad value, and accepts every good one without running', async () => {
    const all = [...INT_FLAGS.map(([f, lo, hi, extra]) => ({ flag: f, extra, ok: (t: string) => /^[+-]?\d+$/.test(t) && Number.isSafeInteger(Number(t)) && Number(t) >= lo && Number(t) <= hi, good: fc.integer({ min: lo, max: hi }).map(String) })),
      ...NUM_FLAGS.map(([f, lo, hi]) => ({ flag: f, extra: [] as string[], ok: (t: string) => /^[+-]?(\d+\.?\d*|\.\d+)(e[+-]?\d+)?$/i.test(t) && Number(t) > lo && Number(t) < hi, good: fc.double({ min: lo, max: hi, noNaN: true, minExcluded: true, maxExcluded: true }).map(String) }))];
    for (const { flag, extra, ok, good } of all) {
      await fc.assert(
        fc.asyncProperty(junk, async (s) => {
          // a value commander itself reads as a flag is another family (the matrix above)
          fc.pre(!/^-[-A-Za-z]/.test(s) && !ok(s.trim()));
          const r = await runCli(['run', flag, s, ...extra]);
          expect(r.code).toBe(2);
          expect(r.stdout).toBe('');
          expect(r.stderr.startsWith(`crisp: ${flag} must be `)).toBe(true);
          expect(r.stderr.endsWith(' (see --help)\n')).toBe(true);
          expect(r.stderr.trimEnd().split('\n')).toHaveLength(1);
        }),
        { seed: SEED, numRuns: 40 },
      );
      // Good values parse: the command goes on to the first check of the work (the report's
      // --out directory) and stops there, before any backend or data.
      await fc.assert(
        fc.asyncProperty(good, async (s) => {
          const r = await runCli(['report', '--backend', 'reference', flag, s, ...extra, '--out', '/nonexistent-dir/r.html']);
          expect(r.stderr).toMatch(/^crisp: error IO_ERROR: cannot write \/nonexistent-dir\/r\.html \(--out\)/);
          expect(r.code).toBe(1);
        }),
        { seed: SEED, numRuns: 20 },
      );
    }
  });
});
