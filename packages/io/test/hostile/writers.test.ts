// Writers under hostile targets and sources: anything but a regular file is refused, a
// failure at any point leaves the old file byte-for-byte and no temporary file, and
// concurrent writers never mix their bytes.
import { execFileSync } from 'node:child_process';
import { lstat, mkdir, readFile, readdir, readlink, rm, stat, symlink, writeFile } from 'node:fs/promises';
import { createServer } from 'node:net';
import { join } from 'node:path';
import type { HostData } from '@crisp/core';
import { afterAll, describe, expect, it } from 'vitest';
import { openSafetensors, readQkv, writeNpy, writeSafetensors } from '../../src/index.js';
import { randomTensor, rng, tempDir } from '../helpers.js';
import { expectCode, leftovers, makeCharDevice, makeFifo } from './util.js';

const dir = await tempDir('writers');
const rand = rng(11);
const t = randomTensor('f32', [6, 2, 4], rand);
const b16 = randomTensor('bf16', [6, 2, 4], rand);
let n = 0;
const fresh = async () => {
  const d = join(dir, `w${n++}`);
  await mkdir(d);
  return d;
};

describe('writer targets', () => {
  it('refuses a directory, FIFO, socket, device node, dangling link and link loop; each left as it was', async () => {
    const d = await fresh();
    const targets: [string, RegExp][] = [];
    await mkdir(join(d, 'dir.npy'));
    targets.push(['dir.npy', /directory/]);
    if (makeFifo(join(d, 'fifo.npy'))) targets.push(['fifo.npy', /FIFO/]);
    if (makeCharDevice(join(d, 'dev.npy'))) targets.push(['dev.npy', /character device/]);
    const server = createServer();
    await new Promise<void>((r) => server.listen(join(d, 'sock.npy'), r));
    targets.push(['sock.npy', /socket/]);
    await symlink(join(d, 'nowhere', 'x.npy'), join(d, 'dangling.npy'));
    targets.push(['dangling.npy', /symbolic link.*no such file/]);
    await symlink(join(d, 'loop-b.npy'), join(d, 'loop-a.npy'));
    await symlink(join(d, 'loop-a.npy'), join(d, 'loop-b.npy'));
    targets.push(['loop-a.npy', /symlink loop/]);
    if (targets.some(([p]) => p === 'fifo.npy')) {
      await symlink(join(d, 'fifo.npy'), join(d, 'to-fifo.npy'));
      targets.push(['to-fifo.npy', /FIFO/]);
    }
    try {
      for (const [name, kind] of targets) {
        const p = join(d, name);
        const before = await lstat(p);
        await expectCode(writeNpy(p, t), 'IO_ERROR', kind, 3000);
        await expectCode(writeSafetensors(p, { t }), 'IO_ERROR', kind, 3000);
        const after = await lstat(p);
        expect([after.ino, after.mode, after.size], name).toEqual([before.ino, before.mode, before.size]);
      }
      expect(await leftovers(d)).toEqual([]);
    } finally {
      server.close();
    }
  });

  it('follows a symlink to a regular file: the file is replaced, the link kept', async () => {
    const d = await fresh();
    await writeNpy(join(d, 'real.npy'), b16);
    await symlink(join(d, 'real.npy'), join(d, 'link.npy'));
    await writeNpy(join(d, 'link.npy'), t);
    expect((await lstat(join(d, 'link.npy'))).isSymbolicLink()).toBe(true);
    expect(await readlink(join(d, 'link.npy'))).toBe(join(d, 'real.npy'));
    expect((await stat(join(d, 'real.npy'))).size).toBe(128 + 6 * 2 * 4 * 4);
    expect(await leftovers(d)).toEqual([]);
  });

  it('a missing directory, a file as a directory, a bad path: IO_ERROR / INVALID_ARGUMENT, nothing created', async () => {
    const d = await fresh();
    await writeFile(join(d, 'file'), 'x');
    await expectCode(writeNpy(join(d, 'no', 'such', 'x.npy'), t), 'IO_ERROR', /no such file or directory/);
    await expectCode(writeNpy(join(d, 'file', 'x.npy'), t), 'IO_ERROR', /not a directory/);
    await expectCode(writeNpy('', t), 'INVALID_ARGUMENT', /non-empty string/);
    await expectCode(writeSafetensors('x\0y', { t }), 'INVALID_ARGUMENT', /NUL/);
    expect((await readdir(d)).sort()).toEqual(['file']);
  });

  it('keeps the mode of the file it replaces', async () => {
    const d = await fresh();
    const p = join(d, 'x.safetensors');
    await writeSafetensors(p, { t });
    execFileSync('chmod', ['640', p]);
    await writeSafetensors(p, { t: b16 });
    expect((await stat(p)).mode & 0o777).toBe(0o640);
  });
});

describe('writer sources that fail', () => {
  const src = (chunks: () => unknown) => ({ dtype: 'f32' as const, shape: [6, 2, 4], chunks }) as never;
  const cases: [string, unknown, 'INVALID_ARGUMENT' | 'DTYPE_MISMATCH' | 'SHAPE_MISMATCH', RegExp][] = [
    ['chunks() throws', src(() => {
      throw new RangeError('no data');
    }), 'INVALID_ARGUMENT', /chunk source threw RangeError: no data/],
    ['chunks() returns a number', src(() => 42), 'INVALID_ARGUMENT', /must return an iterable/],
    ['chunks() returns null', src(() => null), 'INVALID_ARGUMENT', /must return an iterable/],
    ['a generator throws after one chunk', src(function* () {
      yield t.data.subarray(0, 8);
      throw new Error('disk gone');
    }), 'INVALID_ARGUMENT', /disk gone/],
    ['an async generator rejects after one chunk', src(async function* () {
      yield t.data.subarray(0, 8);
      await new Promise((r) => setTimeout(r, 5));
      throw new Error('late failure');
    }), 'INVALID_ARGUMENT', /late failure/],
    ['a chunk of the wrong type', src(function* () {
      yield new Uint16Array(48);
    }), 'DTYPE_MISMATCH', /chunk is a Uint16Array/],
    ['a null chunk', src(function* () {
      yield null;
    }), 'DTYPE_MISMATCH', /chunk is null/],
    ['a plain array chunk', src(function* () {
      yield [1, 2, 3];
    }), 'DTYPE_MISMATCH', /chunk is an array/],
    ['too few values', src(function* () {
      yield t.data.subarray(0, 40);
    }), 'SHAPE_MISMATCH', /yielded 40/],
    ['too many values', src(function* () {
      yield t.data;
      yield t.data.subarray(0, 1);
    }), 'SHAPE_MISMATCH', /yield more/],
    ['a host tensor with null data', { dtype: 'f32', shape: [6, 2, 4], data: null }, 'DTYPE_MISMATCH', /data is null/],
    ['a host tensor of the wrong length', { dtype: 'f32', shape: [6, 2, 4], data: new Float32Array(5) }, 'SHAPE_MISMATCH', /5 values/],
    ['a bad dtype', { dtype: 'f64', shape: [6, 2, 4], data: t.data }, 'DTYPE_MISMATCH', /must be one of f32, f16, bf16/],
    ['a negative dim', { dtype: 'f32', shape: [6, -2, 4], data: t.data }, 'SHAPE_MISMATCH', /non-negative integers/],
    ['null', null, 'INVALID_ARGUMENT', /must be a host tensor/],
    ['a string', 'q', 'INVALID_ARGUMENT', /must be a host tensor/],
  ];
  for (const [name, bad, code, message] of cases) {
    it(`${name}: ${code}, the old file kept, no temporary file`, async () => {
      const d = await fresh();
      const st = join(d, 'x.safetensors');
      const np = join(d, 'x.npy');
      await writeSafetensors(st, { t });
      await writeNpy(np, t);
      const before = [await readFile(st), await readFile(np)];
      await expectCode(writeSafetensors(st, { q: t, bad } as never), code, message);
      await expectCode(writeNpy(np, bad as never, { layout: 'hnd' }), code, message);
      expect(Buffer.compare(before[0], await readFile(st))).toBe(0);
      expect(Buffer.compare(before[1], await readFile(np))).toBe(0);
      expect((await readdir(d)).sort()).toEqual(['x.npy', 'x.safetensors']);
    });
  }

  it('bad arguments besides the tensors', async () => {
    const d = await fresh();
    const p = join(d, 'x.safetensors');
    await expectCode(writeSafetensors(p, null as never), 'INVALID_ARGUMENT', /tensors must be an object/);
    await expectCode(writeSafetensors(p, { t }, { metadata: { a: 1 } } as never), 'INVALID_ARGUMENT', /metadata\['a'\] must be a string/);
    await expectCode(writeSafetensors(p, { t }, { metadata: 'x' } as never), 'INVALID_ARGUMENT', /metadata must be an object/);
    await expectCode(writeSafetensors(p, { t }, { layot: 'hnd' } as never), 'INVALID_ARGUMENT', /unknown option 'layot'/);
    await expectCode(writeSafetensors(p, { __metadata__: t }), 'INVALID_ARGUMENT', /cannot be a tensor name/);
    await expectCode(writeSafetensors(p, { '': t }), 'INVALID_ARGUMENT', /cannot be a tensor name/);
    await expectCode(writeNpy(p, t, { layout: 'xyz' }), 'INVALID_ARGUMENT', /layout must be one of/);
    await expectCode(writeNpy(p, t, null as never), 'INVALID_ARGUMENT', /options must be an object/);
    await expectCode(writeNpy(p, { dtype: 'f32', shape: [2 ** 50, 4], chunks: () => [] }), 'LIMIT_EXCEEDED', /more bytes than a file/);
    await expectCode(writeNpy(p, { dtype: 'f32', shape: [2 ** 40, 2 ** 20], chunks: () => [] }), 'SHAPE_MISMATCH', /over 2\^53/);
    expect(await readdir(d)).toEqual([]);
  });

  it("a tensor named '__proto__' is written as a key and reads back", async () => {
    const d = await fresh();
    const p = join(d, 'proto.safetensors');
    await writeSafetensors(p, Object.fromEntries([['__proto__', t], ['k', t], ['v', t]]));
    await using f = await openSafetensors(p);
    expect(f.tensors.map((x) => x.name)).toEqual(['__proto__', 'k', 'v']);
    const got = await readQkv(p, { layout: 'nhd', names: { q: '__proto__' } });
    expect(got.q.shape).toEqual([6, 2, 4]);
  });
});

describe('concurrency and placement', () => {
  it('the temporary file is beside the target, hidden, unique, and gone afterwards', async () => {
    const d = await fresh();
    const seen: string[][] = [];
    const spy = {
      dtype: 'f32' as const,
      shape: [6, 2, 4],
      async *chunks(): AsyncGenerator<HostData> {
        seen.push(await readdir(d));
        yield t.data;
      },
    };
    await Promise.all([writeNpy(join(d, 'x.npy'), spy), writeNpy(join(d, 'x.npy'), spy)]);
    const temps = seen.flat().filter((f) => f.endsWith('.partial'));
    expect(new Set(temps).size).toBe(2);
    for (const f of temps) expect(f).toMatch(/^\.x\.npy\.\d+\.[0-9a-f]{12}\.partial$/);
    expect(await readdir(d)).toEqual(['x.npy']);
  });

  it('eight concurrent writers of different data: the result is exactly one of them', async () => {
    const d = await fresh();
    const p = join(d, 'x.safetensors');
    const versions = Array.from({ length: 8 }, () => randomTensor('bf16', [64, 4, 16], rand));
    await Promise.all(versions.map((v) => writeSafetensors(p, { q: v, k: v, v })));
    const got = await readQkv(p, { layout: 'nhd' });
    const match = versions.filter((v) => Buffer.compare(Buffer.from((v.data as Uint16Array).buffer), Buffer.from(got.q.data.buffer)) === 0);
    expect(match.length).toBe(1);
    expect(Buffer.compare(Buffer.from(got.k.data.buffer), Buffer.from(got.q.data.buffer))).toBe(0);
    expect(await readdir(d)).toEqual(['x.safetensors']);
  });
});

describe('a full disk', () => {
  const mnt = join(dir, 'small-fs');
  let mounted = false;
  afterAll(async () => {
    if (mounted) execFileSync('umount', [mnt]);
  });
  it('ENOSPC mid-write: IO_ERROR saying the disk is full, the old file kept, no temporary file', async (ctx) => {
    await mkdir(mnt);
    try {
      execFileSync('mount', ['-t', 'tmpfs', '-o', 'size=64k', 'tmpfs', mnt], { stdio: 'ignore' });
      mounted = true;
    } catch {
      console.warn('[hostile] skipped the full-disk case: cannot mount a small tmpfs here (needs root)');
      ctx.skip();
      return;
    }
    const p = join(mnt, 'x.safetensors');
    await writeSafetensors(p, { t });
    const before = await readFile(p);
    const big = randomTensor('f32', [200, 8, 16], rand); // 100 KiB: more than the disk holds
    await expectCode(writeSafetensors(p, { big }), 'IO_ERROR', /disk is full/);
    expect(Buffer.compare(before, await readFile(p))).toBe(0);
    expect(await readdir(mnt)).toEqual(['x.safetensors']);
    await rm(p);
  });
});
