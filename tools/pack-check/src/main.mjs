#!/usr/bin/env node
/**
 * The check a new user's first commands make, on the tarballs that would be published:
 *
 * 1. builds and packs every non-private workspace package (found from the workspace, so a
 *    new package is covered without being listed here) into a temporary folder;
 * 2. checks each tarball: no tests or test support, every `exports` target present, no
 *    `workspace:` ranges left, LICENSE, a README with an install line, the manifest fields;
 * 3. installs all tarballs with npm into a scratch project outside the workspace (third-party
 *    dependencies from the registry or npm's cache; every @crisp package must come from its
 *    tarball), imports every entry point with plain Node (and requires each from CommonJS
 *    where Node's require() loads ES modules), checks the Node WebGPU entry without its
 *    optional `webgpu` peer says how to install it, and that @crisp/kernels-cuda bundled by
 *    esbuild into one CommonJS file still reaches koffi; builds the browser entry points with
 *    Vite (production, from dist) and fails on any Node-only import in their graphs;
 * 4. compiles the root README's "Use it" example and @crisp/core's, taken from the READMEs
 *    themselves, with the workspace's tsc (strict, module nodenext, target ES2022, no
 *    @types/node, lib checks on) and runs them on the reference backend, checking what the
 *    root one prints; every typed entry point also compiles under TypeScript's older
 *    "moduleResolution": "node" (subpaths through typesVersions).
 *
 * Exit status 1 with every problem listed; `--keep` leaves the scratch folder for a look.
 */
import { execFileSync, spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { builtinModules, createRequire } from 'node:module';
import { availableParallelism, tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { exampleOutputProblems, exportTargets, extractExample, forbiddenFiles, manifestProblems, readTarball } from './lib.mjs';

const root = fileURLToPath(new URL('../../..', import.meta.url));
const keep = process.argv.includes('--keep');
const started = Date.now();
const problems = [];
const say = (s) => console.log(`pack-check: ${s} (${((Date.now() - started) / 1000).toFixed(1)} s)`);
const run = (cmd, args, opts = {}) => {
  const r = spawnSync(cmd, args, { encoding: 'utf8', maxBuffer: 1 << 26, ...opts });
  if (r.error) throw r.error;
  return r;
};
/** `run` without blocking: { status, stdout, stderr } once the process ends. */
const runAsync = (cmd, args, opts = {}) =>
  new Promise((resolve, reject) => {
    const child = spawn(cmd, args, { ...opts, stdio: ['ignore', 'pipe', 'pipe'] });
    const out = [];
    const err = [];
    child.stdout.on('data', (b) => out.push(b));
    child.stderr.on('data', (b) => err.push(b));
    child.on('error', reject);
    child.on('close', (status, signal) => resolve({ status, signal, stdout: Buffer.concat(out).toString('utf8'), stderr: Buffer.concat(err).toString('utf8') }));
  });
/** The jobs run `width` at a time; their results in the jobs' order. */
async function inPool(jobs, width) {
  const results = new Array(jobs.length);
  let next = 0;
  const worker = async () => {
    while (next < jobs.length) {
      const i = next++;
      results[i] = await jobs[i]();
    }
  };
  await Promise.all(Array.from({ length: Math.max(1, Math.min(width, jobs.length)) }, worker));
  return results;
}
const pnpm = process.platform === 'win32' ? 'pnpm.cmd' : 'pnpm';
const npm = process.platform === 'win32' ? 'npm.cmd' : 'npm';

/**
 * The entry points whose READMEs say they run in browsers ('What runs where'); the others
 * are Node only (files, FFI, Dawn, worker threads) or test tooling.
 */
const BROWSER_ENTRIES = [
  '@crisp/core',
  '@crisp/reference',
  '@crisp/reference/f64',
  '@crisp/router',
  '@crisp/select',
  '@crisp/presets',
  '@crisp/synth',
  '@crisp/parallel',
  '@crisp/kernels-webgpu',
  '@crisp/tfjs',
];

// 1. the publishable packages, built and packed
const workspace = JSON.parse(execFileSync(pnpm, ['ls', '-r', '--depth', '-1', '--json'], { cwd: root, encoding: 'utf8' }));
const published = workspace.filter((p) => !p.private && p.path !== root.replace(/\/$/, ''));
if (published.length === 0) throw new Error('no publishable workspace package found');
const build = run(pnpm, ['exec', 'turbo', 'run', 'build', '--output-logs=errors-only', ...published.map((p) => `--filter=${p.name}`)], {
  cwd: root,
  stdio: 'inherit',
});
if (build.status !== 0) {
  console.error('pack-check: the build failed');
  process.exit(1);
}
const scratch = mkdtempSync(join(tmpdir(), 'crisp-pack-check-'));
const packs = join(scratch, 'tarballs');
mkdirSync(packs);
const rootPkg = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8'));
const rootLicense = readFileSync(join(root, 'LICENSE'), 'utf8');
const tarballs = [];
for (const p of published) {
  const r = run(pnpm, ['pack', '--pack-destination', packs, '--json'], { cwd: p.path });
  if (r.status !== 0) {
    problems.push(`${p.name}: pnpm pack failed: ${r.stderr || r.stdout}`);
    continue;
  }
  const file = JSON.parse(r.stdout).filename;
  const files = readTarball(readFileSync(file));
  const pkg = JSON.parse(files.get('package.json')?.toString('utf8') ?? '{}');
  const folder = relative(root, p.path).split('\\').join('/');
  const text = (f) => files.get(f)?.toString('utf8');
  const found = [
    ...forbiddenFiles(files.keys()).map((f) => `ships ${f}`),
    ...exportTargets(pkg.exports)
      .filter((f) => !files.has(f))
      .map((f) => `exports ${f}, which is not in the tarball`),
    ...manifestProblems(pkg, { folder, repositoryUrl: rootPkg.repository?.url, readme: text('README.md'), license: text('LICENSE'), rootLicense }),
  ];
  for (const f of found) problems.push(`${p.name}: ${f}`);
  tarballs.push({ name: p.name, file, pkg, files });
}
say(`packed ${tarballs.length} packages (${published.map((p) => p.name).join(', ')})`);

// 2. a scratch project outside the workspace, installed from the tarballs
const app = join(scratch, 'app');
mkdirSync(app);
writeFileSync(join(app, 'package.json'), `${JSON.stringify({ name: 'crisp-first-use', private: true, type: 'module' }, null, 2)}\n`);
const install = run(npm, ['install', '--no-audit', '--no-fund', '--prefer-offline', '--ignore-scripts', '--loglevel=error', ...tarballs.map((t) => t.file)], {
  cwd: app,
});
if (install.status !== 0) {
  problems.push(`npm install of the tarballs failed:\n${install.stderr}${install.stdout}`);
} else {
  const lock = JSON.parse(readFileSync(join(app, 'package-lock.json'), 'utf8'));
  for (const [where, entry] of Object.entries(lock.packages ?? {})) {
    if (/node_modules\/@crisp\//.test(where) && !String(entry.resolved ?? '').startsWith('file:')) {
      problems.push(`${where} was installed from ${entry.resolved}, not from its tarball`);
    }
  }
  const thirdParty = Object.keys(lock.packages ?? {}).filter((k) => k && !k.includes('node_modules/@crisp/') && existsSync(join(app, k)));
  say(`installed with npm (${thirdParty.length} third-party packages: ${thirdParty.map((k) => k.replace(/^.*node_modules\//, '')).join(', ')})`);

  // every entry point imports in plain Node; one that needs a missing optional peer must say so
  const probe = join(app, 'imports.mjs');
  const entries = tarballs.flatMap((t) => Object.keys(t.pkg.exports ?? { '.': {} }).map((sub) => ({ spec: sub === '.' ? t.name : `${t.name}/${sub.slice(2)}`, t })));
  writeFileSync(
    probe,
    `const out = {};\nfor (const spec of ${JSON.stringify(entries.map((e) => e.spec))}) {\n  try { out[spec] = { ok: Object.keys(await import(spec)).length }; }\n  catch (e) { out[spec] = { code: e.code, message: String(e.message).split('\\n')[0] }; }\n}\nconsole.log(JSON.stringify(out));\n`,
  );
  const imported = run(process.execPath, [probe], { cwd: app, timeout: 60_000 });
  const results = imported.status === 0 ? JSON.parse(imported.stdout) : {};
  if (imported.status !== 0) problems.push(`importing the entry points failed: ${imported.stderr}`);
  entryProblems(entries, results, 'import');
  // the same from a CommonJS app, where Node's require() loads ES modules (20.19+, 22.12+):
  // an entry with top-level await anywhere in its graph would fail there
  if (process.features.require_module) {
    const cjs = join(app, 'requires.cjs');
    writeFileSync(cjs, readFileSync(probe, 'utf8').replace('await import(spec)', 'require(spec)'));
    const required = run(process.execPath, ['--no-warnings', cjs], { cwd: app, timeout: 60_000 });
    if (required.status !== 0) problems.push(`requiring the entry points failed: ${required.stderr}`);
    else entryProblems(entries, JSON.parse(required.stdout), 'require');
  }
  // @crisp/kernels-cuda bundled into one CommonJS file (esbuild --format=cjs, as for a
  // single-file CLI or a Node single executable), koffi left beside it: import.meta.url is
  // empty there, and the backend must still find koffi rather than report CUDA missing
  if (tarballs.some((t) => t.name === '@crisp/kernels-cuda')) {
    const esbuild = createRequire(join(root, 'package.json'))('esbuild');
    writeFileSync(
      join(app, 'cuda-bundle-entry.mjs'),
      [
        "import { cudaAvailability, defaultKernelDir } from '@crisp/kernels-cuda';",
        'let kernelDir;',
        'try { kernelDir = defaultKernelDir(); } catch (e) { kernelDir = e.code ?? String(e); }',
        'console.log(JSON.stringify({ ...cudaAvailability(), kernelDir }));',
        '',
      ].join('\n'),
    );
    const outfile = join(app, 'cuda-bundle.cjs');
    esbuild.buildSync({ entryPoints: [join(app, 'cuda-bundle-entry.mjs')], bundle: true, platform: 'node', format: 'cjs', external: ['koffi'], outfile, logLevel: 'silent' });
    const r = run(process.execPath, [outfile], { cwd: app, timeout: 60_000 });
    let avail = {};
    try {
      avail = JSON.parse(r.stdout);
    } catch {
      // reported below
    }
    if (!avail.available && !/libcuda|driver/.test(avail.reason ?? '')) {
      problems.push(`@crisp/kernels-cuda in a CommonJS bundle: cudaAvailability() should fail only for want of a driver, got ${r.stdout}${r.stderr}`);
    }
    // no kernels/ folder beside a bundle: a typed error, not a TypeError from new URL()
    if (avail.kernelDir !== 'UNSUPPORTED') problems.push(`@crisp/kernels-cuda in a CommonJS bundle: defaultKernelDir() should be UNSUPPORTED, got ${avail.kernelDir}`);
  }
  if (results['@crisp/kernels-webgpu/node']?.ok) {
    const dawn = join(app, 'dawn.mjs');
    writeFileSync(
      dawn,
      "import { createNodeWebGpuBackend } from '@crisp/kernels-webgpu/node';\ncreateNodeWebGpuBackend().then(() => console.log('created'), (e) => console.log(JSON.stringify({ code: e.code, message: e.message })));\n",
    );
    const r = run(process.execPath, [dawn], { cwd: app, timeout: 60_000, env: { ...process.env, CRISP_WEBGPU_SKIP_LOADER_CHECK: '1' } });
    let e = {};
    try {
      e = JSON.parse(r.stdout);
    } catch {
      // reported below
    }
    if (e.code !== 'BACKEND_UNAVAILABLE' || !/npm i webgpu@/.test(e.message ?? '')) {
      problems.push(`@crisp/kernels-webgpu/node without webgpu installed: expected BACKEND_UNAVAILABLE with "npm i webgpu@...", got ${r.stdout}${r.stderr}`);
    }
  }
  say(`imported ${entries.length} entry points${process.features.require_module ? ', required them from CommonJS' : ''}${tarballs.some((t) => t.name === '@crisp/kernels-cuda') ? ', ran @crisp/kernels-cuda bundled as CommonJS' : ''}`);

  // the browser entry points through a production Vite build from the tarballs' dist (the
  // workspace's pages build from the TypeScript sources): nothing in their graphs may import
  // a Node built-in, koffi or the webgpu package. Every export kept (namespace imports), so
  // tree-shaking hides nothing.
  const browserEntries = entries.map((e) => e.spec).filter((spec) => BROWSER_ENTRIES.includes(spec));
  const vite = await import(pathToFileURL(createRequire(join(root, 'package.json')).resolve('vite')).href);
  const page = join(app, 'page');
  mkdirSync(page);
  writeFileSync(join(page, 'index.html'), '<!doctype html>\n<script type="module" src="./main.js"></script>\n');
  writeFileSync(join(page, 'main.js'), `${browserEntries.map((spec, i) => `import * as m${i} from '${spec}';`).join('\n')}\nconsole.log(${browserEntries.map((_, i) => `m${i}`).join(', ')});\n`);
  const leaks = new Set();
  const nodeOnly = (source) => /^node:/.test(source) || source === 'koffi' || source === 'webgpu' || builtinModules.includes(source);
  const watch = {
    name: 'node-only-imports',
    enforce: 'pre',
    resolveId(source, importer) {
      if (importer?.includes('/node_modules/@crisp/') && nodeOnly(source)) leaks.add(`${importer.replace(/^.*\/node_modules\//, '')} imports ${source}`);
      return null;
    },
  };
  try {
    await vite.build({ root: page, configFile: false, logLevel: 'silent', plugins: [watch], build: { target: 'es2022', outDir: 'dist', write: false, reportCompressedSize: false } });
    for (const l of leaks) problems.push(`the Vite build of the browser entry points: ${l}`);
    say(`built ${browserEntries.length} browser entry points with Vite`);
  } catch (e) {
    problems.push(`vite build of the browser entry points failed: ${e.message}`);
  }

  // 3. the README examples, as a user compiles and runs them: the root README's, whose
  // output is checked, and @crisp/core's, which must run to the end
  const examples = [
    { readme: 'README.md', heading: 'Use it', file: 'use-it', check: exampleOutputProblems },
    { readme: 'packages/core/README.md', heading: 'Example', file: 'core-example', check: (out) => (/NON_FINITE/.test(out) ? [] : ['no NON_FINITE line']) },
  ];
  for (const ex of examples) writeFileSync(join(app, `${ex.file}.ts`), extractExample(readFileSync(join(root, ex.readme), 'utf8'), ex.heading));
  // every entry point's declarations, as a strict project without skipLibCheck reads them
  // (an entry whose declarations name an optional peer needs that peer installed: left out)
  // (one program a package: a package's declarations must not lean on globals that only
  // another package's dependencies bring)
  const typed = entries.filter(({ spec, t }) => !declarationsNeedOptionalPeer(t, spec));
  const typedPackages = [...new Set(typed.map((e) => e.t.name))];
  const typesFile = (name) => `types-${name.replace(/[@/]/g, '_')}.ts`;
  for (const name of typedPackages) {
    const mine = typed.filter((e) => e.t.name === name);
    writeFileSync(join(app, typesFile(name)), `${mine.map((e, i) => `import type * as entry${i} from '${e.spec}';\nexport type Entry${i} = typeof entry${i};`).join('\n')}\n`);
  }
  const tsconfig = {
    compilerOptions: {
      module: 'nodenext',
      target: 'es2022',
      strict: true,
      noUncheckedIndexedAccess: true,
      exactOptionalPropertyTypes: true,
      skipLibCheck: false,
      types: [],
      outDir: 'out',
    },
    files: examples.map((ex) => `${ex.file}.ts`),
  };
  writeFileSync(join(app, 'tsconfig.json'), `${JSON.stringify(tsconfig, null, 2)}\n`);
  const tsc = createRequire(join(root, 'package.json')).resolve('typescript/bin/tsc');
  // the declarations in a project with the @types packages a Node user has (@types/node from
  // the workspace: the Node entries' declarations name node: modules)
  const nodeTypes = { ...tsconfig.compilerOptions, types: undefined, typeRoots: [join(app, 'node_modules/@types'), join(root, 'node_modules/@types')], noEmit: true };
  // each package's declarations alone, the node10 program and the examples: independent tsc
  // programs, run as many at a time as there are cores
  const typesConfig = (name) => `tsconfig.types-${name.replace(/[@/]/g, '_')}.json`;
  for (const name of typedPackages) {
    writeFileSync(join(app, typesConfig(name)), `${JSON.stringify({ compilerOptions: nodeTypes, files: [typesFile(name)] }, null, 2)}\n`);
  }
  // the same entry points found by TypeScript's older resolution ("moduleResolution": "node",
  // which reads no `exports`: subpaths need the manifest's typesVersions), as a project that
  // has not moved to nodenext or bundler resolution imports them
  const node10Config = {
    compilerOptions: { ...nodeTypes, module: 'esnext', moduleResolution: 'node10' },
    files: typedPackages.map(typesFile),
  };
  writeFileSync(join(app, 'tsconfig.node10.json'), `${JSON.stringify(node10Config, null, 2)}\n`);
  const tscOf = (project) => () => runAsync(process.execPath, [tsc, '-p', project], { cwd: app });
  const programs = await inPool(
    [...typedPackages.map((name) => tscOf(join(app, typesConfig(name)))), tscOf(join(app, 'tsconfig.node10.json')), tscOf(app)],
    availableParallelism(),
  );
  const compiled = programs.pop();
  const node10 = programs.pop();
  let declaredOk = 0;
  typedPackages.forEach((name, i) => {
    const declared = programs[i];
    if (declared.status !== 0) problems.push(`${name}: its declarations do not compile in a strict project without skipLibCheck:\n${declared.stdout}${declared.stderr}`);
    else declaredOk++;
  });
  say(`compiled the declarations of ${declaredOk} of ${typedPackages.length} packages, each alone (${entries.length - typed.length} entry points need an optional peer)`);
  if (node10.status !== 0) problems.push(`an entry point's declarations are not found or do not compile under "moduleResolution": "node" (a subpath without typesVersions?):\n${node10.stdout}${node10.stderr}`);
  else say(`resolved and compiled the declarations of all ${typed.length} typed entry points under "moduleResolution": "node"`);
  if (compiled.status !== 0) {
    problems.push(`the README examples do not compile (strict, module nodenext, target ES2022, no skipLibCheck):\n${compiled.stdout}${compiled.stderr}`);
  } else {
    say(`compiled ${examples.length} README examples`);
    for (const ex of examples) {
      const where = `${ex.readme}'s '${ex.heading}' example`;
      const ran = run(process.execPath, [join(app, 'out', `${ex.file}.js`)], { cwd: app, timeout: 240_000 });
      if (ran.status !== 0) problems.push(`${where} failed (exit ${ran.status ?? ran.signal}):\n${ran.stderr}`);
      else {
        for (const p of ex.check(ran.stdout)) problems.push(`${where}: ${p}`);
        say(`ran ${where} on the reference backend: ${ran.stdout.replace(/\s+/g, ' ').trim().slice(0, 200)}`);
      }
    }
  }
}

/** Records the entry points that `how` ('import' or 'require') failed to load, but for a missing optional peer. */
function entryProblems(entries, results, how) {
  for (const { spec, t } of entries) {
    const r = results[spec];
    if (!r || r.ok > 0) continue;
    const missingPeer = r.code === 'ERR_MODULE_NOT_FOUND' && optionalPeers(t.pkg).some((d) => r.message.includes(`'${d}'`));
    if (!missingPeer) problems.push(`${how}('${spec}') failed: ${r.code ?? ''} ${r.message ?? 'no exports'}`);
  }
}

/** A manifest's optional peer dependencies. */
function optionalPeers(pkg) {
  return Object.keys(pkg.peerDependenciesMeta ?? {}).filter((d) => pkg.peerDependenciesMeta[d]?.optional);
}

/** Whether the declarations of entry `spec` of tarball `t` import one of its optional peers. */
function declarationsNeedOptionalPeer(t, spec) {
  const sub = spec === t.name ? '.' : `./${spec.slice(t.name.length + 1)}`;
  const types = t.pkg.exports?.[sub]?.types;
  const text = types ? t.files.get(types.replace(/^\.\//, ''))?.toString('utf8') ?? '' : '';
  return optionalPeers(t.pkg).some((d) => text.includes(`'${d}'`) || text.includes(`"${d}"`) || text.includes(`'${d}/`) || text.includes(`"${d}/`));
}

if (keep) say(`kept ${scratch}`);
else rmSync(scratch, { recursive: true, force: true });
if (problems.length) {
  console.error(`pack-check: ${problems.length} problem(s):\n${problems.map((p) => `  - ${p}`).join('\n')}`);
  process.exit(1);
}
say(`all checks passed on ${tarballs.length} tarballs`);
