/**
 * The Node entry where the `webgpu` package does not give Dawn:
 *
 * - it cannot load Dawn (no prebuilt dawn.node for the platform, a broken install): importing
 *   the entry works, and asking for a backend is BACKEND_UNAVAILABLE with the loader's
 *   message, so apps that import it for other backends (crisp-bench, the CLI) still start and
 *   report WebGPU as unavailable;
 * - it is not installed (a user who installed @crisp/kernels-webgpu alone: `webgpu` is an
 *   optional peer dependency): BACKEND_UNAVAILABLE naming the package and the install
 *   command, instead of the loader's bare "Cannot find package". The tarball check
 *   (tools/pack-check) does the same against Node's own loader in a project without webgpu.
 */
import { readFileSync } from 'node:fs';
import { isCrispError } from '@crisp/core';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';

// what `import('webgpu')` throws, set by each test (the factory runs on every import, as it throws)
const failure = vi.hoisted(() => ({ error: new Error('unset') }));
vi.mock('webgpu', () => {
  throw failure.error;
});

let saved: string | undefined;
beforeAll(() => {
  // past the Vulkan-loader check (a machine without libvulkan stops there, with its own reason)
  saved = process.env.CRISP_WEBGPU_SKIP_LOADER_CHECK;
  process.env.CRISP_WEBGPU_SKIP_LOADER_CHECK = '1';
});
afterAll(() => {
  if (saved === undefined) delete process.env.CRISP_WEBGPU_SKIP_LOADER_CHECK;
  else process.env.CRISP_WEBGPU_SKIP_LOADER_CHECK = saved;
});

const rejection = (p: Promise<unknown>) =>
  p.then(
    () => undefined,
    (x: unknown) => x,
  );

describe('the webgpu package failing to load', () => {
  it('leaves the entry importable and reports BACKEND_UNAVAILABLE with the reason', async () => {
    failure.error = new Error("Cannot find module '.../webgpu/dist/linux-x64/dawn.node'");
    const m = await import('./node.js');
    const a = await m.webgpuAvailability();
    expect(a.available).toBe(false);
    // (vitest wraps the factory's error in its own message; the prefix is ours)
    expect(a.reason).toMatch(/^the webgpu package \(Dawn\) failed to load: ./);
    expect(a.reason).not.toContain('\n');
    const e = await rejection(m.createNodeWebGpuBackend());
    expect(isCrispError(e) && e.code).toBe('BACKEND_UNAVAILABLE');
  });
});

describe('the webgpu package not installed', () => {
  it('is BACKEND_UNAVAILABLE naming the entry, the package and the install command', async () => {
    // what Node's ESM loader throws for a package that is not installed
    failure.error = Object.assign(new Error("Cannot find package 'webgpu' imported from /app/node_modules/@crisp/kernels-webgpu/dist/node.js"), {
      code: 'ERR_MODULE_NOT_FOUND',
    });
    const m = await import('./node.js');
    const e = await rejection(m.createNodeWebGpuBackend());
    expect(isCrispError(e) && e.code).toBe('BACKEND_UNAVAILABLE');
    const message = (e as Error).message;
    expect(message).toContain('@crisp/kernels-webgpu/node');
    expect(message).toContain('optional peer dependency');
    expect(message).toContain('`npm i webgpu@0.6.2`');
    expect(await m.webgpuAvailability()).toEqual({ available: false, reason: message });
  });

  it('names the version the package declares as its peer', async () => {
    const { DAWN_PACKAGE } = await import('./node.js');
    const pkg = JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8'));
    expect(DAWN_PACKAGE).toBe(`webgpu@${pkg.peerDependencies.webgpu}`);
    expect(pkg.peerDependenciesMeta.webgpu).toEqual({ optional: true });
    expect(pkg.dependencies?.webgpu).toBeUndefined();
    expect(pkg.devDependencies.webgpu).toBe(pkg.peerDependencies.webgpu);
  });
});
