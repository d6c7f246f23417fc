/**
 * Where a run came from, recorded in its JSON so a report (or a reader of the file) can say
 * when, from which commit, with which versions and on which machine the numbers were made.
 * Every field is best effort: a missing git (a bundled CLI) gives `commit: null`, never an error.
 * CRISP_COMMIT, when set, names the commit instead of asking git (for builds without a checkout).
 */
import { execFileSync } from 'node:child_process';
import { arch, cpus, platform, release, totalmem } from 'node:os';
import { dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { presetAlpha } from './policy.js';
import { cliVersion } from './version.js';

export interface Provenance {
  /** ISO 8601, UTC */
  readonly date: string;
  /** full commit hash of the checkout the CLI runs from, or null when unknown */
  readonly commit: string | null;
  /** uncommitted changes to tracked files in that checkout (null when unknown) */
  readonly dirty: boolean | null;
  readonly versions: { readonly cli: string; readonly node: string; readonly v8: string };
  readonly machine: { readonly os: string; readonly arch: string; readonly cpu: string; readonly cores: number; readonly memoryGiB: number };
  /** the policy settings the run used (what the report's thresholds are drawn from) */
  readonly settings: { readonly preset: string; readonly alpha?: number; readonly gamma?: number; readonly tauProxy?: number };
}

const HERE = dirname(fileURLToPath(import.meta.url));

function git(args: string[]): string | null {
  try {
    return execFileSync('git', args, { cwd: HERE, encoding: 'utf8', timeout: 3000, stdio: ['ignore', 'pipe', 'ignore'] }).trim();
  } catch {
    return null;
  }
}

function versionOrUnknown(): string {
  try {
    return cliVersion();
  } catch {
    return 'unknown';
  }
}

/** The thresholds a preset runs with when no flag overrides them (policy.ts's defaults). */
export function presetSettings(preset: string, o: { alpha?: number; gamma?: number; tauProxy?: number }): Provenance['settings'] {
  if (preset === 'dense') return { preset };
  if (preset === 'flexPrefill') return { preset, gamma: o.gamma ?? 0.95 };
  return { preset, alpha: o.alpha ?? presetAlpha(preset) ?? 1.0, gamma: o.gamma ?? 0.95, tauProxy: o.tauProxy ?? 0.2 };
}

export function collectProvenance(preset: string, overrides: { alpha?: number; gamma?: number; tauProxy?: number }): Provenance {
  const env = process.env.CRISP_COMMIT?.trim();
  const commit = env || git(['rev-parse', 'HEAD']);
  const status = env ? null : git(['status', '--porcelain', '--untracked-files=no']);
  const cpu = cpus();
  return {
    date: new Date().toISOString(),
    commit: commit && /^[0-9a-f]{7,64}$/i.test(commit) ? commit : null,
    dirty: status === null ? null : status.length > 0,
    versions: { cli: versionOrUnknown(), node: process.version, v8: process.versions.v8 },
    machine: {
      os: `${platform()} ${release()}`,
      arch: arch(),
      cpu: cpu[0]?.model.trim() ?? 'unknown',
      cores: cpu.length,
      memoryGiB: Math.round((totalmem() / 2 ** 30) * 10) / 10,
    },
    settings: presetSettings(preset, overrides),
  };
}
