// The command as a real process (bundled from the sources with esbuild): cases that could
// hang or kill a process, where an in-process test would hang or die with it.
import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import { chmodSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { writeNpy } from '@crisp/io';
import { scenario } from '@crisp/synth';
import { build } from 'esbuild';
import { beforeAll, describe, expect, it } from 'vitest';
import { listTree, tempDir } from './test-support.js';

const SRC = fileURLToPath(new URL('.', import.meta.url));
const PKG = JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8')) as { version: string };
let bundle: string;

beforeAll(async () => {
  bundle = join(tempDir('crisp-bundle-'), 'crisp.mjs');
  await build({
    // The test's entry: the product's process entry, plus a stray rejected promise on request
    // (what a reader bug would leave behind) to prove the guard catches it.
    stdin: {
      contents: `import { runProcess } from './main.ts';
if (process.env.CRISP_TEST_STRAY_REJECTION) setTimeout(() => Promise.reject(new Error('a stray rejection')), 50);
// Slow file writes on request, so a test can interrupt one under way.
if (process.env.CRISP_TEST_SLOW_WRITES) {
  const { open } = await import('node:fs/promises');
  const h = await open(process.execPath, 'r');
  const proto = Object.getPrototypeOf(h);
  await h.close();
  const write = proto.write;
  proto.write = async function (...a) {
    await new Promise((r) => setTimeout(r, Number(process.env.CRISP_TEST_SLOW_WRITES)));
    return write.apply(this, a);
  };
}
runProcess(process.argv);`,
      resolveDir: SRC,
      loader: 'ts',
    },
    outfile: bundle,
    bundle: true,
    platform: 'node',
    format: 'esm',
    target: 'node20',
    conditions: ['@crisp/source'],
    // as tools/gpu-rig/scripts/pack.sh bundles it: the version inside (no package.json beside it)
    define: { __CRISP_CLI_VERSION__: JSON.stringify(PKG.version) },
    external: ['webgpu', 'koffi'],
    banner: { js: "import { createRequire as __crispRequire } from 'node:module'; const require = __crispRequire(import.meta.url);" },
    logLevel: 'warning',
  });
});

interface Exit {
  readonly code: number | null;
  readonly stdout: string;
  readonly stderr: string;
  readonly timedOut: boolean;
}

interface SpawnOptions {
  env?: Record<string, string>;
  timeoutMs?: number;
  onSpawn?: (c: ChildProcess) => void;
  /** run this program with these arguments instead of the bundle (args are appended) */
  via?: { file: string; args: string[] };
}

function crisp(args: string[], opts: SpawnOptions = {}): Promise<Exit> {
  return new Promise((resolve) => {
    const [file, argv] = opts.via ? [opts.via.file, [...opts.via.args, ...args]] : [process.execPath, [bundle, ...args]];
    const child = spawn(file, argv, { env: { ...process.env, ...opts.env }, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    let timedOut = false;
    child.stdout.on('data', (b) => (stdout += b));
    child.stderr.on('data', (b) => (stderr += b));
    child.stdout.on('error', () => undefined);
    opts.onSpawn?.(child);
    const timer = setTimeout(() => {
      timedOut = true;
      child.kill('SIGKILL');
    }, opts.timeoutMs ?? 60_000);
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr, timedOut });
    });
  });
}

describe('crisp as a process', () => {
  it('--version from a bundle with no package.json above it prints the version bundled into it', async () => {
    const r = await crisp(['--version']);
    expect(r.stderr).toBe('');
    expect(r.code).toBe(0);
    expect(r.stdout).toBe(`${PKG.version}\n`);
  });

  it('Ctrl-C during --out leaves no file and no temporary file, and exits 130', async () => {
    const dir = tempDir();
    const out = join(dir, 'out.safetensors');
    let sent = false;
    const r = await crisp(['run', '--backend', 'reference', '--n', '1536', '--heads', '4', '--kv-heads', '1', '--head-dim', '32', '--sample-rows', '4', '--no-dense', '--out', out], {
      env: { CRISP_TEST_SLOW_WRITES: '150' },
      timeoutMs: 60_000,
      onSpawn: (c) => {
        // interrupt once the temporary file exists (the write is under way)
        const poll = setInterval(() => {
          if (!sent && listTree(dir).some((f) => f.endsWith('.partial'))) {
            sent = true;
            clearInterval(poll);
            c.kill('SIGINT');
          }
        }, 20);
        c.on('close', () => clearInterval(poll));
      },
    });
    expect(sent).toBe(true);
    expect(r.code, r.stderr).toBe(130);
    expect(r.stderr).toMatch(/crisp: interrupted \(SIGINT\)/);
    expect(listTree(dir)).toEqual([]);
  }, 70_000);

  it('a FIFO as --qkv fails at once instead of waiting for a writer', async () => {
    const dir = tempDir();
    execFileSync('mkfifo', [join(dir, 'layer.safetensors')]);
    const r = await crisp(['run', '--backend', 'reference', '--qkv', join(dir, 'layer.safetensors')]);
    expect(r.timedOut).toBe(false);
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(/^crisp: error IO_ERROR: cannot read .*layer\.safetensors \(--qkv\): it is a FIFO \(named pipe\), not a regular file/);
  });

  it('a FIFO as q.npy inside a dump directory fails at once', async () => {
    const dir = tempDir();
    const { k, v } = scenario('llama-like', { n: 256, heads: 2, kvHeads: 1, headDim: 32 }).rows(0, 256);
    mkdirSync(join(dir, 'npy'));
    await writeNpy(join(dir, 'npy', 'k.npy'), k);
    await writeNpy(join(dir, 'npy', 'v.npy'), v);
    execFileSync('mkfifo', [join(dir, 'npy', 'q.npy')]);
    const r = await crisp(['run', '--backend', 'reference', '--qkv', join(dir, 'npy')]);
    expect(r.timedOut).toBe(false);
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(/^crisp: error IO_ERROR: cannot read .*q\.npy \(q of --qkv\): it is a FIFO/);
  });

  it('--n 67108864 is refused before any data is generated (generating it would outlast the spawn guard)', async () => {
    const r = await crisp(['run', '--backend', 'reference', '--n', '67108864']);
    expect(r.timedOut).toBe(false);
    expect(r.code).toBe(1);
    expect(r.stderr).toBe("crisp: error LIMIT_EXCEEDED: n = 67108864 exceeds the reference backend's limit of 65536 tokens; pass --n 65536 or less, or pick another --backend\n");
  });

  it('a stray rejected promise ends the process with one line and exit 1, the stack only with CRISP_DEBUG=1', async () => {
    // --help resolves main at once; the stray rejection comes 50 ms later, while the process lives on its timer.
    const quiet = await crisp(['run', '--help'], { env: { CRISP_TEST_STRAY_REJECTION: '1' } });
    expect(quiet.code).toBe(1);
    expect(quiet.stderr).toBe('crisp: internal error: Error: a stray rejection (a bug in crisp; rerun with CRISP_DEBUG=1 for the stack and report it)\n');
    const debug = await crisp(['run', '--help'], { env: { CRISP_TEST_STRAY_REJECTION: '1', CRISP_DEBUG: '1' } });
    expect(debug.code).toBe(1);
    expect(debug.stderr).toMatch(/^crisp: internal error: Error: a stray rejection\nError: a stray rejection\n\s+at /);
  });

  it('a usage error exits 2 with one line and no stack', async () => {
    const r = await crisp(['run', '--qkv', '']);
    expect(r.code).toBe(2);
    expect(r.stdout).toBe('');
    expect(r.stderr).toBe("crisp: --qkv needs a safetensors file or a directory of .npy or layer files; got '' (see --help)\n");
  });

  it('a reader that closes stdout early (crisp run --json | head -c 0) ends the command quietly', async () => {
    const dir = tempDir();
    const r = await crisp(['run', '--backend', 'reference', '--n', '256', '--heads', '2', '--kv-heads', '1', '--head-dim', '32', '--sample-rows', '2', '--json'], {
      onSpawn: (c) => c.stdout?.destroy(),
    });
    expect(r.timedOut).toBe(false);
    expect(r.stderr).not.toMatch(/internal error|\n\s+at /);
    expect(r.code).toBe(0);
    expect(listTree(dir)).toEqual([]);
  });
});

describe('pnpm crisp (the root script) with --json', () => {
  it("writes nothing but the JSON document on stdout: the build step's output goes to stderr", async () => {
    const root = JSON.parse(readFileSync(new URL('../../../package.json', import.meta.url), 'utf8')) as { scripts: Record<string, string> };
    const script = root.scripts.crisp;
    // the build filter names the CLI's package (with its dependencies)
    expect(script).toContain('--filter=@crisp/cli...');
    const entry = 'node apps/cli/bin/crisp.js';
    expect(script.endsWith(entry)).toBe(true);
    // The script as a shell runs it (pnpm appends the arguments), with a stand-in turbo that
    // talks on both streams as the real one does, and the bundle in place of the built bin.
    const dir = tempDir();
    const fake = join(dir, 'turbo');
    writeFileSync(fake, "#!/bin/sh\necho '   • Running build in 12 packages'\necho ' Tasks:    11 successful, 11 total'\necho 'a build warning' 1>&2\n");
    chmodSync(fake, 0o755);
    const line = `${script.slice(0, -entry.length)}"${process.execPath}" "${bundle}"`;
    const args = ['run', '--backend', 'reference', '--n', '512', '--heads', '2', '--kv-heads', '1', '--head-dim', '32', '--sample-rows', '4', '--json'];
    const r = await crisp(args, { via: { file: 'sh', args: ['-c', `${line} "$@"`, 'sh'] }, env: { PATH: `${dir}:${process.env.PATH}` }, timeoutMs: 60_000 });
    expect(r.code, r.stderr).toBe(0);
    const doc = JSON.parse(r.stdout) as { input: { n: number; heads: number }; policies: unknown[] };
    expect(doc.input).toMatchObject({ n: 512, heads: 2 });
    expect(doc.policies).toHaveLength(1);
    expect(r.stdout.startsWith('{')).toBe(true);
    expect(r.stderr).toContain('Running build in 12 packages');
    expect(r.stderr).toContain('a build warning');
  });
});

describe('crisp run --threads', () => {
  it('generates the scenario and computes the exact rows on worker threads of the entry itself: the same numbers as one thread', async () => {
    const args = ['run', '--backend', 'reference', '--n', '2048', '--heads', '4', '--kv-heads', '1', '--head-dim', '32', '--sample-rows', '8', '--seed', '11', '--json'];
    const [par, one] = [await crisp([...args, '--threads', '3'], { timeoutMs: 120_000 }), await crisp([...args, '--threads', '1'], { timeoutMs: 120_000 })];
    expect(par.code, par.stderr).toBe(0);
    expect(one.code, one.stderr).toBe(0);
    const [a, b] = [JSON.parse(par.stdout), JSON.parse(one.stdout)];
    expect(a.threads).toBe(3);
    expect(b.threads).toBe(1);
    // the exact rows too: the same block masses, so the same mass recall to the bit
    expect(a.checkThreads).toBe(3);
    expect(b.checkThreads).toBe(1);
    expect(par.stderr).not.toMatch(/one thread/);
    expect(a.phasesMs.generate).toBeGreaterThan(0);
    for (const key of ['density', 'massRecall', 'outputError'] as const) {
      expect(a.policies[0].heads.map((h: Record<string, number>) => h[key])).toEqual(b.policies[0].heads.map((h: Record<string, number>) => h[key]));
    }
  });
});
