/**
 * Node-side helpers for tests that load a built page in headless Chromium with WebGPU
 * (apps/demo, packages/tfjs): where Chromium is, the flags that give it WebGPU on
 * SwiftShader, and a static file server for the built page.
 */
import { createReadStream, existsSync, statSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { extname, join, normalize, sep } from 'node:path';

export const CHROMIUM = process.env.CRISP_CHROMIUM ?? '/usr/bin/chromium';

/**
 * WebGPU in headless Chromium on a machine without a GPU: Dawn over Vulkan on SwiftShader
 * (Debian's chromium ships libvk_swiftshader.so). --enable-unsafe-webgpu lifts the Linux
 * blocklist; --disable-vulkan-surface because headless has no surface to present to.
 */
export const WEBGPU_CHROMIUM_ARGS: readonly string[] = [
  '--no-sandbox',
  '--enable-unsafe-webgpu',
  '--enable-features=Vulkan',
  '--use-vulkan=swiftshader',
  '--use-webgpu-adapter=swiftshader',
  '--disable-vulkan-surface',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
  '--no-first-run',
];

const MIME: Record<string, string> = {
  '.html': 'text/html; charset=utf-8',
  '.js': 'text/javascript; charset=utf-8',
  '.css': 'text/css; charset=utf-8',
  '.json': 'application/json',
  '.svg': 'image/svg+xml',
};

/** Serve `dir` on 127.0.0.1 (a secure context, as WebGPU requires) on a free port. */
export async function serveStatic(dir: string): Promise<{ url: string; server: Server }> {
  const root = normalize(dir) + sep;
  const server = createServer((req, res) => {
    const path = decodeURIComponent(new URL(req.url ?? '/', 'http://x').pathname);
    const file = normalize(join(root, path === '/' ? 'index.html' : path));
    if (!file.startsWith(root) || !existsSync(file) || !statSync(file).isFile()) {
      res.writeHead(404).end('not found');
      return;
    }
    res.writeHead(200, { 'content-type': MIME[extname(file)] ?? 'application/octet-stream' });
    createReadStream(file).pipe(res);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  return { url: `http://127.0.0.1:${port}/`, server };
}

/** A page that stopped making progress: its last progress line and how long it stood. */
export class PageStalled extends Error {
  constructor(
    readonly progress: string,
    readonly stoodMs: number,
    readonly waitedMs: number,
  ) {
    super(`the page made no progress for ${(stoodMs / 1000).toFixed(0)} s (after ${(waitedMs / 1000).toFixed(0)} s in all); its last progress line: '${progress}'`);
    this.name = 'PageStalled';
  }
}

export interface WatchOptions {
  /** fail when the progress line stands this long (a hang), however long the whole run takes */
  readonly stallMs: number;
  /** fail after this long in all, progress or not */
  readonly totalMs: number;
  readonly pollMs?: number;
}

/** `p`, or a rejection after `ms` (a page whose main thread is busy answers evaluate late). */
function within<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what} did not answer in ${(ms / 1000).toFixed(0)} s`)), ms);
  });
  return Promise.race([p, late]).finally(() => clearTimeout(timer));
}

/**
 * Wait until `done()` says yes, polling, with a hang guard that follows the page's own progress
 * line instead of a fixed deadline: a run that is slow because the machine is loaded keeps
 * going while its progress line moves, and a run that hangs fails with the line it hung on.
 */
export async function waitWithProgress(
  done: () => Promise<boolean>,
  progress: () => Promise<string>,
  opts: WatchOptions,
): Promise<void> {
  const t0 = Date.now();
  let line = '';
  let since = t0;
  for (;;) {
    const finished = await within(done(), opts.stallMs, 'the page').catch((e: Error) => {
      throw new PageStalled(`${line} (${e.message})`, Date.now() - since, Date.now() - t0);
    });
    if (finished) return;
    const now = Date.now();
    const p = await within(progress(), opts.stallMs, 'the page').catch(() => line);
    if (p !== line) {
      line = p;
      since = now;
    }
    if (now - since > opts.stallMs || now - t0 > opts.totalMs) throw new PageStalled(line, now - since, now - t0);
    await new Promise((r) => setTimeout(r, opts.pollMs ?? 500));
  }
}
