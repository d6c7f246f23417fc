// The parity suite's command line and its skips (no CUDA backend, no peer script, a head dim
// FlexPrefill's kernels do not take), and the peer apps/bench/peers/flexprefill_peer.py: it
// compiles, its --self-check passes without a GPU, and without torch it exits with status 3,
// which the suite reports as an absent peer.
import { spawnSync } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { Backend } from '@crisp/core';
import { createReferenceBackend } from '@crisp/reference';
import { describe, expect, it } from 'vitest';
import type { OpenBackend } from './backends.js';
import { defaultConfig } from './config.js';
import type { SuiteContext } from './context.js';
import { resolveConfig } from './main.js';
import { differingHeads, PEER_ABSENT_STATUS, parityMarkdown, paritySuite, parityParams } from './suites/parity.js';

const SCRIPT = fileURLToPath(new URL('../peers/flexprefill_peer.py', import.meta.url));
const env = { ...process.env, PYTHONPYCACHEPREFIX: mkdtempSync(join(tmpdir(), 'crisp-pycache-')) };
const py = (args: string[], timeout = 60_000) => spawnSync('python3', args, { encoding: 'utf8', env, timeout });
const hasPython = py(['--version']).status === 0;
const hasTorch = hasPython && py(['-c', 'import torch, safetensors, numpy']).status === 0;

const untouchable = new Proxy({} as Backend, {
  get: (_t, p) => {
    throw new Error(`the parity suite touched the backend (${String(p)})`);
  },
});
const ctx = (patch: Partial<ReturnType<typeof defaultConfig>['parity']> = {}): SuiteContext => {
  const base = defaultConfig('full');
  return { config: { ...base, parity: { ...base.parity, ...patch } }, command: 'crisp-bench (test)', log: () => {} };
};

describe('parity: command line', () => {
  it('reads sizes, profiles, seeds, shape and rows', () => {
    const c = resolveConfig({ paritySizes: '8k,16k', parityProfiles: 'llama-like,diffuse', paritySeeds: '1,2', parityShape: '32,8,128', parityRows: '16' });
    expect(c.parity.sizes).toEqual([8192, 16384]);
    expect(c.parity.profiles).toEqual(['llama-like', 'diffuse']);
    expect(c.parity.seeds).toEqual([1, 2]);
    expect(c.parity.shape).toEqual({ heads: 32, kvHeads: 8, headDim: 128 });
    expect(c.parity.rows).toBe(16);
    expect(c.parity.presets).toEqual(['crisp', 'crispGuarded']);
    expect(resolveConfig({ parityPresets: 'crispFast' }).parity.presets).toEqual(['crispFast']);
    expect(resolveConfig({ parityPresets: 'none' }).parity.presets).toEqual([]);
    expect(() => resolveConfig({ parityPresets: 'flexPrefill' })).toThrow(/parity preset/);
    expect(resolveConfig({}).parity.sizes).toEqual([8192, 16384, 32768, 65536, 131072, 262144, 524288]);
    expect(resolveConfig({}).suites).not.toContain('parity');
    expect(() => resolveConfig({ paritySeeds: '1,x' })).toThrow(/bad seed list/);
    expect(() => resolveConfig({ parityProfiles: 'nope' })).toThrow(/unknown profile 'nope'/);
  });

  it("passes the preset's settings in FlexPrefill's terms (min_budget in tokens)", () => {
    expect(parityParams()).toEqual({ gamma: 0.95, tau: 0.1, minBudget: 1024, blockSize: 128 });
  });
});

describe('parity: skips with a reason', () => {
  it('without a CUDA backend', async () => {
    const r = await paritySuite(ctx(), [{ name: 'reference', backend: untouchable }], SCRIPT);
    expect(r.rows).toEqual([]);
    expect(r.notes).toHaveLength(1);
    expect(r.notes[0].status).toBe('absent');
    expect(r.notes[0].detail).toMatch(/no CUDA backend here/);
  });

  it('without the peer script, and with a head dim FlexPrefill does not take', async () => {
    const cuda: OpenBackend[] = [{ name: 'cuda', backend: untouchable }];
    expect((await paritySuite(ctx(), cuda, undefined)).notes[0].detail).toMatch(/flexprefill_peer.py not found/);
    expect((await paritySuite(ctx({ shape: { heads: 4, kvHeads: 1, headDim: 96 } }), cuda, SCRIPT)).notes[0].detail).toMatch(/head dim 96: FlexPrefill's kernels take 16, 32, 64, 128/);
  });

  it.skipIf(!hasPython || hasTorch)('without torch: the peer exits 3 and the suite reports it absent, the backend untouched', async () => {
    const r = await paritySuite(ctx(), [{ name: 'cuda', backend: untouchable }], SCRIPT);
    expect(r.notes[0].status).toBe('absent');
    expect(r.notes[0].detail).toMatch(/^torch, safetensors or numpy missing: .*needs torch, safetensors and numpy/);
  });
});

describe.skipIf(!hasPython)('flexprefill_peer.py', () => {
  it('compiles', () => {
    const r = py(['-m', 'py_compile', SCRIPT]);
    expect(r.status, r.stderr).toBe(0);
  });

  it('--self-check passes without a GPU', () => {
    const r = py([SCRIPT, '--self-check'], 120_000);
    expect(r.status, `${r.stdout}\n${r.stderr}`).toBe(0);
    expect(r.stdout).toMatch(/ok {3}the capture records the JSD and the block call the attention made/);
    expect(r.stdout).toMatch(/self-check passed/);
  }, 130_000);

  it('refuses a call without a manifest, and a manifest without the parameters (status 2)', () => {
    expect(py([SCRIPT]).status).toBe(2);
    const m = join(mkdtempSync(join(tmpdir(), 'crisp-parity-test-')), 'm.json');
    writeFileSync(m, JSON.stringify({ inputs: [] }));
    const r = py([SCRIPT, '--manifest', m, '--out', `${m}.out`]);
    expect(r.status).toBe(2);
    expect(r.stderr).toMatch(/lacks gamma, tau, min_budget, block_size/);
  });

  it.skipIf(hasTorch)('without torch says what to install and exits with status 3', () => {
    const m = join(mkdtempSync(join(tmpdir(), 'crisp-parity-test-')), 'm.json');
    writeFileSync(m, JSON.stringify({ inputs: [], gamma: 0.95, tau: 0.1, min_budget: 1024, block_size: 128 }));
    const r = py([SCRIPT, '--manifest', m, '--out', `${m}.out`]);
    expect(r.status).toBe(3);
    expect(PEER_ABSENT_STATUS[3]).toBeDefined();
    expect(r.stderr).toMatch(/pip install torch safetensors numpy/);
  });
});

// A stand-in for FlexPrefill's peer (Python's standard library only): it answers the probe, and
// per input reads the safetensors header the suite wrote, checks that every also_<preset>
// tensor is bf16 [rows, H, d] like crisp_out, and reports each one's position in the file's
// sorted names as its "error", so the test can see that every preset's output arrived.
const STUB_PEER = `
import json, struct, sys
a = sys.argv
man = json.load(open(a[a.index("--manifest") + 1]))
out = a[a.index("--out") + 1]
runs = []
for item in man["inputs"]:
    with open(item["file"], "rb") as fh:
        size = struct.unpack("<Q", fh.read(8))[0]
        header = json.loads(fh.read(size))
    n, H, d = header["q"]["shape"]
    r = len(header["rows"]["data_offsets"]) and header["rows"]["shape"][0]
    also = sorted(k[5:] for k in header if k.startswith("also_"))
    bad = [k for k in also if header["also_" + k]["dtype"] != "BF16" or header["also_" + k]["shape"] != [r, H, d]]
    run = {"name": item["name"], "relErr": 0.5, "crispRelErr": 0.25, "density": [0.5] * H, "routes": ["pe"] + ["vs"] * (H - 1), "ms": [8.0, 8.0, 8.0]}
    run["headRelErr"] = [0.1 * (h + 1) for h in range(H)]
    run["crispHeadRelErr"] = [0.01 * (h + 1) for h in range(H)]
    if bad:
        run["error"] = "bad also_ tensors: " + ",".join(bad)
    run["alsoRelErr"] = {k: float(i + 1) for i, k in enumerate(also)}
    runs.append(run)
json.dump({"torch": "stub", "runs": runs}, open(out, "w"))
`;

describe.skipIf(!hasPython)("parity: CRISP's presets beside FlexPrefill's code (reference backend, a stand-in peer)", () => {
  it('runs each preset on the same layer, writes its rows for the peer and reports its time, density and score', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'crisp-parity-stub-'));
    const stub = join(dir, 'peer.py');
    writeFileSync(stub, STUB_PEER);
    const b = createReferenceBackend();
    try {
      const c = ctx({ sizes: [2048], profiles: ['llama-like'], seeds: [1], shape: { heads: 4, kvHeads: 1, headDim: 64 }, rows: 8, reps: 1, warmup: 0, presets: ['crisp', 'crispGuarded'] });
      const r = await paritySuite(c, [{ name: 'cuda', backend: b }], stub);
      expect(r.skipped).toEqual([]);
      expect(r.rows).toHaveLength(1);
      const row = r.rows[0];
      expect(row.theirsRelErr).toBe(0.5);
      expect(row.oursRelErr).toBe(0.25);
      expect(row.others?.map((x) => x.preset)).toEqual(['crisp', 'crispGuarded']);
      // the stub scores the also_ tensors in sorted order: crisp 1, crispGuarded 2
      expect(row.others?.map((x) => x.relErr)).toEqual([1, 2]);
      for (const x of row.others!) {
        expect(x.density).toBeGreaterThan(0);
        expect(x.density).toBeLessThanOrEqual(1);
        expect(x.ms.median).toBeGreaterThan(0);
      }
      // per-head errors from the peer, by head; the stub routes head 0 PE, so it differs unless ours did too
      expect(row.heads.map((x) => x.theirsRelErr)).toEqual([0.1, 0.2, 0.30000000000000004, 0.4]);
      expect(row.heads.map((x) => x.oursRelErr)).toEqual([0.01, 0.02, 0.03, 0.04]);
      const md = parityMarkdown(r).join('\n');
      // (this layer's head 0 is a VS head here, so the stub's PE route for it is a difference)
      expect(row.heads[0].oursRoute).toBe('vs');
      expect(differingHeads(row).map((x) => x.head)).toContain(0);
      expect(md).toContain('### Heads whose decisions differ');
      expect(md).toMatch(/\| llama-like \| 2048 \| 1 \| 0 \| vs \/ pe \| – \| [0-9.]+ \/ 0\.500 \| 0\.0100 \/ 0\.1000 \|/);
      expect(md).toContain("### CRISP's presets against FlexPrefill's code on the same layers");
      expect(md).toMatch(/\| llama-like \| 2048 \| 1 \| crispGuarded \| [0-9.]+ \| 2\.0000 \| [0-9.]+ \| 0\.500 \/ 0\.5000 \/ 8\.00 \| [0-9.]+x \|/);
      // none asked: no other presets, no table
      const none = await paritySuite(ctx({ ...c.config.parity, presets: [] }), [{ name: 'cuda', backend: b }], stub);
      expect(none.rows[0].others).toBeUndefined();
      expect(parityMarkdown(none).join('\n')).not.toContain("CRISP's presets against");
    } finally {
      b.dispose?.();
    }
  }, 240_000);
});

