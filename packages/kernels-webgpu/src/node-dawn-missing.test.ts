/**
 * The Node entry on a machine whose `webgpu` package cannot load Dawn (no prebuilt dawn.node
 * for the platform, a broken install): importing the entry works, and asking for a backend
 * is BACKEND_UNAVAILABLE with the loader's message, so apps that import it for other
 * backends (crisp-bench, the CLI) still start and report WebGPU as unavailable.
 */
import { isCrispError } from '@crisp/core';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';

vi.mock('webgpu', () => {
  throw new Error("Cannot find module '.../webgpu/dist/linux-x64/dawn.node'");
});

describe('the webgpu package failing to load', () => {
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

  it('leaves the entry importable and reports BACKEND_UNAVAILABLE with the reason', async () => {
    const m = await import('./node.js');
    const a = await m.webgpuAvailability();
    expect(a.available).toBe(false);
    // (vitest wraps the factory's error in its own message; the prefix is ours)
    expect(a.reason).toMatch(/^the webgpu package \(Dawn\) failed to load: ./);
    expect(a.reason).not.toContain('\n');
    const e = await m.createNodeWebGpuBackend().then(
      () => undefined,
      (x: unknown) => x,
    );
    expect(isCrispError(e) && e.code).toBe('BACKEND_UNAVAILABLE');
  });
});
