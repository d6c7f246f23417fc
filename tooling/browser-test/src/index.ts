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
