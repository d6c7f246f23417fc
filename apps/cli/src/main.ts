/**
 * The `crisp` command: run (the main job), report (one self-contained HTML page), calibrate.
 * Exit codes: 0 ok, 1 runtime error (a CrispError prints its code), 2 bad usage or flags.
 */
import { realpathSync } from 'node:fs';
import { pathToFileURL } from 'node:url';
import { Command, CommanderError, Option } from 'commander';
import { CrispError, isCrispError } from '@crisp/core';
import { ALL_PROFILE_NAMES } from '@crisp/synth';
import { serveSynthChunks, setSynthWorkerEntry } from '@crisp/synth/node';
import { BACKEND_CHOICES, type BackendChoice } from './backends.js';
import { calibrateCommand } from './calibrate-command.js';
import { serveCheckRows } from './check-workers.js';
import { type CliIo, EXIT_OK, EXIT_RUNTIME, EXIT_USAGE, processIo, UsageError } from './cli-io.js';
import { formatRun, toJson } from './format.js';
import { openLayers } from './layers.js';
import { checkOutDir, formatModel, modelJson, runModel } from './model-run.js';
import { checkOutputPath } from './out-file.js';
import { type QkvNameFlags, choiceFlag, dtypeFlag, intFlag, layoutFlag, namesFlag, numFlag, pathFlag } from './options.js';
import { PRESET_NAMES } from './policy.js';
import { reportCommand } from './report.js';
import { cliVersion } from './version.js';
import { type RunOptions, type ScenarioChoice, runJob } from './run-job.js';

export { runJob, type RunOptions, type RunSummary } from './run-job.js';

interface CommonFlags {
  backend: BackendChoice;
  preset: string;
  alpha?: number;
  gamma?: number;
  tauProxy?: number;
  block?: number;
  seed: number;
  n?: number;
  heads?: number;
  kvHeads?: number;
  headDim?: number;
  dtype?: RunOptions['dtype'];
  profile: string;
  qkv?: string;
  layout?: string;
  names?: QkvNameFlags;
  npyUint16?: 'bf16';
  sampleRows?: number;
  repeats?: number;
  gate: boolean;
  dense: boolean;
  threads?: number;
  json?: boolean;
}

interface RunFlags extends CommonFlags {
  out?: string;
  outLse?: boolean;
  outPlan?: boolean;
}

function addProblemFlags(cmd: Command): Command {
  return cmd
    .addOption(
      new Option('--backend <name>', 'auto (CUDA, then WebGPU, then reference), cuda, webgpu or reference')
        .default('auto')
        .argParser(choiceFlag('--backend', BACKEND_CHOICES)),
    )
    .addOption(
      new Option('--profile <name>', `scenario profile: ${ALL_PROFILE_NAMES.join(', ')} (the last two reproduce hard routing's failures)`)
        .default('llama-like')
        .argParser(choiceFlag('--profile', ALL_PROFILE_NAMES)),
    )
    .option('--n <tokens>', 'sequence length (default: fit for the backend; 4096 on the reference)', intFlag('--n', 1, 2 ** 26))
    .option('--heads <H>', 'query heads (default: fit for the backend)', intFlag('--heads', 1, 1024))
    .option('--kv-heads <Hkv>', 'kv heads, H % Hkv == 0 (default H / 4 rounded down, at least 1; it must divide H)', intFlag('--kv-heads', 1, 1024))
    .option('--head-dim <d>', 'head dim (default 64 on the reference, 128 on GPUs)', intFlag('--head-dim', 32, 1024))
    .option('--dtype <dtype>', 'f32, f16 or bf16 (default: the backend\'s)', dtypeFlag)
    .option('--seed <int>', 'scenario seed', intFlag('--seed', 0, 2 ** 32 - 1), 1);
}

function addPolicyFlags(cmd: Command): Command {
  return cmd
    .addOption(
      new Option('--preset <name>', `policy: ${PRESET_NAMES.join(', ')}`).default('crisp').argParser(choiceFlag('--preset', PRESET_NAMES)),
    )
    .option('--alpha <α>', 'noise-floor multiplier α (crisp presets; default the preset\'s: crisp 1.0, crispFast 1.25, crispGuarded 1.0; crispGuarded: its VS heads\' floor, its PE heads\' lists stay at 1.0)', numFlag('--alpha', 0, 1e6, true))
    .option('--gamma <γ>', 'coverage γ of the PE path (and of FlexPrefill\'s VS path); default 0.95', numFlag('--gamma', 0, 1, true))
    .option('--tau-proxy <τ>', 'C_struct routing threshold τ_proxy (crisp presets; default 0.2)', numFlag('--tau-proxy', 0, 1, true))
    .addOption(new Option('--block <B>', 'block size B: 64 or 128').default(128).argParser(choiceFlag('--block', ['64', '128'] as const)))
    .option(
      '--qkv <file>',
      'run on a Q/K/V dump instead of a scenario: one layer (a safetensors file, or a directory of q/k/v .npy files) or a whole model (a directory of layer_NN.safetensors files, or files whose tensor names carry the layer, model.layers.N.q; every layer in order)',
      pathFlag('--qkv', 'a safetensors file or a directory of .npy or layer files'),
    )
    .addOption(
      new Option('--layout <layout>', "how --qkv stores tensors: nhd ([n,H,d]), 1nhd ([1,n,H,d]) or hnd ([H,n,d]); '[n,H,d]' and the like also work")
        .default('nhd')
        .argParser(layoutFlag),
    )
    .option(
      '--names <q=NAME,k=NAME,v=NAME>',
      'which --qkv tensors (safetensors names, or .npy file stems) are q, k and v, when the file does not use q/k/v or a known alias',
      namesFlag,
    )
    .addOption(
      new Option('--npy-uint16 <as>', "what uint16 ('<u2') .npy arrays of --qkv hold: bf16 (bit patterns, as torch x.view(torch.uint16) saves)").argParser(
        choiceFlag('--npy-uint16', ['bf16'] as const),
      ),
    )
    .option('--sample-rows <count>', 'query rows with exact attention for mass recall (default 64; 16 on GPUs)', intFlag('--sample-rows', 1, 1e6))
    .option('--repeats <count>', 'timed runs after a warm-up (default 3 on GPUs, 1 on the reference)', intFlag('--repeats', 1, 100))
    .option('--no-gate', "ignore the backend's dense/sparse length gate (always take the sparse path)")
    .option('--threads <count>', 'host threads generating the scenario (default: the cores less one, at most 16, for scenarios of 16M+ q values)', intFlag('--threads', 1, 256))
    .option('--no-dense', 'skip the dense baseline: no output error and no speedup (the output says so; JSON has dense: null)');
}

function scenarioChoice(f: CommonFlags): ScenarioChoice {
  return {
    backend: f.backend,
    profile: f.profile,
    n: f.n,
    heads: f.heads,
    kvHeads: f.kvHeads,
    headDim: f.headDim,
    dtype: f.dtype,
    seed: f.seed,
    threads: f.threads,
  };
}

/** Flags the user typed (not defaults), in command-line spelling. */
function givenFlags(cmd: Command, keys: readonly [key: string, flag: string][]): string[] {
  return keys.filter(([key]) => cmd.getOptionValueSource(key) === 'cli').map(([, flag]) => flag);
}

const SCENARIO_FLAGS: readonly [string, string][] = [
  ['profile', '--profile'],
  ['n', '--n'],
  ['heads', '--heads'],
  ['kvHeads', '--kv-heads'],
  ['headDim', '--head-dim'],
  ['seed', '--seed'],
  ['threads', '--threads'],
];
const DUMP_FLAGS: readonly [string, string][] = [
  ['layout', '--layout'],
  ['names', '--names'],
  ['npyUint16', '--npy-uint16'],
];

/** Flags that cannot act together are refused, never silently dropped. */
function checkFlagMix(cmd: Command, f: CommonFlags): void {
  if (f.qkv !== undefined) {
    const ignored = givenFlags(cmd, SCENARIO_FLAGS);
    if (ignored.length > 0) {
      throw new UsageError(
        `${ignored.join(', ')} ${ignored.length === 1 ? 'describes' : 'describe'} a generated scenario and ${ignored.length === 1 ? 'does' : 'do'} not apply with --qkv (the dump gives the shape); drop ${ignored.length === 1 ? 'it' : 'them'} or drop --qkv`,
      );
    }
  } else {
    const orphans = givenFlags(cmd, DUMP_FLAGS);
    if (orphans.length > 0) throw new UsageError(`${orphans.join(', ')} only ${orphans.length === 1 ? 'applies' : 'apply'} with --qkv FILE`);
  }
}

function runOptions(f: CommonFlags, compare?: string[]): RunOptions {
  if (f.heads !== undefined && f.kvHeads !== undefined && f.heads % f.kvHeads !== 0) {
    throw new UsageError(`--heads (${f.heads}) must be a multiple of --kv-heads (${f.kvHeads})`);
  }
  if (f.heads !== undefined && f.kvHeads === undefined && f.heads % Math.max(1, Math.floor(f.heads / 4)) !== 0) {
    throw new UsageError(`--heads ${f.heads} has no default kv-head count (H / 4 rounded down, ${Math.max(1, Math.floor(f.heads / 4))}, does not divide it); pass --kv-heads`);
  }
  return {
    ...scenarioChoice(f),
    preset: f.preset,
    overrides: { alpha: f.alpha, gamma: f.gamma, tauProxy: f.tauProxy, blockSize: Number(f.block ?? 128) },
    compare,
    qkv: f.qkv,
    layout: f.layout,
    names: f.names,
    npyUint16: f.npyUint16,
    sampleRows: f.sampleRows,
    repeats: f.repeats,
    gate: f.gate,
    dense: f.dense,
  };
}


function program(io: CliIo): Command {
  const prog = new Command('crisp')
    .description('CRISP sparse prefill: run one layer against dense, write a report, calibrate scenarios')
    .exitOverride()
    .configureOutput({
      writeOut: (s) => io.stdout.write(s),
      writeErr: (s) => io.stderr.write(s),
      // One line: "crisp: unknown option '--bogus' (see --help)".
      outputError: (s, write) => write(`crisp: ${oneLine(s.replace(/^error: /, ''))} (see --help)\n`),
    });

  // Like commander's .version(), but package.json is read only when the flag is given.
  prog.option('-V, --version', "print crisp's version (apps/cli's package.json) and exit");
  prog.on('option:version', () => {
    io.stdout.write(`${cliVersion()}\n`);
    throw new CommanderError(EXIT_OK, 'commander.version', cliVersion());
  });

  const run = prog
    .command('run')
    .description(
      'the main job: a scenario (or --qkv dump) through the chosen policy and through dense on the same backend; prints per-head routing, density, mass recall, output error and time',
    )
    .option('--json', 'machine-readable output on stdout only')
    .option(
      '--out <file>',
      "write the preset's attention output as safetensors (tensor 'output' [n, H, d], the run's dtype), streamed and atomic; with a model dump (--qkv DIR) a directory that gets layer_NN.safetensors per layer",
      pathFlag('--out', 'a file path'),
    )
    .option('--out-lse', "with --out: also 'lse' f32 [H, n], the natural-log log-sum-exp per head and query row")
    .option('--out-plan', "with --out: also the plan: 'plan.routes' int8 [H] (0 VS, 1 PE), 'plan.vertical'/'plan.slash' int32 with their '_ptr' offsets, 'plan.rows.rowPtr'/'plan.rows.cols' int32, 'plan.density' f32");
  addPolicyFlags(addProblemFlags(run));
  run.action(async (f: RunFlags, cmd: Command) => {
    checkFlagMix(cmd, f);
    if ((f.outLse || f.outPlan) && f.out === undefined) {
      throw new UsageError(`${f.outLse ? '--out-lse' : '--out-plan'} adds to the file --out writes; pass --out FILE`);
    }
    const opts = runOptions(f);
    const extra = { lse: Boolean(f.outLse), plan: Boolean(f.outPlan) };
    // A whole model (checked from its headers before any backend work), or one layer.
    const set = f.qkv !== undefined ? await openLayers(f.qkv, { layout: f.layout, names: f.names, npyUint16: f.npyUint16, dtype: f.dtype }) : undefined;
    if (set) {
      let outDir: string | undefined;
      try {
        outDir = f.out !== undefined ? await checkOutDir(f.out, set) : undefined;
      } catch (e) {
        await set.close();
        throw e;
      }
      const m = await runModel(opts, set, io, outDir, extra);
      io.stdout.write(f.json ? `${toJson(modelJson(m))}\n` : formatModel(m));
      return;
    }
    const out = f.out !== undefined ? { path: await checkOutputPath('--out', f.out, 'crisp-out.safetensors'), ...extra } : undefined;
    const summary = await runJob({ ...opts, out }, io);
    io.stdout.write(f.json ? `${toJson(summary)}\n` : formatRun(summary));
  });

  const report = prog
    .command('report')
    .description(
      'write one self-contained HTML page (plotly inlined, no network): block masses on a log axis with the γ cut and the α·μ floor, block masks per policy, C_struct vs JSD, density and error per head',
    )
    .option('--out <file>', 'where to write the page', 'crisp-report.html')
    .option('--compare <presets>', 'other presets to run on the same inputs, comma-separated, or the flag repeated (default flexPrefill)', (v: string, acc: string[] = []) => [...acc, v])
    .option('--from <run.json...>', 'render `crisp run --json` results instead of running (several sizes add plots against n)', (v: string, acc: string[] = []) => [...acc, pathFlag('--from', 'a run JSON file')(v)])
    .option('--sweep', "also sweep α and γ on the reference backend for the run's scenario (capped at n=2048) and plot mass recall against density");
  addPolicyFlags(addProblemFlags(report));
  report.action(async (f: CommonFlags & { out: string; compare?: string[]; from?: string[]; sweep?: boolean }, cmd: Command) => {
    checkFlagMix(cmd, f);
    const compare = (f.compare ?? ['flexPrefill'])
      .join(',')
      .split(',')
      .map((s) => s.trim())
      .filter(Boolean);
    for (const c of compare) choiceFlag('--compare', PRESET_NAMES)(c);
    const twice = compare.find((c, i) => compare.indexOf(c) !== i);
    if (twice !== undefined) throw new UsageError(`--compare names ${twice} twice; list each preset once`);
    const runFlags = cmd.options.filter((x) => !['out', 'from', 'sweep'].includes(x.attributeName()) && cmd.getOptionValueSource(x.attributeName()) === 'cli');
    await reportCommand(runOptions(f, compare), f.out, io, { from: f.from, sweep: f.sweep, runFlags: runFlags.map((x) => x.long ?? x.flags) });
  });

  const cal = prog
    .command('calibrate')
    .description(
      'print per-head sink mass, C_struct, top-1 block place and block-mass percentiles of a scenario, against the paper\'s targets',
    )
    .option('--json', 'machine-readable output on stdout only')
    .addOption(new Option('--block <B>', 'block size B: 64 or 128').default(128).argParser(choiceFlag('--block', ['64', '128'] as const)))
    .option('--tau-proxy <τ>', 'C_struct threshold that makes a head VS (default 0.2)', numFlag('--tau-proxy', 0, 1, true));
  addProblemFlags(cal);
  cal.action(async (f: CommonFlags & { block: string }) => {
    // (calibrate has no --qkv, so checkFlagMix has nothing to refuse)
    runOptions({ ...f, gate: true, dense: true, preset: 'crisp' });
    await calibrateCommand(
      {
        ...scenarioChoice(f),
        blockSize: Number(f.block),
        tauProxy: f.tauProxy,
        json: Boolean(f.json),
      },
      io,
    );
  });
  return prog;
}

/** Parse argv (process.argv shape: [node, script, ...args]) and run; resolves to the exit code. */
export async function main(argv: readonly string[], io: CliIo = processIo): Promise<number> {
  const prog = program(io);
  if (argv.length <= 2) {
    prog.outputHelp({ error: true });
    return EXIT_USAGE;
  }
  // `crisp help NAME` for a command that does not exist: say so, as `crisp NAME` does
  if (argv[2] === 'help' && argv.length > 3 && !prog.commands.some((c) => c.name() === argv[3] || c.aliases().includes(argv[3]))) {
    io.stderr.write(`crisp: unknown command '${argv[3]}'; the commands are ${prog.commands.map((c) => c.name()).join(', ')} (see --help)\n`);
    return EXIT_USAGE;
  }
  try {
    await prog.parseAsync([...argv]);
    return EXIT_OK;
  } catch (e) {
    if (e instanceof CommanderError) {
      if (e.code === 'commander.helpDisplayed' || e.code === 'commander.version' || e.exitCode === 0) return EXIT_OK;
      return EXIT_USAGE;
    }
    if (e instanceof UsageError) {
      io.stderr.write(`crisp: ${e.message} (see --help)\n`);
      return EXIT_USAGE;
    }
    return reportError(e, io);
  }
}

function oneLine(s: string): string {
  return s.trim().replace(/\s*\n\s*/g, ' ');
}

/** Host allocation failures that slipped past the limit checks (a JS engine's RangeError). */
const ALLOCATION = /Invalid typed array length|Array buffer allocation failed|Invalid array length|Invalid string length/;

/** Prints a runtime error the command's way and returns its exit code (1). Never a stack, unless CRISP_DEBUG=1. */
export function reportError(e: unknown, io: CliIo): number {
  const debug = process.env.CRISP_DEBUG === '1';
  if (isCrispError(e)) {
    io.stderr.write(`crisp: error ${e.code}: ${e.message}\n`);
  } else if (e instanceof RangeError && ALLOCATION.test(e.message)) {
    const err = new CrispError('LIMIT_EXCEEDED', `the host could not allocate an array (${e.message}); pass a smaller --n, --heads or --sample-rows`);
    io.stderr.write(`crisp: error ${err.code}: ${err.message}\n`);
  } else {
    const msg = e instanceof Error ? `${e.name}: ${e.message}` : String(e);
    io.stderr.write(`crisp: internal error: ${oneLine(msg)}${debug ? '' : ' (a bug in crisp; rerun with CRISP_DEBUG=1 for the stack and report it)'}\n`);
  }
  if (debug && e instanceof Error && e.stack) io.stderr.write(`${e.stack}\n`);
  return EXIT_RUNTIME;
}

/** The file this process started from (what worker threads run), or undefined when unknown. */
function entryUrl(script: string): URL | undefined {
  try {
    return pathToFileURL(realpathSync(script));
  } catch {
    return undefined;
  }
}

/**
 * The process entry (bin/crisp.js): runs main, sets the exit code, and turns anything that
 * escapes it (an unhandled rejection, an uncaught exception, a closed stdout) into a one-line
 * error and exit 1 instead of a stack trace.
 */
export function runProcess(argv: readonly string[] = process.argv, io: CliIo = processIo): void {
  // In a worker thread started to generate a scenario or compute exact rows, this entry does that and nothing else.
  if (serveSynthChunks() || serveCheckRows()) return;
  const entry = argv[1] ? entryUrl(argv[1]) : undefined;
  if (entry) setSynthWorkerEntry(entry);
  const fatal = (e: unknown) => {
    reportError(e, io);
    process.exit(EXIT_RUNTIME);
  };
  process.on('unhandledRejection', fatal);
  process.on('uncaughtException', fatal);
  // Ctrl-C (or a kill) ends the process through process.exit, whose 'exit' hook removes the
  // temporary file of a write under way (@crisp/io's writers): no half file is left.
  const interrupted = (signal: NodeJS.Signals, code: number) => () => {
    io.stderr.write(`crisp: interrupted (${signal}); nothing half-written was kept\n`);
    process.exit(code);
  };
  process.once('SIGINT', interrupted('SIGINT', 130));
  process.once('SIGTERM', interrupted('SIGTERM', 143));
  // `crisp run --json | head`: a closed pipe ends the command quietly.
  process.stdout.on('error', (e: NodeJS.ErrnoException) => {
    if (e.code === 'EPIPE') process.exit(process.exitCode ?? EXIT_OK);
    fatal(e);
  });
  main(argv, io).then((code) => {
    process.exitCode = code;
  }, fatal);
}
