// Paths that are not regular files, given to every reader: each is refused at once with
// IO_ERROR naming what the path is (no hang on a FIFO, no read of a device).
import { chmod, mkdir, symlink, writeFile } from 'node:fs/promises';
import { type Server, createServer } from 'node:net';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { openNpy, openSafetensors, openTensorFile, readQkv, writeNpy, writeSafetensors } from '../../src/index.js';
import { randomTensor, rng, tempDir } from '../helpers.js';
import { expectCode, makeCharDevice, makeFifo, releaseFifo } from './util.js';

const dir = await tempDir('special');
const rand = rng(7);
const t = randomTensor('f32', [4, 2, 8], rand);
const fifos: string[] = [];
let server: Server | undefined;

const readers: [string, (p: string) => Promise<unknown>][] = [
  ['openTensorFile', (p) => openTensorFile(p)],
  ['openSafetensors', (p) => openSafetensors(p)],
  ['openNpy', (p) => openNpy(p)],
  ['readQkv', (p) => readQkv(p, { layout: 'nhd' })],
];

beforeAll(async () => {
  await writeSafetensors(join(dir, 'real.safetensors'), { q: t, k: t, v: t });
  await writeNpy(join(dir, 'real.npy'), t);
});
afterAll(async () => {
  server?.close();
  // A reader stuck on a FIFO would hold a thread; open each for writing once to release it.
  for (const f of fifos) releaseFifo(f);
});

describe('special files given to readers', () => {
  it('a directory (to the file readers), /dev/null, a FIFO, a device node, a socket', async () => {
    const targets: [string, string, RegExp][] = [
      ['a directory', dir, /directory/],
      ['/dev/null', '/dev/null', /character device/],
    ];
    const fifo = join(dir, 'pipe');
    if (makeFifo(fifo)) {
      fifos.push(fifo);
      targets.push(['a FIFO', fifo, /FIFO/]);
    }
    const dev = join(dir, 'null-node');
    if (makeCharDevice(dev)) targets.push(['a device node', dev, /character device/]);
    const sock = join(dir, 'sock');
    server = createServer();
    await new Promise<void>((resolve) => server?.listen(sock, resolve));
    targets.push(['a socket', sock, /socket/]);
    for (const [what, path, kind] of targets) {
      for (const [name, read] of readers) {
        if (name === 'readQkv' && what === 'a directory') continue; // a directory is what readQkv takes
        const e = await expectCode(read(path), 'IO_ERROR', kind, 3000);
        expect(e.message, `${name} on ${what}`).toMatch(/not a regular file|give a safetensors file/);
      }
    }
  });

  it('symlinks: to a regular file (followed), to a FIFO (refused), dangling, a loop', async () => {
    await symlink(join(dir, 'real.safetensors'), join(dir, 'link.safetensors'));
    await using f = await openSafetensors(join(dir, 'link.safetensors'));
    expect(f.tensors.map((x) => x.name)).toEqual(['q', 'k', 'v']);
    expect((await readQkv(join(dir, 'link.safetensors'), { layout: 'nhd' })).q.shape).toEqual([4, 2, 8]);
    if (fifos.length > 0) {
      await symlink(fifos[0], join(dir, 'link-to-fifo'));
      for (const [, read] of readers) await expectCode(read(join(dir, 'link-to-fifo')), 'IO_ERROR', /FIFO/, 3000);
    }
    await symlink(join(dir, 'absent'), join(dir, 'dangling'));
    await symlink(join(dir, 'loop-b'), join(dir, 'loop-a'));
    await symlink(join(dir, 'loop-a'), join(dir, 'loop-b'));
    for (const [, read] of readers) {
      await expectCode(read(join(dir, 'dangling')), 'IO_ERROR', /no such file/);
      await expectCode(read(join(dir, 'loop-a')), 'IO_ERROR', /symlink loop/);
    }
  });

  it('bad paths: empty, NUL byte, not a string, a file used as a directory, too long, missing', async () => {
    for (const [, read] of readers) {
      await expectCode(read(''), 'INVALID_ARGUMENT', /non-empty string/);
      await expectCode(read('a\0b'), 'INVALID_ARGUMENT', /NUL byte/);
      await expectCode(read(42 as never), 'INVALID_ARGUMENT', /non-empty string.*got 42/);
      await expectCode(read(join(dir, 'real.npy', 'child')), 'IO_ERROR', /not a directory/);
      await expectCode(read(join(dir, 'x'.repeat(5000))), 'IO_ERROR', /too long/);
      await expectCode(read(join(dir, 'missing.safetensors')), 'IO_ERROR', /no such file/);
    }
  });

  it('an unreadable file (skipped as root, who reads anything)', async (ctx) => {
    if (process.getuid?.() === 0) {
      console.warn('[hostile] skipped the unreadable-file case: running as root');
      ctx.skip();
      return;
    }
    const p = join(dir, 'locked.safetensors');
    await writeFile(p, new Uint8Array(16));
    await chmod(p, 0);
    for (const [, read] of readers) await expectCode(read(p), 'IO_ERROR', /permission denied/);
  });

  it('a dump directory whose q.npy is a directory, a FIFO or a dangling link', async () => {
    for (const [kind, make] of [
      ['directory', (p: string) => mkdir(p)],
      [
        'FIFO',
        async (p: string) => {
          if (!makeFifo(p)) return 'skip';
          fifos.push(p);
        },
      ],
      ['dangling', (p: string) => symlink(join(dir, 'nowhere.npy'), p)],
    ] as const) {
      const sub = join(dir, `dump-${kind}`);
      await mkdir(sub);
      await writeNpy(join(sub, 'k.npy'), t);
      await writeNpy(join(sub, 'v.npy'), t);
      if ((await make(join(sub, 'q.npy'))) === 'skip') continue;
      await expectCode(readQkv(sub, { layout: 'nhd' }), 'IO_ERROR', /q\.npy/, 3000);
    }
  });
});
