// Shared vitest settings: resolve workspace packages to their TypeScript sources
// (the "@crisp/source" export condition), so tests never run against a stale build.
import { existsSync } from 'node:fs';
import { defineConfig } from 'vitest/config';

export const crispVitest = defineConfig({
  resolve: { conditions: ['@crisp/source'] },
  ssr: { resolve: { conditions: ['@crisp/source'] } },
  test: {
    include: ['src/**/*.test.ts', 'test/**/*.test.ts'],
    // Hang guards, not speed checks: CI runs every package's suite at once on 2 cores, where
    // a SwiftShader test that takes 8 s alone has taken 88 s (its first shader compiles).
    testTimeout: 300_000,
    hookTimeout: 300_000,
    pool: 'forks',
    passWithNoTests: true,
    // WebGPU buffers handed out again are filled with 0xff bytes first, so a kernel that
    // reads what it did not write fails the tests instead of passing on a fresh buffer's zeros
    env: { CRISP_WEBGPU_POISON_REUSED: '1' },
  },
});

/**
 * WebGPU on a CPU machine: Dawn over SwiftShader's Vulkan from Debian's chromium package
 * (the ICD file, and chromium's libvulkan where the system has none). Call it from a vitest
 * config: workers are forked, so what is set here reaches them before Dawn loads.
 */
export function useSwiftShaderVulkan(): void {
  const chromium = '/usr/lib/chromium';
  if (!process.env.VK_ICD_FILENAMES && existsSync(`${chromium}/vk_swiftshader_icd.json`)) {
    process.env.VK_ICD_FILENAMES = `${chromium}/vk_swiftshader_icd.json`;
  }
  const hasSystemVulkan = ['/usr/lib/x86_64-linux-gnu/libvulkan.so.1', '/usr/lib64/libvulkan.so.1', '/usr/lib/libvulkan.so.1'].some(
    (p) => existsSync(p),
  );
  if (!hasSystemVulkan && existsSync(`${chromium}/libvulkan.so.1`)) {
    const cur = process.env.LD_LIBRARY_PATH;
    if (!cur?.split(':').includes(chromium)) process.env.LD_LIBRARY_PATH = cur ? `${chromium}:${cur}` : chromium;
  }
}
