// `pnpm docs:api`: the API reference from the TSDoc of every published package, into
// docs/api/ (ignored). The entry points are read from each non-private package's `exports`
// map (its "@crisp/source" condition), so a new package or subpath export is documented
// without editing this file. Warnings fail the build: a `{@link}` that does not resolve, or
// a type that the public API uses but no entry exports.
import { readdirSync, readFileSync } from 'node:fs';

const entryPoints = [];
for (const dir of readdirSync('packages').sort()) {
  const manifest = JSON.parse(readFileSync(`packages/${dir}/package.json`, 'utf8'));
  if (manifest.private) continue;
  for (const target of Object.values(manifest.exports ?? {})) {
    const source = typeof target === 'object' ? target['@crisp/source'] : undefined;
    if (!source) throw new Error(`typedoc: ${manifest.name} has an export without an "@crisp/source" condition`);
    entryPoints.push(`packages/${dir}/${source.replace(/^\.\//, '')}`);
  }
}

/** @type {Partial<import('typedoc').TypeDocOptions>} */
export default {
  name: 'CRISP for TypeScript',
  tsconfig: './tsconfig.docs.json',
  entryPoints,
  out: 'docs/api',
  readme: 'none',
  excludePrivate: true,
  excludeInternal: true,
  validation: { notExported: true, invalidLink: true, rewrittenLink: true, notDocumented: false, unusedMergeModuleWith: true },
  treatWarningsAsErrors: true,
  disableGit: true,
  sourceLinkTemplate: 'https://github.com/crisp-ts/crisp/blob/main/{path}#L{line}',
  hideGenerator: true,
};
