import { existsSync } from 'node:fs';
import { mergeConfig } from 'vitest/config';
import { crispVitest } from '../../tooling/vitest.preset';

// WebGPU on a CPU machine: Dawn over SwiftShader's Vulkan from Debian's chromium package.
// Workers are forked, so what is set here reaches them before Dawn loads.
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

// Files one after another (each starts TF.js on its own backend: cpu or webgpu over Dawn),
// so two SwiftShader devices never share the CI machine's two cores.
export default mergeConfig(crispVitest, { test: { fileParallelism: false } });
