/** Who ran the bench, where: CPU, GPU, driver, Node, package versions, git commit, date. */
import { execFileSync } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';

export interface MachineInfo {
  readonly hostname: string;
  readonly slug: string;
  readonly os: string;
  readonly cpu: { readonly model: string; readonly cores: number };
  readonly memoryGiB: number;
  readonly gpus: readonly { name: string; driver: string; memory: string }[];
  readonly node: string;
  readonly versions: Record<string, string>;
  readonly git?: { readonly commit: string; readonly dirty: boolean };
}

function run(cmd: string, args: string[], cwd?: string): string | undefined {
  try {
    return execFileSync(cmd, args, { cwd, encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'], timeout: 10_000 }).trim();
  } catch {
    return undefined;
  }
}

/** The repository root: the nearest folder upward from `start` holding pnpm-workspace.yaml. */
export function findRepoRoot(start = process.cwd()): string | undefined {
  let dir = start;
  for (;;) {
    if (existsSync(join(dir, 'pnpm-workspace.yaml'))) return dir;
    const up = join(dir, '..');
    if (up === dir) return undefined;
    dir = up;
  }
}

function gpuList(): MachineInfo['gpus'] {
  const out = run('nvidia-smi', ['--query-gpu=name,driver_version,memory.total', '--format=csv,noheader']);
  if (!out) return [];
  return out.split('\n').map((line) => {
    const [name, driver, memory] = line.split(',').map((s) => s.trim());
    return { name, driver, memory };
  });
}

/** A folder name for this machine's results: the GPU if there is one, else the CPU. */
export function machineSlug(gpus: MachineInfo['gpus'], cpuModel: string, cores: number): string {
  const base = gpus.length > 0 ? `${gpus.length > 1 ? `${gpus.length}x-` : ''}${gpus[0].name}` : `cpu-${cpuModel}-${cores}c`;
  return base
    .toLowerCase()
    .replace(/\(r\)|\(tm\)|nvidia|corporation|processor|cpu @.*$/g, ' ')
    .replace(/[^a-z0-9]+/g, '-')
    .replace(/^-+|-+$/g, '')
    .slice(0, 60);
}

const VERSIONED = [
  '@crisp/core',
  '@crisp/reference',
  '@crisp/router',
  '@crisp/select',
  '@crisp/presets',
  '@crisp/synth',
  '@crisp/kernels-webgpu',
  '@crisp/kernels-cuda',
  'webgpu',
  'koffi',
  'vega',
  'vega-lite',
  'commander',
];

export function machineInfo(repoRoot: string | undefined, packageVersions: Record<string, string>): MachineInfo {
  const cpus = os.cpus();
  const model = cpus[0]?.model?.trim() ?? 'unknown cpu';
  const gpus = gpuList();
  const versions: Record<string, string> = { ...packageVersions };
  if (repoRoot) {
    for (const name of VERSIONED) {
      try {
        versions[name] = JSON.parse(readFileSync(join(repoRoot, 'apps/bench/node_modules', name, 'package.json'), 'utf8')).version;
      } catch {
        // not installed here: nothing to report
      }
    }
  }
  // CRISP_GIT_COMMIT: where the checkout's git metadata is not the code's (the GPU machine
  // gets a copy of the working tree whose .git can be stale), the caller says the commit.
  const given = process.env.CRISP_GIT_COMMIT?.trim();
  const commit = given || (repoRoot ? run('git', ['rev-parse', 'HEAD'], repoRoot) : undefined);
  const status = given ? '' : repoRoot ? run('git', ['status', '--porcelain'], repoRoot) : undefined;
  return {
    hostname: os.hostname(),
    slug: machineSlug(gpus, model, cpus.length),
    os: `${os.type()} ${os.release()} ${os.arch()}`,
    cpu: { model, cores: cpus.length },
    memoryGiB: Math.round((os.totalmem() / 2 ** 30) * 10) / 10,
    gpus,
    node: process.version,
    versions,
    git: commit ? { commit, dirty: Boolean(status) } : undefined,
  };
}
