/**
 * The command's version: read from apps/cli's package.json when asked (`crisp --version`), so
 * it is never a copy that drifts. The file is found by walking up from this module, which sits
 * in src/ (tests), dist/ (the build) or a bundle beside them.
 */
import { readFileSync } from 'node:fs';
import { CrispError } from '@crisp/core';

const PACKAGE_NAME = '@crisp/cli';

export function cliVersion(from: URL = new URL(import.meta.url)): string {
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
