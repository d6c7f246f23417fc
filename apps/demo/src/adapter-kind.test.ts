import { describe, expect, it } from 'vitest';
import { cpuAdapterName, cpuSecondsEstimate, slowRunWarning } from './adapter-kind.js';
import { DEFAULT_CONFIG } from './run-demo.js';

describe('CPU adapters', () => {
  it('names SwiftShader, llvmpipe and fallback adapters, and no hardware GPU', () => {
    // what Chromium reports for SwiftShader, and for a hardware GPU
    expect(cpuAdapterName({ vendor: 'google', architecture: 'swiftshader', description: '' })).toBe('SwiftShader');
    expect(cpuAdapterName({ vendor: 'mesa', description: 'llvmpipe (LLVM 15.0.6, 256 bits)' })).toBe('llvmpipe');
    expect(cpuAdapterName({ vendor: 'microsoft', description: 'Microsoft Basic Render Driver' })).toBe('Basic Render');
    expect(cpuAdapterName({ vendor: '', architecture: '', isFallbackAdapter: true })).toBe('a fallback (software) adapter');
    expect(cpuAdapterName({ vendor: 'nvidia', architecture: 'hopper', description: 'NVIDIA H200', isFallbackAdapter: false })).toBeNull();
    expect(cpuAdapterName({ vendor: 'apple', architecture: 'metal-3' })).toBeNull();
  });

  it('warns before a size that takes minutes there, never on a GPU', () => {
    // a small run stays under the threshold; the default (n = 4096, H = 8, d = 64, 3 runs
    // after a warm-up) is about 3 minutes there: 30 s + (1.6 + 3 · 2.2) · 2 · 4096² · 8 · 64 / 1e9 s
    const small = { ...DEFAULT_CONFIG, n: 2048, heads: 4 };
    expect(cpuSecondsEstimate(small)).toBeLessThan(90);
    expect(slowRunWarning('SwiftShader', small)).toBeNull();
    expect(cpuSecondsEstimate(DEFAULT_CONFIG)).toBeCloseTo(30 + ((1.6 + 3 * 2.2) * 2 * 4096 ** 2 * 8 * 64) / 1e9, 6);
    expect(slowRunWarning('SwiftShader', DEFAULT_CONFIG)).toBe(
      'This size will take about 3 minutes on SwiftShader (n = 4096, H = 8, d = 64, 4 runs of dense and of sparse): try n = 2048 first.',
    );
    const big = { ...DEFAULT_CONFIG, n: 16384 };
    expect(slowRunWarning(null, big)).toBeNull();
  });
});
