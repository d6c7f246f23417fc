/**
 * The Node entry's Vulkan-loader check: Dawn is not started (and prints nothing) when
 * libvulkan.so.1 is on no library path; the reason comes back as BACKEND_UNAVAILABLE.
 */
import { describe, expect, it } from 'vitest';
import { findVulkanLoader } from './node.js';

describe.skipIf(process.platform !== 'linux')('findVulkanLoader (Linux)', () => {
  const only = (path: string) => (p: string) => p === path;
  it('finds the loader through LD_LIBRARY_PATH, ld.so.conf directories or the standard ones', () => {
    expect(findVulkanLoader({ LD_LIBRARY_PATH: '/opt/a:/usr/lib/chromium/' }, only('/usr/lib/chromium/libvulkan.so.1'), () => [])).toBe(
      '/usr/lib/chromium/libvulkan.so.1',
    );
    expect(findVulkanLoader({}, only('/opt/vk/lib/libvulkan.so.1'), () => ['/opt/vk/lib'])).toBe('/opt/vk/lib/libvulkan.so.1');
    expect(findVulkanLoader({}, only('/usr/lib/x86_64-linux-gnu/libvulkan.so.1'), () => [])).toBe('/usr/lib/x86_64-linux-gnu/libvulkan.so.1');
  });
  it('is undefined when no directory holds it', () => {
    expect(findVulkanLoader({ LD_LIBRARY_PATH: '/opt/a' }, () => false, () => ['/opt/b'])).toBeUndefined();
  });
});
