import { probeCuda } from './runtime/ffi.js';

let memo: { available: boolean; reason?: string } | undefined;

/**
 * Cheap probe: is a CUDA driver with a device, and NVRTC, loadable here? Never throws;
 * `reason` says what is missing. The answer is computed once per process.
 */
export function cudaAvailability(): { available: boolean; reason?: string } {
  if (!memo) memo = probeCuda();
  return memo;
}
