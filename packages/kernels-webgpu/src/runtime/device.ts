/**
 * The device a backend runs on: requested from an adapter (its real limits, the optional
 * features it offers) or taken as given, checked against what the kernels need, and the
 * attention kernel and loop form chosen for it.
 */
import { CrispError, InvalidArgumentError } from '@crisp/core';
import { FMA_ATTENTION_WORKGROUP_BYTES } from '../kernels/attention/fma.js';
import { SUBGROUP_MATRIX_WORKGROUP_BYTES } from '../kernels/attention/subgroup-matrix.js';
import { ATTENTION_KERNELS, type WebGpuBackendOptions, type WebGpuInfo } from '../options.js';
import { GpuContext } from './gpu-context.js';

/** Features this backend asks for when the adapter offers them. */
export const OPTIONAL_FEATURES = ['shader-f16', 'subgroups', 'chromium-experimental-subgroup-matrix'] as const;

function unavailable(message: string, details?: Record<string, unknown>): CrispError {
  return new CrispError('BACKEND_UNAVAILABLE', message, details);
}

/** The context (device, limits, kernel choice) and device info for these options. */
export async function openDevice(opts: WebGpuBackendOptions): Promise<{ ctx: GpuContext; info: WebGpuInfo }> {
  let device = opts.device;
  let adapter = opts.adapter;
  if (!device) {
    if (!adapter) {
      const gpu = opts.gpu ?? (globalThis as { navigator?: { gpu?: GPU } }).navigator?.gpu;
      if (!gpu) {
        throw unavailable(
          'no WebGPU here: navigator.gpu is undefined. In Node use createNodeWebGpuBackend from @crisp/kernels-webgpu/node; in a browser use one with WebGPU enabled',
        );
      }
      adapter = (await gpu.requestAdapter({ powerPreference: 'high-performance' })) ?? undefined;
      if (!adapter) {
        throw unavailable(
          'no WebGPU adapter found (requestAdapter returned null): no usable GPU driver. On Linux Dawn needs a Vulkan driver (libvulkan.so.1 and an ICD; SwiftShader works: VK_ICD_FILENAMES=/usr/lib/chromium/vk_swiftshader_icd.json)',
        );
      }
    }
    const want = OPTIONAL_FEATURES.filter((f) => adapter!.features.has(f)) as GPUFeatureName[];
    const al = adapter.limits;
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
      throw unavailable(`the WebGPU adapter refused a device: ${e instanceof Error ? e.message : String(e)}`);
    }
  }
  const ctx = new GpuContext(device);
  ctx.ownsDevice = opts.device === undefined;
  // Hold what created the device: some implementations (dawn.node) free the instance
  // when only the device refers to it.
  ctx.keepAlive.push(opts.gpu, adapter);
  if (ctx.limits.maxStorageBuffersPerShaderStage < 7) {
    throw unavailable(
      `this device allows ${ctx.limits.maxStorageBuffersPerShaderStage} storage buffers per shader stage; the attention kernel binds 7`,
      { limit: 'maxStorageBuffersPerShaderStage' },
    );
  }
  if (ctx.limits.maxComputeWorkgroupStorageSize < FMA_ATTENTION_WORKGROUP_BYTES) {
    throw unavailable(
      `this device allows ${ctx.limits.maxComputeWorkgroupStorageSize} bytes of workgroup memory; the attention kernel needs ${FMA_ATTENTION_WORKGROUP_BYTES} (request the adapter's limit)`,
      { limit: 'maxComputeWorkgroupStorageSize' },
    );
  }
  const adapterInfo = adapter?.info;
  const ai = adapterInfo as unknown as
    | { subgroupMinSize?: number; subgroupMaxSize?: number; subgroupMatrixConfigs?: Iterable<Record<string, unknown>> }
    | undefined;
  const kernel = opts.attentionKernel ?? 'fma';
  if (!ATTENTION_KERNELS.includes(kernel)) {
    throw new InvalidArgumentError(`attentionKernel must be one of ${ATTENTION_KERNELS.join(', ')}; got ${String(kernel)}`);
  }
  const smm =
    device.features.has('shader-f16') &&
    device.features.has('subgroups') &&
    device.features.has('chromium-experimental-subgroup-matrix') &&
    ai?.subgroupMinSize === 32 &&
    ai?.subgroupMaxSize === 32 &&
    [...(ai?.subgroupMatrixConfigs ?? [])].some(
      (c) => c.componentType === 'f16' && c.resultComponentType === 'f32' && c.M === 16 && c.N === 16 && c.K === 16,
    );
  ctx.subgroupMatrix =
    smm && kernel === 'subgroup-matrix' && ctx.limits.maxComputeWorkgroupStorageSize >= SUBGROUP_MATRIX_WORKGROUP_BYTES;
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
