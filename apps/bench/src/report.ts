/** bench.md: the headline table first, then one section per suite, each with the command that reproduces it; headline.md: the latency headline alone, for the repository README. */
import { rowsOf } from './merge.js';
import { rooflineMarkdown } from './roofline.js';
import { alphaOfGuardedName, FLEX_PRESET_GAMMA, flexAtGammaName, gammaOfFlexName } from './suites/accuracy.js';
import { JIT_WARMUP_N, kernelTimesMarkdown, type LatencyRow } from './suites/latency.js';
import { parallelMarkdown } from './suites/parallel-report.js';
import { type ParityRow, parityMarkdown } from './suites/parity.js';
import { tfjsMarkdown } from './suites/tfjs.js';
import { varlenMarkdown } from './suites/varlen-report.js';
import type { BenchResult } from './result.js';
import type { PeerRow } from './peers.js';
import { kn, ms } from './format.js';

const f = (x: number | null | undefined, digits = 3): string => (x === null || x === undefined || !Number.isFinite(x) ? '–' : x.toFixed(digits));
const pct = (part: number, x: { ms: { median: number } }): string => `${((100 * part) / x.ms.median).toFixed(1)}%`;
/** A peer timed with its output past the check's tolerance shows its error beside its time. */
const pastTolerance = (x: PeerRow | undefined): string =>
  x?.beyondTolerance ? ` (rel. err ${x.beyondTolerance.maxRelError.toExponential(1)} > ${x.beyondTolerance.tolerance})` : '';
/** The sentence saying where plan and attention times come from separate runs (WebGPU). */
const serialNote = (rows: readonly { backend: string; planSplit?: 'serial' }[]): string => {
  const on = [...new Set(rows.filter((x) => x.planSplit === 'serial').map((x) => x.backend))];
  return on.length
    ? ` On ${on.join(' and ')} (no device marks: the plan's device work is queued, not waited for) the plan and attention times come from up to three more runs per preset and size that waited for the device after the plan and after the attention; the totals are the timed runs'. The plan's phases are not waited for apart there, so the statistics' device work lands in the later phases and no route+select+mask share is given.`
    : '';
};
const planShare = (x: { planMs: number; ms: { median: number } } | undefined): string => (x ? pct(x.planMs, x) : '–');
/**
 * The plan after its proxy statistics (docs/ALGORITHM.md, steps 2-3 and the mask: routing, selection,
 * PE rows, expansion) as a share of the total: planMs − statsMs, when the run split the plan.
 * Not for a plan timed by waiting for the device (planSplit 'serial', WebGPU): there the
 * statistics' device work is only queued when statsMs ends, and lands in the later phases.
 */
const afterStatsShare = (x: { planMs: number; planPhases?: Record<string, number>; planSplit?: 'serial'; ms: { median: number } } | undefined): string => {
  const st = x?.planPhases?.statsMs;
  return x && x.planSplit !== 'serial' && st !== undefined && Number.isFinite(st) ? pct(Math.max(0, x.planMs - st), x) : '–';
};

/** Every run whose rows this result holds: the earlier merged ones, then this one. */
export function runsOf(r: BenchResult): { command: string; startedAt: string; inProgress?: string }[] {
  return [...(r.earlierRuns ?? []), { command: r.command, startedAt: r.startedAt, inProgress: r.inProgress }];
}

/** The commands that produced a suite's rows (rows without a run belong to this result's own command). */
export function suiteCommands(r: BenchResult, suite: string): string[] {
  const rows = rowsOf(r).find((x) => x.suite === suite)?.rows ?? [];
  const ids = new Set(rows.map((x) => x.run ?? r.startedAt));
  const runs = runsOf(r).filter((x) => ids.has(x.startedAt));
  return runs.length ? runs.map((x) => x.command) : [r.command];
}

function producedBy(r: BenchResult, suite: string): string {
  const cmds = suiteCommands(r, suite);
  return `Reproduce: ${cmds.map((c) => `\`${c}\``).join(', then ')} (from the repository root${cmds.length > 1 ? '; each with --merge into the same --out' : ''}).`;
}

type AccRow = NonNullable<BenchResult['suites']['accuracy']>['rows'][number];

/**
 * crispGuarded against FlexPrefill at matched error: for each input the smallest γ of the
 * flexPrefill(γ=…) rows whose output error is within crispGuarded's, and its density. Empty
 * when the run measured no such rows (--acc-flex-gammas none, or results from before them).
 */
export function matchedErrorMarkdown(rows: readonly AccRow[]): string[] {
  const lines: string[][] = [];
  for (const group of byInput(rows)) {
    const s = sweepOf(group, gammaOfFlexName);
    if (!s) continue;
    const { guarded, flex, swept } = s;
    const all = [{ ...flex, policy: flexAtGammaName(FLEX_PRESET_GAMMA) }, ...swept];
    const match = all.find((x) => x.outputError <= guarded.outputError);
    const last = all[all.length - 1];
    const g = guarded;
    lines.push([
      g.backend,
      g.profile,
      kn(g.n),
      `${f(g.outputError, 4)} / ${f(g.density)}`,
      `${f(flex.outputError, 4)} / ${f(flex.density)}`,
      match
        ? `γ=${gammaOfFlexName(match.policy)}: ${f(match.outputError, 4)} / ${f(match.density)} (${f(match.density / g.density, 2)}x)`
        : `none up to γ=${gammaOfFlexName(last.policy)} (${f(last.outputError, 4)} / ${f(last.density)}, ${f(last.density / g.density, 2)}x the blocks at ${f(last.outputError / g.outputError, 1)}x the error)`,
    ]);
  }
  if (lines.length === 0) return [];
  return [
    '',
    `crispGuarded against FlexPrefill at matched error. FlexPrefill's knob is its coverage γ (${FLEX_PRESET_GAMMA} in the preset, for its VS and PE selections alike); the same inputs were planned at the γ listed in the config, and the last column is the smallest γ whose output error is within crispGuarded's, with its density and its blocks relative to crispGuarded's:`,
    '',
    table(['backend', 'profile', 'n', 'crispGuarded error / density', `flexPrefill (γ=${FLEX_PRESET_GAMMA}) error / density`, 'flexPrefill at crispGuarded\'s error'], lines),
  ];
}

/** The rows of each input (backend, profile, n), in first-seen order. */
function byInput(rows: readonly AccRow[]): AccRow[][] {
  const inputs = new Map<string, AccRow[]>();
  for (const x of rows) {
    const key = `${x.backend}|${x.profile}|${x.n}`;
    inputs.set(key, [...(inputs.get(key) ?? []), x]);
  }
  return [...inputs.values()];
}

/**
 * One input's crispGuarded and flexPrefill rows and its swept rows (the policies `sweptValue`
 * reads a value from), by that value ascending; undefined unless all three are there.
 */
function sweepOf(group: readonly AccRow[], sweptValue: (policy: string) => number | undefined): { guarded: AccRow; flex: AccRow; swept: AccRow[] } | undefined {
  const guarded = group.find((x) => x.policy === 'crispGuarded');
  const flex = group.find((x) => x.policy === 'flexPrefill');
  const swept = group.filter((x) => sweptValue(x.policy) !== undefined).sort((a, b) => sweptValue(a.policy)! - sweptValue(b.policy)!);
  return guarded && flex && swept.length > 0 ? { guarded, flex, swept } : undefined;
}

/** error / worst head / needles in output / density of one accuracy row */
const accCell = (x: AccRow): string =>
  `${f(x.outputError, 4)} / ${x.worstHeadError === undefined ? '–' : f(x.worstHeadError, 3)} / ${f(x.needleOutputRecall, 2)} / ${f(x.density)}`;

/**
 * crispGuarded against FlexPrefill at matched density, the other side of the trade: for each
 * input where crispGuarded keeps more blocks than flexPrefill, the smallest α of the
 * crispGuarded(VS α=…) rows whose density is within flexPrefill's, with its error, worst head
 * and needles. Empty when the run measured no such rows (--acc-guard-alphas none, or results
 * from before them) or crispGuarded is nowhere denser.
 */
export function matchedDensityMarkdown(rows: readonly AccRow[]): string[] {
  const lines: string[][] = [];
  for (const group of byInput(rows)) {
    const s = sweepOf(group, alphaOfGuardedName);
    if (!s || s.guarded.density <= s.flex.density) continue;
    const { guarded, flex, swept } = s;
    const match = swept.find((x) => x.density <= flex.density);
    const last = swept[swept.length - 1];
    lines.push([
      guarded.backend,
      guarded.profile,
      kn(guarded.n),
      accCell(flex),
      accCell(guarded),
      match
        ? `VS α=${alphaOfGuardedName(match.policy)}: ${accCell(match)}`
        : `none up to VS α=${alphaOfGuardedName(last.policy)} (${accCell(last)}: ${f(last.density / flex.density, 2)}x flexPrefill's blocks)`,
    ]);
  }
  if (lines.length === 0) return [];
  return [
    '',
    "crispGuarded against FlexPrefill at matched density, on the inputs where crispGuarded keeps more blocks. crispGuarded's knob is its VS heads' noise floor α (1.0 in the preset; its PE heads' lists stay at the preset's α through Policy.peVs, since they keep the needles the pooled map smooths away); the same inputs were planned at the α listed in the config, and the last column is the smallest α whose density is within flexPrefill's. Each cell: output error / worst head error / needles in output / density:",
    '',
    table(['backend', 'profile', 'n', `flexPrefill (γ=${FLEX_PRESET_GAMMA})`, 'crispGuarded (α=1)', "crispGuarded at flexPrefill's density"], lines),
  ];
}

function table(head: string[], rows: string[][]): string {
  return [`| ${head.join(' | ')} |`, `|${head.map(() => '---').join('|')}|`, ...rows.map((r) => `| ${r.join(' | ')} |`)].join('\n');
}

export function markdown(r: BenchResult): string {
  const m = r.machine;
  const out: string[] = [];
  out.push(`# CRISP bench: ${m.slug}`);
  out.push('');
  out.push(
    `${m.gpus.length ? `GPU: ${m.gpus.map((g) => `${g.name} (driver ${g.driver}, ${g.memory})`).join(', ')}; ` : ''}CPU: ${m.cpu.model} (${m.cpu.cores} cores), ${m.memoryGiB} GiB; ${m.os}; Node ${m.node}; ${r.startedAt}${m.git ? `; commit ${m.git.commit.slice(0, 10)}${m.git.dirty ? ' (dirty tree)' : ''}` : ''}.`,
  );
  out.push('');
  out.push(`Reproduce: \`${r.command}\` (run from the repository root; ${r.config.mode} mode; ${f(r.durationS ?? 0, 0)} s).`);
  for (const e of r.earlierRuns ?? []) {
    out.push(`Merged with the results of \`${e.command}\` (${e.startedAt}, backends ${e.backends.join(', ')}${e.inProgress ? `; that run stopped early, in suite ${e.inProgress}` : ''}).`);
  }
  if (r.inProgress) {
    out.push('');
    out.push(`**Partial results**: this file was written while the run was in suite \`${r.inProgress}\` and the run did not finish it (stopped or still going); every row present is complete, the rest is missing.`);
  }
  out.push('');
  out.push(
    `Backends: ${r.backends.map((b) => (b.available ? `**${b.name}** (${b.device ?? 'available'})` : `${b.name}: unavailable (${b.reason})`)).join('; ')}.`,
  );
  const lat = r.suites.latency;
  if (lat) {
    out.push('');
    out.push('## Latency (headline)');
    out.push('');
    out.push(
      `One layer, causal, from Q/K/V on the device to the output on the device, routing and selection included; median of ${r.config.latency.reps} runs after ${warmupText(r.config.latency)}, [min, max] in brackets; ms. Speed-up = dense / preset. Plan share = crisp's plan time (proxy statistics, routing, selection, PE rows; median) / its total time.${serialNote(lat.rows)}`,
    );
    out.push('');
    out.push(producedBy(r, 'latency'));
    const backends = [...new Set(lat.rows.map((x) => x.backend))];
    for (const b of backends) {
      const rs = lat.rows.filter((x) => x.backend === b);
      const sizes = [...new Set(rs.map((x) => x.n))].sort((a, c) => a - c);
      const presets = [...new Set(rs.map((x) => x.preset))];
      const peers = [...new Set(lat.peers.rows.filter((x) => x.backend === b).map((x) => x.peer))];
      const s0 = rs[0];
      out.push('');
      const inputs = [...new Set(rs.map((x) => x.input))];
      out.push(`**${b}** (H=${s0.shape.heads}, Hkv=${s0.shape.kvHeads}, d=${s0.shape.headDim}, ${s0.dtype}; inputs: ${inputs.length === 1 ? inputs[0] : inputs.map((x, i) => `(${i + 1}) ${x}`).join('; ')})`);
      out.push('');
      const inputCol = inputs.length > 1 ? ['inputs'] : [];
      const head = ['n', ...inputCol, ...presets, ...peers, ...presets.filter((p) => p !== 'dense').map((p) => `${p} speed-up`), 'crisp density', 'crisp plan ms', 'crisp plan share', 'crisp route+select+mask share'];
      const body = sizes.map((n) => {
        const cell = (p: string) => {
          const x = rs.find((y) => y.n === n && y.preset === p);
          return x ? `${ms(x.ms.median)} [${ms(x.ms.min)}, ${ms(x.ms.max)}]` : '–';
        };
        const peerCell = (p: string) => {
          const x = lat.peers.rows.find((y) => y.backend === b && y.n === n && y.peer === p);
          return x ? `${ms(x.ms.median)} [${ms(x.ms.min)}, ${ms(x.ms.max)}]${pastTolerance(x)}` : '–';
        };
        const dense = rs.find((y) => y.n === n && y.preset === 'dense');
        const speed = (p: string) => {
          const x = rs.find((y) => y.n === n && y.preset === p);
          return dense && x ? `${(dense.ms.median / x.ms.median).toFixed(2)}x` : '–';
        };
        const cr = rs.find((y) => y.n === n && y.preset === 'crisp');
        const which = rs.find((y) => y.n === n)?.input;
        const inputCell = inputs.length > 1 ? [`(${inputs.indexOf(which ?? '') + 1})`] : [];
        return [kn(n), ...inputCell, ...presets.map(cell), ...peers.map(peerCell), ...presets.filter((p) => p !== 'dense').map(speed), f(cr?.density), cr ? ms(cr.planMs) : '–', planShare(cr), afterStatsShare(cr)];
      });
      out.push(table(head, body));
      // every sparse preset's plan, when the run timed more than crisp
      const sparse = presets.filter((p) => p !== 'dense');
      if (sparse.some((p) => p !== 'crisp')) {
        out.push('');
        out.push('Plan per preset (ms, share of the preset\'s total, density):');
        out.push('');
        const planCell = (n: number, p: string) => {
          const x = rs.find((y) => y.n === n && y.preset === p);
          return x ? `${ms(x.planMs)} (${planShare(x)}), ${f(x.density)}` : '–';
        };
        out.push(table(['n', ...sparse], sizes.map((n) => [kn(n), ...sparse.map((p) => planCell(n, p))])));
      }
    }
    out.push(...kernelTimesMarkdown(lat.rows));
    if (lat.peers.notes.length) {
      out.push('');
      out.push('Dense peers:');
      for (const p of lat.peers.notes) out.push(`- ${p.backend} ${p.peer}: ${p.status}: ${p.detail}${p.command ? ` (\`${p.command}\`)` : ''}`);
    }
    if (lat.skipped.length) {
      out.push('');
      out.push('Skipped sizes:');
      for (const s of lat.skipped) out.push(`- ${s.backend} n=${kn(s.n)}${s.preset ? ` ${s.preset}` : ''}: ${s.reason}`);
    }
  }
  out.push(...rooflineMarkdown(r));
  const cross = r.suites.crossover;
  if (cross) {
    out.push('');
    out.push('## Crossover: where sparse starts to beat dense');
    out.push('');
    out.push(`From the latency rows above (ratio of medians). ${producedBy(r, 'latency')}`);
    out.push('');
    out.push(
      table(
        ['backend', 'preset', 'first winning n', 'estimated crossover', 'sparse/dense per n', 'note'],
        cross.rows.map((c) => [c.backend, c.preset, c.crossoverN === null ? '–' : kn(c.crossoverN), c.estimatedN === null ? '–' : String(c.estimatedN), c.ratios.map((q) => `${kn(q.n)}: ${q.ratio.toFixed(2)}`).join(', '), c.note]),
      ),
    );
    out.push('');
    out.push('Length gate per backend (the crisp preset; the value `Backend.sparseCrossover` should default to):');
    for (const g of cross.gates) {
      out.push(`- ${g.backend}: ${g.gate === null ? `no crossover measured (${g.note})` : `**${g.gate}** keys`}${g.shipped !== undefined ? `; the backend ships ${g.shipped}` : ''}`);
    }
  }
  const acc = r.suites.accuracy;
  if (acc) {
    out.push('');
    out.push('## Accuracy per preset and scenario profile');
    out.push('');
    out.push(
      `@crisp/synth scenarios, H=${acc.shape.heads}, Hkv=${acc.shape.kvHeads}, d=${acc.shape.headDim}. The plan comes from the backend; the mask is scored in float64 on the host over ${acc.sampledRows} sampled query rows (mass recall, output error ‖O_sparse − O_dense‖/‖O_dense‖ over all heads and on the worst head, the plan's own per-head check proxyRecall at its smallest) and at every needle's asking rows (needle recall: key blocks selected; visible: the same over the needles the proxy rows can see, an asker among the last rows, since a plan read from the last query block cannot see the others; "in output": also within 5% of dense there). Density: selected causal blocks / (Nb(Nb+1)/2). Deterministic for a seed (${r.config.seed}): one evaluation, no timing, so no spread.`,
    );
    out.push('');
    out.push(producedBy(r, 'accuracy'));
    out.push('');
    out.push(
      table(
        ['backend', 'profile', 'n', 'preset', 'mass recall', 'output error', 'worst head error', 'min proxy recall', 'needle recall', 'visible needle recall', 'needles in output', 'density', 'VS heads', 'guarded heads'],
        acc.rows.map((x) => [
          x.backend,
          x.profile,
          kn(x.n),
          x.policy,
          f(x.massRecall),
          f(x.outputError, 4),
          x.worstHeadError === undefined ? '–' : `${f(x.worstHeadError, 4)} (head ${x.worstHead})`,
          x.minProxyRecall === undefined ? '–' : f(x.minProxyRecall),
          `${f(x.needleRecall, 2)} (${x.needles})`,
          x.visibleNeedleRecall === undefined ? '–' : `${f(x.visibleNeedleRecall, 2)} (${x.visibleNeedles})`,
          f(x.needleOutputRecall, 2),
          f(x.density),
          String(x.vsHeads),
          x.guardedHeads === undefined ? '–' : String(x.guardedHeads),
        ]),
      ),
    );
    out.push('');
    out.push('Routing agreement (C_struct τ_proxy=0.2 vs JSD τ=0.1 on the same heads, and each against the route the scenario intends):');
    out.push('');
    out.push(
      table(
        ['backend', 'profile', 'n', 'heads', 'C_struct vs JSD', 'C_struct vs intended', 'JSD vs intended'],
        acc.routing.map((x) => [x.backend, x.profile, kn(x.n), String(x.heads), f(x.cStructVsJsd, 2), f(x.cStructVsTruth, 2), f(x.jsdVsTruth, 2)]),
      ),
    );
    for (const s of acc.skipped) out.push(`- skipped ${s.backend} ${s.profile} n=${kn(s.n)}: ${s.reason}`);
    out.push(...matchedErrorMarkdown(acc.rows));
    out.push(...matchedDensityMarkdown(acc.rows));
  }
  const curve = r.suites.onCurve;
  if (curve) {
    out.push('');
    out.push('## The O(n) curve: background blocks selected against n');
    out.push('');
    out.push(
      'Constructed head: sink 0.85, local 0.03, 8 signal blocks of 0.005, background 0.08 (flat: token jitter only; salient: log-normal block masses, σ=0.5). Background = kept blocks that are neither anchors nor signal. Counts, deterministic for a seed: no spread.',
    );
    out.push('');
    out.push(producedBy(r, 'onCurve'));
    const sizes = [...new Set(curve.synthetic.map((x) => x.n))];
    for (const bg of ['flat', 'salient'] as const) {
      const sels = [...new Set(curve.synthetic.map((x) => x.selector))];
      out.push('');
      out.push(`${bg} background (background blocks kept / signal recall):`);
      out.push('');
      out.push(
        table(
          ['selector', ...sizes.map(kn)],
          sels.map((s) => [s, ...sizes.map((n) => {
            const x = curve.synthetic.find((y) => y.n === n && y.selector === s && y.background === bg);
            return x ? `${x.backgroundBlocks} / ${x.signalRecall.toFixed(2)}` : '–';
          })]),
        ),
      );
    }
    if (curve.proxy.length) {
      const ps = [...new Set(curve.proxy.map((x) => `${x.backend}|${x.n}`))];
      const sels = [...new Set(curve.proxy.map((x) => x.selector))];
      out.push('');
      out.push('Real proxy statistics (llama-like scenario through the backend; mean blocks kept per VS head and direction, of Nb):');
      out.push('');
      out.push(
        table(
          ['backend', 'n', 'Nb', ...sels],
          ps.map((key) => {
            const [b, n] = key.split('|');
            const rs = curve.proxy.filter((x) => x.backend === b && x.n === Number(n));
            return [b, kn(Number(n)), String(rs[0].numBlocks), ...sels.map((s) => f(rs.find((x) => x.selector === s)?.meanBlocks, 1))];
          }),
        ),
      );
    }
    for (const s of curve.skipped) out.push(`- skipped ${s.backend} n=${kn(s.n)}: ${s.reason}`);
  }
  const fl = r.suites.floors;
  if (fl) {
    out.push('');
    out.push(`## Floors compared (${fl.backend ?? 'no backend'}, n=${kn(fl.n)}, mean over profiles)`);
    out.push('');
    out.push(
      `CRISP's policy with only the VS selector swapped. Mean floor = the paper's noise floor μ; median/quantile floors; robust = median + c·1.4826·MAD; coverage = FlexPrefill's γ on tokens. Profiles: ${[...new Set(fl.rows.map((x) => x.profile))].join(', ') || 'none'}. Pareto: no other variant has mass recall >= and density <= (one strictly). Deterministic for a seed: no spread.`,
    );
    out.push('');
    out.push(producedBy(r, 'floors'));
    out.push('');
    out.push(
      table(
        ['floor', 'parameter', 'mass recall', 'output error', 'needle recall', 'density', 'Pareto'],
        fl.summary.map((x) => [x.family, x.param, f(x.massRecall), f(x.outputError, 4), f(x.needleRecall, 2), f(x.density), x.pareto ? 'yes' : '']),
      ),
    );
    for (const s of fl.skipped) out.push(`- skipped ${s.profile}: ${s.reason}`);
  }
  if (r.figures?.length) {
    out.push('');
    out.push('## Figures');
    out.push('');
    for (const fig of r.figures) out.push(`- [${fig}](${fig})`);
  }
  out.push('');
  if (r.suites.tfjs) out.push(...tfjsMarkdown(r.suites.tfjs, r.config.tfjs?.reps ?? 3));
  if (r.suites.varlen) out.push(...varlenMarkdown(r.suites.varlen, r.config.latency.reps, r.config.latency.warmup));
  if (r.suites.parity) out.push(...parityMarkdown(r.suites.parity));
  if (r.suites.parallel) out.push(...parallelMarkdown(r.suites.parallel, producedBy(r, 'parallel')));
  return out.join('\n');
}

/**
 * headline.md: the latency headline alone, to paste unedited into the repository README
 * (links are relative to the repository root, through `linkBase`) or to link to. Per
 * backend and n: dense, crisp and the dense peers (median ms and [min, max]), crisp's
 * speed-up over each, its density and plan share.
 */
export function headline(r: BenchResult, linkBase: string): string {
  const base = linkBase.replace(/\/+$/, '');
  const out: string[] = [];
  const m = r.machine;
  const lat = r.suites.latency;
  out.push(`<!-- written by crisp-bench from ${base}/bench.json; regenerate, do not edit -->`);
  out.push(`**CRISP latency, ${m.gpus.length ? m.gpus.map((g) => g.name).join(', ') : m.cpu.model}** (one layer, causal, Q/K/V on the device to the output on the device, routing and selection included; median of ${r.config.latency.reps} runs after ${warmupText(r.config.latency)}, [min, max]; ms)`);
  if (!lat || lat.rows.length === 0) {
    out.push('');
    out.push('No latency measured in this run.');
  }
  for (const b of [...new Set((lat?.rows ?? []).map((x) => x.backend))]) {
    const rs = lat!.rows.filter((x) => x.backend === b);
    const sizes = [...new Set(rs.map((x) => x.n))].sort((a, c) => a - c);
    const peers = [...new Set(lat!.peers.rows.filter((x) => x.backend === b).map((x) => x.peer))];
    const flex = flexPrefillOnLatencyLayer(r, b, rs);
    const flexCols = flex.size ? [FLEX_CODE] : [];
    const s0 = rs[0];
    const cell = (x: { ms: { median: number; min: number; max: number } } | undefined) => (x ? `${ms(x.ms.median)} [${ms(x.ms.min)}, ${ms(x.ms.max)}]` : '–');
    const ratio = (a: { ms: { median: number } } | undefined, c: { ms: { median: number } } | undefined) => (a && c ? `${(a.ms.median / c.ms.median).toFixed(2)}x` : '–');
    out.push('');
    out.push(`*${b}*, H=${s0.shape.heads}, Hkv=${s0.shape.kvHeads}, d=${s0.shape.headDim}, ${s0.dtype}:`);
    out.push('');
    out.push(
      table(
        ['n', 'dense', 'crisp', ...peers, ...flexCols, 'crisp vs dense', ...[...peers, ...flexCols].map((p) => `crisp vs ${p}`), 'crisp density', 'crisp plan share', 'crisp route+select+mask share'],
        sizes.map((n) => {
          const dense = rs.find((y) => y.n === n && y.preset === 'dense');
          const cr = rs.find((y) => y.n === n && y.preset === 'crisp');
          const pr = peers.map((p) => lat!.peers.rows.find((y) => y.backend === b && y.n === n && y.peer === p));
          const theirs = flex.get(n)?.theirsMs;
          const fx = flexCols.map(() => (theirs ? { ms: theirs } : undefined));
          return [
            kn(n),
            cell(dense),
            cell(cr),
            ...pr.map((p) => `${cell(p)}${pastTolerance(p)}`),
            ...fx.map(cell),
            ratio(dense, cr),
            ...pr.map((p) => ratio(p, cr)),
            ...fx.map((x) => ratio(x, cr)),
            f(cr?.density),
            planShare(cr),
            afterStatsShare(cr),
          ];
        }),
      ),
    );
    if (flex.size) {
      const per = [...flex.values()]
        .sort((x, y) => x.n - y.n)
        .map((x) => {
          const ours = x.others?.find((o) => o.preset === 'crisp');
          const e = (v: number | undefined) => (v === undefined ? '–' : v.toFixed(4));
          return `${kn(x.n)}: FlexPrefill density ${f(x.theirsDensity)}, error ${e(x.theirsRelErr)}${ours ? `; crisp density ${f(ours.density)}, error ${e(ours.relErr)}` : ''}`;
        });
      out.push('');
      out.push(
        `${FLEX_CODE}: FlexPrefill's published flex_prefill_attention on the same layer, timed by the parity suite of these results (its command in bench.md; CUDA events around its call, median; its defaults γ ${r.suites.parity!.params.gamma}, τ ${r.suites.parity!.params.tau}); error = relative error against float64 dense attention at ${r.suites.parity!.sampledRows} sampled rows, scored by the peer. ${per.join('. ')}.`,
      );
    }
  }
  out.push('');
  out.push(`Speed-up = other / crisp (median). Plan share = crisp's plan time (proxy statistics, routing, selection, PE rows, mask) / its total; route+select+mask share = the same without the proxy statistics (docs/ALGORITHM.md, step 1). On CUDA the plan time is measured with GPU events from the call to the attention's start.${serialNote(r.suites.latency?.rows ?? [])} ${producedBy(r, 'latency')}`);
  if (r.inProgress) out.push(`Partial: the run stopped in suite \`${r.inProgress}\`.`);
  const links = [`[all results](${base}/bench.md)`, ...(r.figures ?? []).map((x) => `[${x}](${base}/${x})`)];
  out.push(`${r.startedAt.slice(0, 10)}${m.git ? `, commit ${m.git.commit.slice(0, 10)}${m.git.dirty ? ' (dirty tree)' : ''}` : ''}: ${links.join(', ')}.`);
  out.push('');
  return out.join('\n');
}

/** The headline's column for FlexPrefill's own code (the parity suite's peer). */
export const FLEX_CODE = 'FlexPrefill (its code)';

/**
 * The parity suite's rows of this run whose layer is the one the latency suite timed on
 * `backend` (the same @crisp/synth profile and seed, shape, bf16, and n), keyed by n: FlexPrefill's
 * own code on the headline's tensors, to set beside the dense peers.
 */
export function flexPrefillOnLatencyLayer(r: BenchResult, backend: string, rows: readonly LatencyRow[]): Map<number, ParityRow> {
  const p = r.suites.parity;
  const out = new Map<number, ParityRow>();
  for (const x of p?.rows ?? []) {
    if (x.backend !== backend || !x.theirsMs) continue;
    const lr = rows.find((y) => y.n === x.n && y.preset === 'crisp');
    const sameShape = lr && lr.shape.heads === p!.shape.heads && lr.shape.kvHeads === p!.shape.kvHeads && lr.shape.headDim === p!.shape.headDim;
    if (sameShape && lr.dtype === 'bf16' && lr.input.startsWith(`@crisp/synth ${x.profile} (seed ${x.seed})`)) out.set(x.n, x);
  }
  return out;
}

/**
 * "1 warm-up", plus the GPU backends' JIT warm-up when the run had one (results written
 * before it existed have no jitWarmup and say nothing of it).
 */
export function warmupText(l: { readonly warmup: number; readonly jitWarmup?: number; readonly gpuWarmMs?: number }): string {
  const gpu: string[] = [];
  if (l.gpuWarmMs) gpu.push(`warm-up runs for at least ${l.gpuWarmMs} ms a preset and size`);
  if (l.jitWarmup) gpu.push(`after ${l.jitWarmup} untimed prefills at ${JIT_WARMUP_N / 1024}k, so their JavaScript runs JIT-optimised`);
  return `${l.warmup} warm-up${gpu.length ? ` (GPU backends: ${gpu.join('; ')})` : ''}`;
}
