/**
 * The rules the tarball check applies, as pure functions (tested in lib.test.ts; run by
 * main.mjs against the real tarballs).
 */
import { gunzipSync } from 'node:zlib';

/**
 * The files of a gzipped tarball as `npm pack` / `pnpm pack` write it: path (without the
 * leading `package/`) to contents. Regular files only; pax and GNU long names are read.
 * @param {Uint8Array} gz
 * @returns {Map<string, Buffer>}
 */
export function readTarball(gz) {
  const tar = gunzipSync(gz);
  /** @type {Map<string, Buffer>} */
  const files = new Map();
  let longName;
  for (let at = 0; at + 512 <= tar.length; ) {
    const header = tar.subarray(at, at + 512);
    if (header.every((b) => b === 0)) break;
    /** @type {(start: number, len: number) => string} */
    const field = (start, len) => header.subarray(start, start + len).toString('utf8').replace(/\0.*$/s, '');
    const size = Number.parseInt(field(124, 12).trim() || '0', 8);
    const type = field(156, 1) || '0';
    const body = tar.subarray(at + 512, at + 512 + size);
    at += 512 + Math.ceil(size / 512) * 512;
    if (type === 'x') {
      const m = /(?:^|\n)\d+ path=([^\n]*)\n/.exec(body.toString('utf8'));
      if (m) longName = m[1];
      continue;
    }
    if (type === 'L') {
      longName = body.toString('utf8').replace(/\0.*$/s, '');
      continue;
    }
    const prefix = field(345, 155);
    const name = longName ?? (prefix ? `${prefix}/${field(0, 100)}` : field(0, 100));
    longName = undefined;
    if (type === '0' || type === '7') files.set(name.replace(/^[^/]+\//, ''), Buffer.from(body));
  }
  return files;
}

/** @type {[RegExp, string][]} */
const FORBIDDEN = [
  [/\.(test|spec)\.[cm]?[jt]sx?(\.map)?$/, 'a test file'],
  [/\.(test|spec)\.d\.[cm]?ts(\.map)?$/, 'a test file'],
  [/(^|\/)(test|tests|__tests__|__fixtures__|__mocks__|fixtures-src)\//, 'a test or fixture folder'],
  [/(^|\/)test-support\./, 'test support'],
  [/(^|\/)stand-in-[^/]*$/, 'a test stand-in'],
  [/(^|\/)vitest\.config\.[cm]?[jt]s$/, 'test configuration'],
  [/(^|\/)tsconfig[^/]*\.json$/, 'build configuration'],
  [/(^|\/)\.turbo\//, 'build cache'],
  [/(^|\/)node_modules\//, 'installed dependencies'],
];

/**
 * The tarball paths that have no place in a published package, each with why.
 * @param {Iterable<string>} paths
 * @returns {string[]}
 */
export function forbiddenFiles(paths) {
  const out = [];
  for (const p of paths) {
    const hit = FORBIDDEN.find(([re]) => re.test(p));
    if (hit) out.push(`${p} (${hit[1]})`);
  }
  return out;
}

/**
 * The first ```ts block under the Markdown heading `heading` (up to the next heading of the
 * same or a higher level). Throws when there is none, so a renamed section fails the check.
 * @param {string} markdown
 * @param {string} heading
 */
export function extractExample(markdown, heading) {
  const lines = markdown.split(/\r?\n/);
  const start = lines.findIndex((l) => /^#{1,6} /.test(l) && l.replace(/^#+ /, '').trim() === heading);
  if (start < 0) throw new Error(`no heading '${heading}'`);
  const level = (/^#+/.exec(lines[start]) ?? [''])[0].length;
  for (let i = start + 1; i < lines.length; i++) {
    const h = /^(#{1,6}) /.exec(lines[i]);
    if (h && h[1].length <= level) break;
    if (/^```(ts|typescript)\s*$/.test(lines[i])) {
      const end = lines.findIndex((l, j) => j > i && /^```\s*$/.test(l));
      if (end < 0) throw new Error(`the code block under '${heading}' is not closed`);
      return `${lines.slice(i + 1, end).join('\n')}\n`;
    }
  }
  throw new Error(`no \`\`\`ts block under '${heading}'`);
}

/**
 * The files a package's `exports` point at (every condition but the workspace-only
 * `@crisp/source`), as tarball paths.
 * @param {unknown} exportsField
 * @returns {string[]}
 */
export function exportTargets(exportsField) {
  /** @type {Set<string>} */
  const out = new Set();
  /** @param {unknown} v */
  const walk = (v) => {
    if (typeof v === 'string') out.add(v.replace(/^\.\//, ''));
    else if (v && typeof v === 'object') {
      for (const [k, x] of Object.entries(v)) if (k !== '@crisp/source') walk(x);
    }
  };
  walk(exportsField);
  return [...out].sort();
}

/**
 * What is wrong with a publishable package's manifest and files, as sentences.
 * @param {Record<string, any>} pkg  the package.json as packed
 * @param {{ folder: string, repositoryUrl: string, readme: string | undefined, license: string | undefined, rootLicense: string }} ctx
 */
export function manifestProblems(pkg, ctx) {
  const p = [];
  const name = pkg.name;
  if (typeof pkg.description !== 'string' || pkg.description.length < 10) p.push('no description');
  if (!Array.isArray(pkg.keywords) || pkg.keywords.length === 0) p.push('no keywords');
  if (pkg.license !== 'MIT') p.push(`license is ${JSON.stringify(pkg.license)}, not "MIT"`);
  if (pkg.engines?.node !== '>=20') p.push(`engines.node is ${JSON.stringify(pkg.engines?.node)}, not ">=20"`);
  const repo = pkg.repository;
  if (repo?.type !== 'git' || repo?.url !== ctx.repositoryUrl) p.push(`repository must be { type: "git", url: "${ctx.repositoryUrl}" } as in the root package.json`);
  if (repo?.directory !== ctx.folder) p.push(`repository.directory is ${JSON.stringify(repo?.directory)}, not "${ctx.folder}"`);
  for (const field of ['dependencies', 'peerDependencies', 'optionalDependencies']) {
    for (const [dep, range] of Object.entries(pkg[field] ?? {})) {
      if (String(range).startsWith('workspace:')) p.push(`${field}.${dep} is still ${range} in the tarball`);
    }
  }
  if (ctx.license === undefined) p.push('no LICENSE in the tarball');
  else if (ctx.license.trim() !== ctx.rootLicense.trim()) p.push("LICENSE differs from the repository's");
  if (ctx.readme === undefined) p.push('no README.md in the tarball');
  else {
    if (!new RegExp(`\\bnpm i(nstall)?( -D| --save-dev)? ${name.replace(/[/.]/g, '\\$&')}(\\s|$)`, 'm').test(ctx.readme)) p.push(`README.md has no install line (\`npm i ${name}\`)`);
    if (!/^#{2,3} What runs where\s*$/im.test(ctx.readme)) p.push("README.md has no '## What runs where' section");
    if (!/^```(ts|typescript|js|javascript)\s*$/m.test(ctx.readme)) p.push("README.md has no ```ts or ```js example");
  }
  return p;
}

/**
 * Reads what the root README's example prints: `console.log(plan.routing?.routes,
 * plan.overallDensity, timings.totalMs)`, i.e. an array of 'vs'/'pe' (or undefined for a
 * dense run), the density and the milliseconds. Problems as sentences; empty when sensible.
 * @param {string} stdout
 */
export function exampleOutputProblems(stdout) {
  const text = stdout.replace(/\s+/g, ' ').trim();
  const m = /^(\[(.*)\]|undefined) (\S+) (\S+)$/.exec(text);
  if (!m) return [`expected "[routes] density ms", got ${JSON.stringify(stdout.slice(0, 300))}`];
  const p = [];
  if (m[2] !== undefined) {
    const routes = m[2].split(',').map((s) => s.trim());
    const bad = routes.filter((r) => r !== "'vs'" && r !== "'pe'");
    if (routes.length === 0 || bad.length) p.push(`routes must be 'vs' or 'pe', got ${bad.join(' ')}`);
  }
  const density = Number(m[3]);
  const ms = Number(m[4]);
  if (!(density > 0 && density <= 1)) p.push(`density ${m[3]} is not in (0, 1]`);
  if (!(ms > 0 && Number.isFinite(ms))) p.push(`total time ${m[4]} ms is not a positive number`);
  return p;
}
