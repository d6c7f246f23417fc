/**
 * Test helpers (Node only): the seed, a static file server for the built page, the
 * Chromium flags that give headless Chromium WebGPU on SwiftShader, and float64 checks.
 */
import { createReadStream, existsSync, statSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { extname, join, normalize, sep } from 'node:path';

export function testSeed(): number {
  const seed = Number(process.env.CRISP_TEST_SEED ?? Math.floor(Math.random() * 2 ** 31));
  console.log(`demo tests: seed ${seed} (replay with CRISP_TEST_SEED=${seed})`);
  return seed;
}

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

/** ‖a − b‖ / ‖b‖ (Frobenius) in float64. */
export function relErr(a: ArrayLike<number>, b: ArrayLike<number>): number {
  if (a.length !== b.length) throw new Error(`length ${a.length} != ${b.length}`);
  let num = 0;
  let den = 0;
  for (let i = 0; i < a.length; i++) {
    const e = a[i] - b[i];
    num += e * e;
    den += b[i] * b[i];
  }
  return Math.sqrt(num / den);
}

/**
 * The plot data agrees with the mask: block masses sum to 1, and every selected vertical key
 * block J (slash offset O) is in the mask's rows for every query block I >= J (I >= O).
 * Returns a description of the first disagreement, or null.
 */
export function checkCliffData(
  heads: readonly { head: number; verticalMass: number[] | null; slashMass: number[] | null; verticalSelected: number[]; slashSelected: number[] }[],
  mask: { numBlocks: number; rowPtr: number[]; cols: number[] },
): string | null {
  const Nb = mask.numBlocks;
  const has = (h: number, I: number, J: number) => mask.cols.slice(mask.rowPtr[h * Nb + I], mask.rowPtr[h * Nb + I + 1]).includes(J);
  for (const h of heads) {
    for (const [name, m] of [
      ['p_v', h.verticalMass],
      ['p_s', h.slashMass],
    ] as const) {
      if (!m || m.length !== Nb) return `head ${h.head}: ${name} has ${m?.length} blocks, not ${Nb}`;
      const sum = m.reduce((a, b) => a + b, 0);
      if (Math.abs(sum - 1) > 1e-3 || m.some((x) => !(x >= 0))) return `head ${h.head}: ${name} sums to ${sum}`;
    }
    for (const J of h.verticalSelected) {
      for (let I = J; I < Nb; I++) if (!has(h.head, I, J)) return `head ${h.head}: vertical block ${J} missing in query block ${I}`;
    }
    for (const O of h.slashSelected) {
      for (let I = O; I < Nb; I++) if (!has(h.head, I, I - O)) return `head ${h.head}: slash offset ${O} missing in query block ${I}`;
    }
  }
  return null;
}
