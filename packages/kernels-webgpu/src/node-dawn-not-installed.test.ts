/**
 * The Node entry where the optional peer dependency `webgpu` is not installed (a user who
 * installed @crisp/kernels-webgpu alone): BACKEND_UNAVAILABLE that names the package and the
 * install command, instead of the loader's bare "Cannot find package". The tarball check
 * (tools/pack-check) does the same against the real loader in a project without webgpu.
 */
import { readFileSync } from 'node:fs';
import { isCrispError } from '@crisp/core';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';

vi.mock('webgpu', () => {
  // what Node's ESM loader throws for a package that is not installed
  throw Object.assign(new Error("Cannot find package 'webgpu' imported from /app/node_modules/@crisp/kernels-webgpu/dist/node.js"), {
    code: 'ERR_MODULE_NOT_FOUND',
  });
});

describe('the webgpu package not installed', () => {
  let saved: string | undefined;
  beforeAll(() => {
    saved = process.env.CRISP_WEBGPU_SKIP_LOADER_CHECK;
    process.env.CRISP_WEBGPU_SKIP_LOADER_CHECK = '1';
  });
  afterAll(() => {
    if (saved === undefined) delete process.env.CRISP_WEBGPU_SKIP_LOADER_CHECK;
    else process.env.CRISP_WEBGPU_SKIP_LOADER_CHECK = saved;
  });

  it('is BACKEND_UNAVAILABLE naming the entry, the package and the install command', async () => {
    const m = await import('./node.js');
    const e = await m.createNodeWebGpuBackend().then(
      () => undefined,
      (x: unknown) => x,
    );
    expect(isCrispError(e) && e.code).toBe('BACKEND_UNAVAILABLE');
    const message = (e as Error).message;
    expect(message).toContain('@crisp/kernels-webgpu/node');
    expect(message).toContain('optional peer dependency');
    expect(message).toContain('`npm i webgpu@0.6.2`');
    const a = await m.webgpuAvailability();
    expect(a).toEqual({ available: false, reason: message });
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
