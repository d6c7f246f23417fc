/**
 * Entry of the single-file bundle (dist/crisp-bench.mjs). On a Linux machine without a
 * system Vulkan loader, Dawn needs Chromium's libvulkan on LD_LIBRARY_PATH, which the
 * dynamic loader reads only at process start: re-run this process once with it set.
 */
import { spawnSync } from 'node:child_process';
import { existsSync, readdirSync } from 'node:fs';
import { main } from './main.js';
import { serveSynthChunks, setSynthWorkerEntry } from '@crisp/synth/node';

const CHROMIUM = '/usr/lib/chromium';

function vulkanEnv(): NodeJS.ProcessEnv | undefined {
  if (process.platform !== 'linux' || process.env.CRISP_BENCH_REEXEC) return undefined;
  const systemLoader = ['/usr/lib/x86_64-linux-gnu/libvulkan.so.1', '/usr/lib64/libvulkan.so.1', '/usr/lib/libvulkan.so.1'].some((p) => existsSync(p));
  const env: NodeJS.ProcessEnv = { ...process.env, CRISP_BENCH_REEXEC: '1' };
  let changed = false;
  if (!systemLoader && existsSync(`${CHROMIUM}/libvulkan.so.1`) && !process.env.LD_LIBRARY_PATH?.split(':').includes(CHROMIUM)) {
    env.LD_LIBRARY_PATH = process.env.LD_LIBRARY_PATH ? `${CHROMIUM}:${process.env.LD_LIBRARY_PATH}` : CHROMIUM;
    changed = true;
  }
  // No Vulkan driver installed at all: SwiftShader (CPU) from Chromium, if present.
  const icdDirs = ['/usr/share/vulkan/icd.d', '/etc/vulkan/icd.d'];
  const hasIcd = icdDirs.some((d) => existsSync(d) && readdirSync(d).some((f) => f.endsWith('.json')));
  if (!process.env.VK_ICD_FILENAMES && !process.env.VK_DRIVER_FILES && !hasIcd && existsSync(`${CHROMIUM}/vk_swiftshader_icd.json`)) {
    env.VK_ICD_FILENAMES = `${CHROMIUM}/vk_swiftshader_icd.json`;
    changed = true;
  }
  return changed ? env : undefined;
}

/** The bench itself: re-run with the Vulkan environment when needed, else run main. */
function start(): void {
  const env = vulkanEnv();
  if (env) {
    // (with Node's own options, e.g. --max-old-space-size, which process.argv leaves out)
    const r = spawnSync(process.execPath, [...process.execArgv, ...process.argv.slice(1)], { env, stdio: 'inherit' });
    process.exitCode = r.status ?? 1;
    return;
  }
  main(process.argv).then(
    (code) => {
      process.exitCode = code;
    },
    (err) => {
      process.stderr.write(`crisp-bench: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
      process.exitCode = 1;
    },
  );
}

// In a synth worker thread (@crisp/synth/node) this file serves scenario chunks and nothing else;
// the workers run this same file.
if (!serveSynthChunks()) {
  setSynthWorkerEntry(new URL(import.meta.url));
  start();
}
