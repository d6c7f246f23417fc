import type { Backend } from '@crisp/core';
import { describe, expect, it } from 'vitest';
import type { OpenBackend } from './backends.js';
import { defaultConfig } from './config.js';
import type { SuiteContext } from './context.js';
import { densePeers } from './peers.js';

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
const ctx = (timeLeftMs?: number): SuiteContext => ({
  config: defaultConfig('smoke'),
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
    expect(r.notes).toHaveLength(4);
    for (const x of r.notes) {
      expect(x.status).toBe('absent');
      expect(x.detail).toBe('not run: 2 s left before --deadline-s');
    }
  });

  it('names the missing peer script', async () => {
    const r = await densePeers(ctx(), [opened[0]], new Map([['cuda', [131072]]]), undefined);
    expect(r.notes.map((x) => x.detail)).toEqual([
      'peer script apps/bench/peers/sdpa_peer.py not found (pass --peer-script)',
      'peer script apps/bench/peers/sdpa_peer.py not found (pass --peer-script)',
    ]);
  });
});
