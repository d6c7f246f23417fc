/// <reference types="@webgpu/types" preserve="true" />
/**
 * Node entry: Dawn through the `webgpu` npm package. The main entry stays free of Node
 * imports so browsers can bundle it; this one is for Node only.
 *
 * Dawn's default toggles hide `shader-f16` and subgroup matrices on NVIDIA's Vulkan driver;
 * DEFAULT_DAWN_FLAGS turns them on (`allow_unsafe_apis` is what exposes the experimental
 * `chromium-experimental-subgroup-matrix` feature), and turn off the quantization of GPU
 * timestamps (`timestamp_quantization`), so WebGpuBackend.profile times short kernels to the
 * microsecond. Pass `flags: []` for Dawn's defaults.
 *
 * @module @crisp/kernels-webgpu/node
 */
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { CrispError, InvalidArgumentError } from '@crisp/core';
import { type WebGpuBackend, createWebGpuBackend } from './backend.js';
import { type WebGpuBackendOptions, checkOptions } from './options.js';
import { applyDawnWait, DAWN_WAITS, type DawnWait } from './runtime/dawn-wait.js';

export const DEFAULT_DAWN_FLAGS: readonly string[] = ['enable-dawn-features=allow_unsafe_apis,vulkan_enable_f16_on_nvidia', 'disable-dawn-features=timestamp_quantization'];

export interface NodeWebGpuOptions extends Omit<WebGpuBackendOptions, 'gpu' | 'adapter' | 'device'> {
  /** Dawn flags for `create()`; default DEFAULT_DAWN_FLAGS */
  readonly flags?: readonly string[];
  /**
   * How Dawn waits for the GPU: `spin` (dawn.node's own polling, a core busy while the GPU
   * works), `yield` (its polling from a 1 ms timer; process-wide once set, see
   * yieldDawnWaits), `auto` (default: yield on a CPU adapter such as SwiftShader, where the
   * spinning core is one the shaders need, spin on a GPU).
   */
  readonly dawnWait?: DawnWait;
}

export interface WebGpuAvailability {
  readonly available: boolean;
  /** why not, when not */
  readonly reason?: string;
  readonly adapter?: { vendor: string; architecture: string; description: string };
  readonly features?: readonly string[];
}

/**
 * The `webgpu` package (Dawn for Node, about 130 MB installed) is an optional peer dependency:
 * browser users never need it, so installing this package does not pull it in. The version is
 * the one this package's peerDependencies name (a test holds the two equal).
 */
export const DAWN_PACKAGE = 'webgpu@0.6.2';
const DAWN_MISSING = `@crisp/kernels-webgpu/node runs on Dawn from the webgpu package, an optional peer dependency that is not installed here: install it with \`npm i ${DAWN_PACKAGE}\` (browsers need no webgpu package: use createWebGpuBackend from @crisp/kernels-webgpu)`;

/**
 * Whether `e` (or an error it wraps as `cause`, as bundlers and test runners do) is the module
 * loader's "not found" for the package `name` itself, not for a file inside it.
 */
function isMissingPackage(e: unknown, name: string): boolean {
  for (let x = e, depth = 0; x instanceof Error && depth < 4; x = x.cause, depth++) {
    const code = (x as { code?: unknown }).code;
    if (code !== 'ERR_MODULE_NOT_FOUND' && code !== 'MODULE_NOT_FOUND') continue;
    const first = x.message.split('\n')[0];
    if (first.startsWith(`Cannot find package '${name}'`) || first.startsWith(`Cannot find module '${name}'`)) return true;
  }
  return false;
}

const SWIFTSHADER_ICD = '/usr/lib/chromium/vk_swiftshader_icd.json';

function explainMissingAdapter(): string {
  const hints: string[] = [];
  if (process.platform === 'linux') {
    if (!process.env.VK_ICD_FILENAMES && !process.env.VK_DRIVER_FILES) {
      hints.push(
        existsSync(SWIFTSHADER_ICD)
          ? `no Vulkan ICD chosen: set VK_ICD_FILENAMES=${SWIFTSHADER_ICD} for SwiftShader (CPU)`
          : 'no Vulkan driver chosen: install a Vulkan driver, or Debian chromium for SwiftShader and set VK_ICD_FILENAMES=/usr/lib/chromium/vk_swiftshader_icd.json',
      );
    }
    // Reached without a loader only under CRISP_WEBGPU_SKIP_LOADER_CHECK (nodeAdapter checks first).
    if (findVulkanLoader() === undefined) {
      hints.push('Dawn needs libvulkan.so.1 on the library path and a Vulkan driver (package libvulkan1 and a GPU driver; or, for the SwiftShader CPU device of Debian\'s chromium, LD_LIBRARY_PATH=/usr/lib/chromium VK_ICD_FILENAMES=/usr/lib/chromium/vk_swiftshader_icd.json)');
    }
  }
  return `Dawn found no WebGPU adapter${hints.length ? `: ${hints.join('; ')}` : ''}`;
}

/**
 * Every Dawn instance made here stays referenced for the life of the process: when the GPU
 * object from create() was only reachable through its adapter and device, dawn.node 0.6.2
 * crashed in InstanceBase::ProcessEvents after the main thread blocked for ~100 ms (seen on
 * SwiftShader and on the null backend). A few instances per process cost nothing.
 */
const instances: GPU[] = [];

const LOADER = 'libvulkan.so.1';
const STANDARD_LIB_DIRS = [
  '/lib',
  '/usr/lib',
  '/lib64',
  '/usr/lib64',
  '/lib/x86_64-linux-gnu',
  '/usr/lib/x86_64-linux-gnu',
  '/lib/aarch64-linux-gnu',
  '/usr/lib/aarch64-linux-gnu',
];

/**
 * Where the dynamic loader would find libvulkan.so.1 (Linux): LD_LIBRARY_PATH, the
 * ld.so.conf directories, the standard ones. Undefined when nowhere: Dawn would then print
 * its own "Couldn't load Vulkan" warning to stderr and find no adapter, so the Node entry
 * says why instead and does not start Dawn. Other platforms: not checked ('').
 */
export function findVulkanLoader(
  env: Record<string, string | undefined> = process.env,
  exists: (path: string) => boolean = existsSync,
  confDirs: () => string[] = ldSoConfDirs,
): string | undefined {
  if (process.platform !== 'linux') return '';
  const dirs = [...(env.LD_LIBRARY_PATH ?? '').split(':').filter(Boolean), ...confDirs(), ...STANDARD_LIB_DIRS];
  return dirs.map((d) => `${d.replace(/\/+$/, '')}/${LOADER}`).find((p) => exists(p));
}

function ldSoConfDirs(): string[] {
  const out: string[] = [];
  const readConf = (file: string) => {
    try {
      for (const line of readFileSync(file, 'utf8').split('\n')) {
        const t = line.replace(/#.*/, '').trim();
        if (t.startsWith('/')) out.push(t);
      }
    } catch {
      // unreadable or absent: nothing from it
    }
  };
  readConf('/etc/ld.so.conf');
  try {
    for (const f of readdirSync('/etc/ld.so.conf.d')) if (f.endsWith('.conf')) readConf(`/etc/ld.so.conf.d/${f}`);
  } catch {
    // no ld.so.conf.d
  }
  return out;
}

async function nodeAdapter(flags: readonly string[], wait: DawnWait = 'auto'): Promise<GPUAdapter> {
  if (findVulkanLoader() === undefined && !process.env.CRISP_WEBGPU_SKIP_LOADER_CHECK) {
    throw new CrispError(
      'BACKEND_UNAVAILABLE',
      `Dawn needs the Vulkan loader ${LOADER} and it is on no library path here (install libvulkan1 and a GPU's Vulkan driver; or, where Debian's chromium is installed, use its loader and SwiftShader CPU device: LD_LIBRARY_PATH=/usr/lib/chromium VK_ICD_FILENAMES=/usr/lib/chromium/vk_swiftshader_icd.json; CRISP_WEBGPU_SKIP_LOADER_CHECK=1 tries Dawn anyway)`,
    );
  }
  let gpu: GPU;
  try {
    // loaded here, not at import: a missing or broken Dawn binary (a platform without a
    // prebuilt dawn.node) is then this typed error, and an app that imports this entry for
    // its other backends still starts
    const { create } = await import('webgpu');
    gpu = create([...flags]);
  } catch (e) {
    if (isMissingPackage(e, 'webgpu')) throw new CrispError('BACKEND_UNAVAILABLE', DAWN_MISSING);
    // (the first line: Node's module-not-found message goes on with the require stack)
    throw new CrispError('BACKEND_UNAVAILABLE', `the webgpu package (Dawn) failed to load: ${(e instanceof Error ? e.message : String(e)).split('\n')[0]}`);
  }
  instances.push(gpu);
  (globalThis as { __crispDawnInstances?: GPU[] }).__crispDawnInstances = instances;
  let adapter: GPUAdapter | null;
  try {
    adapter = await gpu.requestAdapter({ powerPreference: 'high-performance' });
  } catch (e) {
    throw new CrispError('BACKEND_UNAVAILABLE', `Dawn's requestAdapter failed: ${e instanceof Error ? e.message : String(e)}`);
  }
  if (!adapter) throw new CrispError('BACKEND_UNAVAILABLE', explainMissingAdapter());
  applyDawnWait(wait, adapter);
  return adapter;
}

/** A WebGPU backend on Dawn in Node. BACKEND_UNAVAILABLE (with the reason) when no adapter. */
export async function createNodeWebGpuBackend(opts: NodeWebGpuOptions = {}): Promise<WebGpuBackend> {
  checkNodeOptions(opts, 'createNodeWebGpuBackend');
  const { flags, dawnWait, ...rest } = opts;
  const adapter = await nodeAdapter(flags ?? DEFAULT_DAWN_FLAGS, dawnWait);
  return createWebGpuBackend({ ...rest, adapter, gpu: instances[instances.length - 1] });
}

/** The Node entry's options, checked before Dawn starts (INVALID_ARGUMENT naming the option). */
function checkNodeOptions(opts: unknown, entry: string): asserts opts is NodeWebGpuOptions {
  if (opts !== null && typeof opts === 'object') {
    for (const key of ['device', 'adapter', 'gpu']) {
      if ((opts as Record<string, unknown>)[key] !== undefined) {
        throw new InvalidArgumentError(
          `${entry} makes its own Dawn ${key}; to use a ${key} of your own call createWebGpuBackend({ ${key} }) instead`,
        );
      }
    }
  }
  checkOptions(opts, entry, ['flags', 'dawnWait']);
  checkFlags((opts as NodeWebGpuOptions).flags);
  const wait = (opts as NodeWebGpuOptions).dawnWait;
  if (wait !== undefined && !DAWN_WAITS.includes(wait)) {
    throw new InvalidArgumentError(`dawnWait must be one of ${DAWN_WAITS.join(', ')}; got ${JSON.stringify(wait) ?? String(wait)}`);
  }
}

function checkFlags(flags: unknown): void {
  if (flags === undefined) return;
  if (!Array.isArray(flags) || flags.some((f) => typeof f !== 'string' || !/^[^=]+=/.test(f))) {
    throw new InvalidArgumentError(
      `flags must be an array of Dawn 'key=value' flag strings such as 'enable-dawn-features=allow_unsafe_apis' ([] for Dawn's defaults); got ${JSON.stringify(flags) ?? String(flags)}`,
    );
  }
}

/** Whether Dawn finds an adapter here, and if not, why (for skipping tests with a reason). */
export async function webgpuAvailability(flags: readonly string[] = DEFAULT_DAWN_FLAGS): Promise<WebGpuAvailability> {
  checkFlags(flags);
  try {
    const a = await nodeAdapter(flags);
    return {
      available: true,
      adapter: { vendor: a.info.vendor, architecture: a.info.architecture, description: a.info.description },
      features: [...a.features].map(String).sort(),
    };
  } catch (e) {
    return { available: false, reason: e instanceof Error ? e.message : String(e) };
  }
}

export { createWebGpuBackend, type WebGpuBackend } from './backend.js';
export { type DawnWait, dawnWaitsYield, isCpuAdapter, yieldDawnWaits } from './runtime/dawn-wait.js';
