import type { Backend } from '@crisp/core';
import { createWebGpuBackend } from '@crisp/kernels-webgpu';
import { createNodeWebGpuBackend, webgpuAvailability } from '@crisp/kernels-webgpu/node';
import { createReferenceBackend } from '@crisp/reference';
import { describe, expect, it } from 'vitest';
import type { OpenBackend } from './backends.js';
import { defaultConfig } from './config.js';
import type { SuiteContext } from './context.js';
import { resolveConfig } from './main.js';
import { densePeers, sdpaPeerArgs, webgpuFmaPeer } from './peers.js';

// A backend no peer may touch: any call is a test failure.
const untouchable = new Proxy({} as Backend, {
  get: (_t, p) => {
    throw new Error(`the peers touched the backend (${String(p)})`);
  },
});
const opened: OpenBackend[] = [
  { name: 'cuda', backend: untouchable },
  { name: 'webgpu', backend: untouchable },
];
const ctx = (timeLeftMs?: number, peers?: SuiteContext['config']['latency']['peers']): SuiteContext => ({
  config: peers === undefined ? defaultConfig('smoke') : { ...defaultConfig('smoke'), latency: { ...defaultConfig('smoke').latency, peers } },
  command: 'crisp-bench (test)',
  log: () => {},
  ...(timeLeftMs === undefined ? {} : { timeLeftMs: () => timeLeftMs }),
});

describe('densePeers', () => {
  it('starts no peer when no size had the dense kernel timed, and says why', async () => {
    // e.g. `--presets crisp`: the SDPA peers were once reported "failed" there, with no reason
    const r = await densePeers(ctx(), opened, new Map(), 'apps/bench/peers/sdpa_peer.py');
    expect(r.rows).toEqual([]);
    expect(r.notes.map((x) => [x.backend, x.peer, x.status])).toEqual([
      ['cuda', 'torch-sdpa-flash', 'absent'],
      ['cuda', 'torch-sdpa-cudnn', 'absent'],
      ['webgpu', 'webgpu-fma', 'absent'],
      ['webgpu', 'tfjs-webgpu', 'absent'],
      ['webgpu', 'ort-web-webgpu', 'absent'],
    ]);
    for (const x of r.notes) expect(x.detail).toMatch(/no size had CRISP's dense kernel timed on (cuda|webgpu).*add dense to --presets/);
  });

  it('starts no peer when the deadline leaves under 5 s', async () => {
    const measured = new Map([
      ['cuda', [131072]],
      ['webgpu', [4096]],
    ]);
    const r = await densePeers(ctx(2_000), opened, measured, 'apps/bench/peers/sdpa_peer.py');
    expect(r.notes).toHaveLength(5);
    for (const x of r.notes) {
      expect(x.status).toBe('absent');
      expect(x.detail).toBe('not run: 2 s left before --deadline-s');
    }
  });

  it('starts only the peers --peers names, and notes the others as left out', async () => {
    const measured = new Map([
      ['cuda', [131072]],
      ['webgpu', [4096]],
    ]);
    // none: nothing starts (the backends throw if touched, and no SDPA script is given)
    const none = await densePeers(ctx(undefined, []), opened, measured, undefined);
    expect(none.rows).toEqual([]);
    expect(none.notes.map((x) => [x.peer, x.status, x.detail])).toEqual(
      ['torch-sdpa-flash', 'torch-sdpa-cudnn', 'webgpu-fma', 'tfjs-webgpu', 'ort-web-webgpu'].map((p) => [p, 'absent', 'not run: not in --peers']),
    );
    // a subset: the chosen one gets its own verdict (here the deadline), the rest are left out
    const some = await densePeers(ctx(2_000, ['ort-web-webgpu']), opened, measured, undefined);
    expect(some.notes.map((x) => [x.peer, x.detail])).toEqual([
      ['torch-sdpa-flash', 'not run: not in --peers'],
      ['torch-sdpa-cudnn', 'not run: not in --peers'],
      ['webgpu-fma', 'not run: not in --peers'],
      ['tfjs-webgpu', 'not run: not in --peers'],
      ['ort-web-webgpu', 'not run: 2 s left before --deadline-s'],
    ]);
  });

  it('reads --peers as a list of known peers or none, and refuses an unknown one', () => {
    expect(resolveConfig({}).latency.peers).toBeUndefined();
    expect(resolveConfig({ peers: 'none' }).latency.peers).toEqual([]);
    expect(resolveConfig({ peers: 'webgpu-fma,ort-web-webgpu' }).latency.peers).toEqual(['webgpu-fma', 'ort-web-webgpu']);
    expect(() => resolveConfig({ peers: 'webgpu-fma,flash' })).toThrow(/unknown peer 'flash'; use torch-sdpa-flash/);
  });

  it('names the missing peer script', async () => {
    const r = await densePeers(ctx(), [opened[0]], new Map([['cuda', [131072]]]), undefined);
    expect(r.notes.map((x) => x.detail)).toEqual([
      'peer script apps/bench/peers/sdpa_peer.py not found (pass --peer-script)',
      'peer script apps/bench/peers/sdpa_peer.py not found (pass --peer-script)',
    ]);
  });
});

describe('the WebGPU FMA-kernel peer, on stand-in backends (the reference)', () => {
  it('times the second backend on the same inputs (its rows equal the first backend\'s) and disposes it; a size past the time budget is recorded in the note', async () => {
    const b = createReferenceBackend();
    let disposed = 0;
    const r = await webgpuFmaPeer(ctx(), b, [192, 100_000_000], { heads: 2, kvHeads: 1, headDim: 64 }, 3, 1, 20, 120_000, {
      force: true,
      open: async () => {
        const fb = createReferenceBackend();
        const dispose = fb.dispose.bind(fb);
        return Object.assign(fb, {
          dispose: () => {
            disposed++;
            dispose();
          },
        });
      },
    });
    expect(r.rows.map((x) => [x.backend, x.peer, x.n])).toEqual([['webgpu', 'webgpu-fma', 192]]);
    expect(r.rows[0].ms.runs).toBe(3);
    expect(r.rows[0].ms.median).toBeGreaterThan(0);
    expect(r.rows[0].tflops).toBeGreaterThan(0);
    // the same arithmetic on the same inputs: the same output bits
    expect(r.rows[0].relErrVsCrispDense).toBe(0);
    expect(r.notes).toHaveLength(1);
    expect(r.notes[0].status).toBe('ran');
    // the size projected past the budget is in the note, by its n
    expect(r.notes[0].detail).toMatch(/n=100000000: time budget/);
    expect(disposed).toBe(1);
    b.dispose();
  });
});

const gpu = await webgpuAvailability();
describe.skipIf(!gpu.available)(`the WebGPU FMA-kernel peer${gpu.available ? '' : ` (skipped: ${gpu.reason})`}`, () => {
  const shape = { heads: 2, kvHeads: 1, headDim: 64 };
  it("is absent, with the reason, where the backend's kernel is 'fma' already, and touches no second device", async () => {
    const b = await createNodeWebGpuBackend({ attentionKernel: 'fma' });
    let opened = 0;
    try {
      const r = await webgpuFmaPeer(ctx(), b, [256], shape, 3, 1, 0, 60_000, {
        open: async () => {
          opened++;
          return b;
        },
      });
      expect(r.rows).toEqual([]);
      expect(r.notes).toEqual([{ backend: 'webgpu', peer: 'webgpu-fma', status: 'absent', detail: expect.stringMatching(/attention kernel is 'fma' already/) }]);
      expect(opened).toBe(0);
    } finally {
      b.dispose();
    }
  });

  it('times the FMA kernel on a second backend, on the same inputs (its rows equal the first backend\'s), and disposes it', async () => {
    const b = await createNodeWebGpuBackend({ attentionKernel: 'fma' });
    let second: { dispose(): void; disposed?: boolean } | undefined;
    try {
      const r = await webgpuFmaPeer(ctx(), b, [256], shape, 3, 1, 50, 120_000, {
        force: true,
        // (the second backend on the first one's device: Dawn hands it the pipelines compiled
        // for the first, where a device of its own compiled the FMA kernel again, seconds on a
        // CPU adapter; disposing a backend leaves a device it was handed alive)
        open: async () => {
          const fb = await createWebGpuBackend({ device: b.gpu.device, attentionKernel: 'fma' });
          const dispose = fb.dispose.bind(fb);
          second = Object.assign(fb, {
            dispose: () => {
              second!.disposed = true;
              dispose();
            },
          });
          return fb;
        },
      });
      expect(r.notes[0].status).toBe('ran');
      expect(r.rows.map((x) => x.n)).toEqual([256]);
      for (const row of r.rows) {
        expect(row.backend).toBe('webgpu');
        expect(row.peer).toBe('webgpu-fma');
        expect(row.ms.median).toBeGreaterThan(0);
        expect(row.tflops).toBeGreaterThan(0);
        // the same kernel on the same inputs: the same output bits
        expect(row.relErrVsCrispDense).toBe(0);
      }
      expect(second?.disposed).toBe(true);
    } finally {
      b.dispose();
    }
  });
});

describe('sdpaPeerArgs', () => {
  it('warms the SDPA peer up as the latency suite warms up CRISP\'s kernels', () => {
    const l = resolveConfig({}).latency;
    const args = sdpaPeerArgs('peer.py', 'm.json', 'o.json', l.reps, 240, l.warmup, l.gpuWarmMs ?? 0);
    const flag = (name: string) => args[args.indexOf(name) + 1];
    expect(args[0]).toBe('peer.py');
    expect(flag('--warmup')).toBe(String(l.warmup));
    expect(flag('--warm-ms')).toBe('500');
    // one more run than asked: the script drops one at n >= 256k
    expect(flag('--reps')).toBe(String(l.reps + 1));
    expect(flag('--budget')).toBe('240');
    expect(flag('--manifest')).toBe('m.json');
    expect(flag('--out')).toBe('o.json');
  });
});
