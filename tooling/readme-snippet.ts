// Test helper: a README's code block run as a user pastes it. Its imports stay at the top of
// a module, its statements become the body of an async function that returns the names a
// test asks for, and esbuild bundles that module from the workspace sources (the
// "@crisp/source" condition: no build needed), resolving its imports as a file in
// `resolveDir` would. Only the `webgpu` package (Dawn, a native addon) stays outside the
// bundle, loaded from where @crisp/kernels-webgpu finds it.
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { build, type Plugin } from 'esbuild';

/**
 * The `index`-th ```ts or ```js block under the heading `heading` of a markdown file (up to
 * the next heading of the same or a higher level), without its fences.
 */
export function readmeBlock(file: string, heading: string, index = 0): string {
  const lines = readFileSync(file, 'utf8').split(/\r?\n/);
  const start = lines.findIndex((l) => /^#{1,6} /.test(l) && l.replace(/^#+ /, '').trim() === heading);
  if (start < 0) throw new Error(`${file}: no heading '${heading}'`);
  const level = (/^#+/.exec(lines[start]) ?? [''])[0].length;
  let seen = 0;
  for (let i = start + 1; i < lines.length; i++) {
    const h = /^(#{1,6}) /.exec(lines[i]);
    if (h && h[1].length <= level) break;
    if (/^```(ts|js)\s*$/.test(lines[i])) {
      const end = lines.findIndex((l, j) => j > i && /^```\s*$/.test(l));
      if (end < 0) throw new Error(`${file}: the code block under '${heading}' is not closed`);
      if (seen++ === index) return `${lines.slice(i + 1, end).join('\n')}\n`;
      i = end;
    }
  }
  throw new Error(`${file}: no code block ${index} under '${heading}'`);
}

/** The block's import declarations (each may span lines) apart from its other statements. */
function splitImports(code: string): { imports: string; body: string } {
  const imports: string[] = [];
  const body: string[] = [];
  let open = false;
  for (const line of code.split('\n')) {
    if (open || /^import[\s{*'"]/.test(line)) {
      imports.push(line);
      open = !/;\s*(\/\/.*)?$/.test(line);
    } else {
      body.push(line);
    }
  }
  const text = imports.join('\n');
  // Bundlers accept a name imported twice; TypeScript and Node do not.
  const names = [...text.matchAll(/import\s+(?:type\s+)?([\s\S]*?)\s+from\s/g)].flatMap((m) =>
    m[1]
      .replace(/[{}]/g, ',')
      .split(',')
      .map((s) => s.trim().replace(/^type\s+/, '').replace(/^\*\s+as\s+/, '').split(/\s+as\s+/).pop() ?? '')
      .filter(Boolean),
  );
  const twice = names.filter((n, i) => names.indexOf(n) !== i);
  if (twice.length > 0) throw new Error(`the block imports ${twice.join(', ')} twice`);
  return { imports: text, body: body.join('\n') };
}

const dawnOutside: Plugin = {
  name: 'dawn-outside',
  setup(b) {
    b.onResolve({ filter: /^webgpu$/ }, (args) => ({
      path: pathToFileURL(createRequire(join(args.resolveDir, 'index.js')).resolve('webgpu')).href,
      external: true,
    }));
  },
};

/**
 * Run `code` (a README block) and resolve with the values of `returns`, names the block
 * declares at its top level.
 */
export async function runBlock(code: string, opts: { readonly resolveDir: string; readonly returns: readonly string[] }): Promise<Record<string, unknown>> {
  const { imports, body } = splitImports(code);
  const contents = `${imports}\nexport async function block() {\n${body}\nreturn { ${opts.returns.join(', ')} };\n}\n`;
  const dir = mkdtempSync(join(tmpdir(), 'crisp-readme-block-'));
  try {
    const outfile = join(dir, 'block.mjs');
    await build({
      stdin: { contents, loader: 'ts', resolveDir: opts.resolveDir, sourcefile: 'readme-block.ts' },
      outfile,
      bundle: true,
      platform: 'node',
      format: 'esm',
      target: 'node20',
      conditions: ['@crisp/source'],
      plugins: [dawnOutside],
      logLevel: 'warning',
    });
    const mod = (await import(pathToFileURL(outfile).href)) as { block: () => Promise<Record<string, unknown>> };
    return await mod.block();
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}
