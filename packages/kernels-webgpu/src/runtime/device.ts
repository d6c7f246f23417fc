/**
 * The device a backend runs on: requested from an adapter (its real limits, the optional
 * features it offers) or taken as given, checked against what the kernels need, and the
 * attention kernel and loop form chosen for it.
 */
import { CrispError } from '@crisp/core';
import { FMA_ATTENTION_WORKGROUP_BYTES } from '../kernels/attention/fma.js';
import { DEFAULT_SUBGROUP_MATRIX_FORM, subgroupMatrixWorkgroupBytes } from '../kernels/attention/subgroup-matrix.js';
import { type WebGpuBackendOptions, type WebGpuInfo, looksLikeDevice } from '../options.js';
import { type DeviceLimits, GpuContext } from './gpu-context.js';

/** Features this backend asks for when the adapter offers them. */
export const OPTIONAL_FEATURES = ['shader-f16', 'subgroups', 'chromium-experimental-subgroup-matrix', 'timestamp-query'] as const;

function unavailable(message: string, details?: Record<string, unknown>): CrispError {
  return new CrispError('BACKEND_UNAVAILABLE', message, details);
}

/** What the kernels need of a device's limits (checked on the adapter before a device is requested, and on a device handed in). */
function checkLimits(l: GPUSupportedLimits | DeviceLimits, of: 'adapter' | 'device'): void {
  const buffers = Number(l.maxStorageBuffersPerShaderStage);
  if (!(buffers >= 7)) {
    throw unavailable(
      `this ${of} allows ${buffers} storage buffers per shader stage; the attention kernel binds 7. Use another adapter (a GPU, or SwiftShader)`,
      { limit: 'maxStorageBuffersPerShaderStage', need: 7, got: buffers },
    );
  }
  const wg = Number(l.maxComputeWorkgroupStorageSize);
  if (!(wg >= FMA_ATTENTION_WORKGROUP_BYTES)) {
    throw unavailable(
      `this ${of} allows ${wg} bytes of workgroup memory; the attention kernel needs ${FMA_ATTENTION_WORKGROUP_BYTES}${of === 'device' ? ' (request the device with the adapter\'s limits, or pass the adapter instead)' : ''}`,
      { limit: 'maxComputeWorkgroupStorageSize', need: FMA_ATTENTION_WORKGROUP_BYTES, got: wg },
    );
  }
  const groups = Number((l as { maxComputeWorkgroupsPerDimension?: number }).maxComputeWorkgroupsPerDimension);
  if (!(groups >= 1)) {
    throw unavailable(`this ${of} reports maxComputeWorkgroupsPerDimension = ${groups}; it cannot run compute work`, {
      limit: 'maxComputeWorkgroupsPerDimension',
    });
  }
}

/** Resolves to the loss info when `device` is already lost (or is lost within a tick), else undefined. */
async function alreadyLost(device: GPUDevice): Promise<GPUDeviceLostInfo | undefined> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const tick = new Promise<undefined>((res) => {
    timer = setTimeout(() => res(undefined), 0);
  });
  try {
    return await Promise.race([Promise.resolve(device.lost).then((i) => i ?? ({ reason: 'unknown', message: '' } as GPUDeviceLostInfo)), tick]);
  } finally {
    clearTimeout(timer);
  }
}

/**
 * The context (device, limits, kernel choice) and device info for these options (checked by
 * checkOptions first). A device requested here is destroyed again when it does not qualify.
 */
export async function openDevice(opts: WebGpuBackendOptions): Promise<{ ctx: GpuContext; info: WebGpuInfo }> {
  let device = opts.device;
  let adapter = opts.adapter;
  if (device) {
    const info = await alreadyLost(device);
    if (info) {
      throw new CrispError(
        'DEVICE_LOST',
        `the device passed in is lost (${info.reason}: ${info.message || 'no message'}); request a new one (adapter.requestDevice()) or pass the adapter`,
        { reason: info.reason },
      );
    }
  } else {
    if (!adapter) {
      const gpu = opts.gpu ?? (globalThis as { navigator?: { gpu?: GPU } }).navigator?.gpu;
      if (!gpu) {
        throw unavailable(
          'no WebGPU here: navigator.gpu is undefined. In Node use createNodeWebGpuBackend from @crisp/kernels-webgpu/node; in a browser use one with WebGPU enabled',
        );
      }
      try {
        adapter = (await gpu.requestAdapter({ powerPreference: 'high-performance' })) ?? undefined;
      } catch (e) {
        throw unavailable(`requestAdapter failed: ${e instanceof Error ? e.message : String(e)}`);
      }
      if (!adapter) {
        throw unavailable(
          'no WebGPU adapter found (requestAdapter returned null): no usable GPU driver. On Linux Dawn needs a Vulkan driver (libvulkan.so.1 and an ICD; SwiftShader works: VK_ICD_FILENAMES=/usr/lib/chromium/vk_swiftshader_icd.json)',
        );
      }
    }
    const al = adapter.limits;
    checkLimits(al, 'adapter');
    const want = OPTIONAL_FEATURES.filter((f) => adapter!.features.has(f)) as GPUFeatureName[];
    const requiredLimits: Record<string, number> = {
      maxStorageBufferBindingSize: Number(al.maxStorageBufferBindingSize),
      maxBufferSize: Number(al.maxBufferSize),
      maxComputeWorkgroupStorageSize: al.maxComputeWorkgroupStorageSize,
      maxStorageBuffersPerShaderStage: al.maxStorageBuffersPerShaderStage,
      maxComputeInvocationsPerWorkgroup: al.maxComputeInvocationsPerWorkgroup,
      maxComputeWorkgroupSizeX: al.maxComputeWorkgroupSizeX,
    };
    try {
      device = await adapter.requestDevice({ requiredFeatures: want, requiredLimits, label: 'crisp' });
    } catch (e) {
      const msg = e instanceof Error ? e.message : String(e);
      const hint = /consumed/i.test(msg) ? ' (an adapter gives one device: call requestAdapter() again, or pass that device)' : '';
      throw unavailable(`the WebGPU adapter refused a device: ${msg}${hint}`);
    }
    if (!looksLikeDevice(device)) {
      throw unavailable(`the WebGPU adapter returned ${device === null ? 'null' : typeof device} instead of a device`);
    }
  }
  const ctx = new GpuContext(device);
  ctx.ownsDevice = opts.device === undefined;
  // Hold what created the device: some implementations (dawn.node) free the instance
  // when only the device refers to it.
  ctx.keepAlive.push(opts.gpu, adapter);
  try {
    checkLimits(ctx.limits, 'device');
  } catch (e) {
    ctx.destroy();
    throw e;
  }
  // (a device handed in without its adapter still names it: GPUDevice.adapterInfo)
  const adapterInfo = adapter?.info ?? (device as { adapterInfo?: GPUAdapterInfo }).adapterInfo;
  const ai = adapterInfo as unknown as
    | { subgroupMinSize?: number; subgroupMaxSize?: number; subgroupMatrixConfigs?: Iterable<Record<string, unknown>> }
    | undefined;
  const kernel = opts.attentionKernel ?? 'subgroup-matrix';
  const smm =
    device.features.has('shader-f16') &&
    device.features.has('subgroups') &&
    device.features.has('chromium-experimental-subgroup-matrix') &&
    ai?.subgroupMinSize === 32 &&
    ai?.subgroupMaxSize === 32 &&
    [...(ai?.subgroupMatrixConfigs ?? [])].some(
      (c) => c.componentType === 'f16' && c.resultComponentType === 'f32' && c.M === 16 && c.N === 16 && c.K === 16,
    );
  ctx.subgroupMatrixForm = opts.subgroupMatrixForm ?? DEFAULT_SUBGROUP_MATRIX_FORM;
  ctx.subgroupMatrix =
    smm && kernel === 'subgroup-matrix' && ctx.limits.maxComputeWorkgroupStorageSize >= subgroupMatrixWorkgroupBytes(ctx.subgroupMatrixForm, 128);
  const cpu =
    /swiftshader|llvmpipe|lavapipe/i.test(`${adapterInfo?.architecture ?? ''} ${adapterInfo?.description ?? ''}`) ||
    Boolean((adapterInfo as { isFallbackAdapter?: boolean } | undefined)?.isFallbackAdapter);
  ctx.compact = opts.compactKernels ?? cpu;
  const info: WebGpuInfo = {
    vendor: adapterInfo?.vendor ?? '',
    architecture: adapterInfo?.architecture ?? '',
    description: adapterInfo?.description ?? '',
    features: [...device.features].map(String).sort(),
    limits: ctx.limits,
  };
  return { ctx, info };
}
