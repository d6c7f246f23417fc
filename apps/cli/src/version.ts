/**
 * The command's version (`crisp --version`): apps/cli's package.json version, so it is never a
 * copy that drifts. A single-file bundle (tools/gpu-rig/scripts/pack.sh, run far from the
 * repository) gets it at bundle time, as the esbuild define `__CRISP_CLI_VERSION__`; everywhere
 * else the file is found by walking up from this module, which sits in src/ (tests), dist/
 * (the build) or a bundle beside them.
 */
import { readFileSync } from 'node:fs';
import { CrispError } from '@crisp/core';

/** Set by a bundler's define to apps/cli's package.json version; undeclared otherwise. */
declare const __CRISP_CLI_VERSION__: string | undefined;

const PACKAGE_NAME = '@crisp/cli';

/** The bundled version when there is one; else that of the package.json above `from`. */
export function cliVersion(from?: URL): string {
  if (from === undefined && typeof __CRISP_CLI_VERSION__ === 'string') return __CRISP_CLI_VERSION__;
  return packageJsonVersion(from ?? new URL(import.meta.url));
}

function packageJsonVersion(from: URL): string {
  let dir = new URL('.', from);
  for (let up = 0; up < 8; up++) {
    const file = new URL('package.json', dir);
    let text: string | undefined;
    try {
      text = readFileSync(file, 'utf8');
    } catch {
      text = undefined;
    }
    if (text !== undefined) {
      const pkg = JSON.parse(text) as { name?: unknown; version?: unknown };
      if (pkg.name === PACKAGE_NAME && typeof pkg.version === 'string') return pkg.version;
    }
    const parent = new URL('..', dir);
    if (parent.href === dir.href) break;
    dir = parent;
  }
  throw new CrispError('IO_ERROR', `cannot find the package.json of ${PACKAGE_NAME} above ${from.pathname}; reinstall crisp`);
}
