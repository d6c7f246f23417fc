import { execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { exampleOutputProblems, exportTargets, extractExample, forbiddenFiles, manifestProblems, readTarball } from './lib.mjs';

describe('readTarball', () => {
  const dir = mkdtempSync(join(tmpdir(), 'crisp-tar-test-'));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));
  const long = `dist/${'a'.repeat(60)}/${'b'.repeat(60)}/deep.js`; // over ustar's 100-byte name field
  mkdirSync(join(dir, 'package', long, '..'), { recursive: true });
  writeFileSync(join(dir, 'package', 'package.json'), '{"name":"x"}');
  writeFileSync(join(dir, 'package', long), 'export {};\n');
  for (const format of ['ustar', 'pax', 'gnu']) {
    it(`reads paths and contents (${format} format)`, () => {
      const tgz = join(dir, `${format}.tgz`);
      execFileSync('tar', [`--format=${format}`, '-czf', tgz, '-C', dir, 'package']);
      const files = readTarball(readFileSync(tgz));
      expect([...files.keys()].sort()).toEqual([long, 'package.json']);
      expect(files.get('package.json')?.toString()).toBe('{"name":"x"}');
      expect(files.get(long)?.toString()).toBe('export {};\n');
    });
  }
});

describe('forbiddenFiles', () => {
  it('names tests, fixtures, test support and build configuration', () => {
    const unwanted = [
      'src/a.test.ts',
      'dist/a.test.js.map',
      'dist/b.spec.d.ts',
      'src/__fixtures__/x.npy',
      'test/readme-example.ts',
      'src/test-support.ts',
      'dist/test-support.d.ts',
      'src/stand-in-driver.ts',
      'vitest.config.ts',
      'tsconfig.build.json',
    ];
    const found = forbiddenFiles(['dist/index.js', ...unwanted]);
    expect(found.map((s) => s.split(' ')[0])).toEqual(unwanted);
    expect(found[0]).toBe('src/a.test.ts (a test file)');
  });
  it('passes what a package ships', () => {
    expect(forbiddenFiles(['package.json', 'README.md', 'LICENSE', 'dist/index.js', 'dist/testing.js', 'src/contest.ts', 'kernels/fill/fill.cu'])).toEqual([]);
  });
});

describe('extractExample', () => {
  const md = ['# T', '', '## Use it', '', '```sh', 'npm i x', '```', '', '```ts', 'const a = 1;', '```', '', '## Next', '', '```ts', 'other', '```'].join('\n');
  it('takes the first ts block under the heading', () => {
    expect(extractExample(md, 'Use it')).toBe('const a = 1;\n');
  });
  it('does not reach into the next section, and says what is missing', () => {
    expect(() => extractExample(md.replace('```ts\nconst a = 1;\n```', ''), 'Use it')).toThrow("no ```ts block under 'Use it'");
    expect(() => extractExample(md, 'Usage')).toThrow("no heading 'Usage'");
  });
  it("finds the root README's example, which imports the published packages", () => {
    const readme = readFileSync(new URL('../../../README.md', import.meta.url), 'utf8');
    const code = extractExample(readme, 'Use it');
    expect(code).toContain("from '@crisp/core'");
    expect(code).toContain('console.log(');
  });
});

it('exportTargets lists the published files, not the workspace source condition', () => {
  expect(
    exportTargets({
      '.': { '@crisp/source': './src/index.ts', types: './dist/index.d.ts', import: './dist/index.js' },
      './node': { types: './dist/node.d.ts', import: './dist/node.js' },
    }),
  ).toEqual(['dist/index.d.ts', 'dist/index.js', 'dist/node.d.ts', 'dist/node.js']);
});

describe('manifestProblems', () => {
  const url = 'git+https://example.invalid/crisp.git';
  const good = {
    name: '@crisp/x',
    description: 'a package that does x',
    keywords: ['crisp'],
    license: 'MIT',
    engines: { node: '>=20' },
    repository: { type: 'git', url, directory: 'packages/x' },
    dependencies: { '@crisp/core': '0.2.0' },
  };
  const ctx = {
    folder: 'packages/x',
    repositoryUrl: url,
    readme: '# x\n\n```sh\nnpm i @crisp/x\n```\n\n## What runs where\n\n- here\n\n```ts\nx();\n```\n',
    license: 'MIT License\n',
    rootLicense: 'MIT License',
  };
  it('passes a complete package', () => {
    expect(manifestProblems(good, ctx)).toEqual([]);
  });
  it('names each missing or wrong field', () => {
    const bad = { ...good, description: undefined, keywords: [], engines: undefined, repository: { type: 'git', url, directory: 'packages/y' } };
    expect(manifestProblems(bad, ctx)).toEqual([
      'no description',
      'no keywords',
      'engines.node is undefined, not ">=20"',
      'repository.directory is "packages/y", not "packages/x"',
    ]);
    expect(manifestProblems({ ...good, dependencies: { '@crisp/core': 'workspace:*' } }, ctx)).toEqual([
      'dependencies.@crisp/core is still workspace:* in the tarball',
    ]);
  });
  it('checks the README and the LICENSE', () => {
    expect(manifestProblems(good, { ...ctx, readme: '# x\n\nnpm i @crisp/xy\n' })).toEqual([
      'README.md has no install line (`npm i @crisp/x`)',
      "README.md has no '## What runs where' section",
      'README.md has no ```ts or ```js example',
    ]);
    expect(manifestProblems(good, { ...ctx, readme: ctx.readme.replace('npm i @crisp/x', 'npm i -D @crisp/x vitest') })).toEqual([]);
    expect(manifestProblems(good, { ...ctx, readme: undefined, license: undefined })).toEqual(['no LICENSE in the tarball', 'no README.md in the tarball']);
    expect(manifestProblems(good, { ...ctx, license: 'Apache' })).toEqual(["LICENSE differs from the repository's"]);
  });
});

describe('exampleOutputProblems', () => {
  it("accepts what the README example prints (Node's multi-line array)", () => {
    expect(exampleOutputProblems("[\n  'pe', 'vs', 'pe',\n  'vs'\n] 0.94 17356.3\n")).toEqual([]);
    expect(exampleOutputProblems('undefined 1 12.5\n')).toEqual([]);
  });
  it('refuses other routes, a density outside (0, 1] and a time that is not positive', () => {
    expect(exampleOutputProblems("[ 'pe', 'xx' ] 0 -1\n")).toEqual([
      "routes must be 'vs' or 'pe', got 'xx'",
      'density 0 is not in (0, 1]',
      'total time -1 ms is not a positive number',
    ]);
    expect(exampleOutputProblems('Error: boom\n')[0]).toMatch(/^expected "\[routes\] density ms"/);
  });
});
