/**
 * The soak's calls: the problems and persistent tensors they use (buildHelpers), the valid
 * call kinds, and the invalid ones, each with the CrispError code it must end in. Invalid
 * calls a backend cannot express (an f32 input on a backend that takes f32) are left out for
 * it; checks the device computes (NaN/Inf counts, mask rows checked while expanding) are left
 * out where the device computes nothing (`computes` false: a stand-in driver).
 */
import {
  type BlockMask,
  type DeviceTensor,
  type DirectionScores,
  type ProxyStats,
  type Policy,
  type PrefillPlan,
  type Route,
  type Router,
  type VsSelector,
  densePolicy,
  numBlocks,
  planPrefill,
  releasePlan,
  runPlan,
  sparsePrefill,
  toFloat32,
  vsListsFromArrays,
} from '@crisp/core';
import { crisp, crispFast, flexPrefill } from '@crisp/presets';
import { type Problem, type ProblemSpec, randomHost } from './soak-check.js';
import type { Call, Helpers, SoakContext, Valid } from './soak-types.js';

/** A custom router: the half of the heads with the highest row entropy go to PE, the rest VS. */
const entropyRank: Router = Object.freeze({
  name: 'entropyRank',
  route(s: ProxyStats) {
    const e = s.rowEntropy;
    const order = Array.from({ length: s.heads }, (_, h) => h).sort((a, b) => e[b] - e[a] || a - b);
    const routes: Route[] = Array(s.heads).fill('vs');
    for (const h of order.slice(0, Math.floor(s.heads / 2))) routes[h] = 'pe';
    return { routes, scores: Float64Array.from(e), scoreName: 'rowEntropy' };
  },
});

/** A custom selector: the k best blocks, ties to the lower index, with both end blocks. */
function topAnchored(k: number): VsSelector {
  return Object.freeze({
    name: `top${k}`,
    select({ blockScores }: DirectionScores) {
      const Nb = blockScores.length;
      const best = Array.from({ length: Nb }, (_, i) => i).sort((a, b) => blockScores[b] - blockScores[a] || a - b);
      return Int32Array.from(new Set([0, Nb - 1, ...best.slice(0, k)])).sort();
    },
  });
}

const custom = (B: 64 | 128): Policy =>
  Object.freeze({ name: `custom-b${B}`, blockSize: B, kMin: 2 * B, router: entropyRank, vs: topAnchored(4), pe: Object.freeze({ name: 'coverage', gamma: 0.9, kMin: 2 * B }) });
const POLICIES: Readonly<Record<string, Policy>> = { crisp, crispFast, flexPrefill, custom128: custom(128), custom64: custom(64) };

/** The valid kinds (a call of each on each problem warms the soak up). */
export const VALID_KINDS = [
  'prefill:crisp',
  'prefill:crispFast',
  'prefill:flexPrefill',
  'prefill:custom128',
  'prefill:custom64',
  'planRun:crisp',
  'planRun:custom64',
  'planRun:released',
  'dense',
  'dense:lse',
  'chunked',
  'mask',
  'mask:out',
] as const;

/** A per-problem extra: the last rows of q as their own tensor (chunked prefill) and an output to write into. */
interface Extra {
  readonly tail: { readonly q: DeviceTensor; readonly host: Float32Array };
  readonly out: DeviceTensor;
  /** [4, H, d] of the problem's dtype and of the other one (outputs of the wrong shape or dtype) */
  readonly smallOut: DeviceTensor;
  readonly otherOut: DeviceTensor;
}

const NAN_BITS = { bf16: 0x7fc0, f16: 0x7e00 } as const;
const INF_BITS = { bf16: 0x7f80, f16: 0x7c00 } as const;
const other = (dtype: 'bf16' | 'f16') => (dtype === 'bf16' ? 'f16' : 'bf16');
const int = (r: () => number, n: number) => Math.floor(r() * n);

/** A random mask that leaves no row empty: the sink block and the diagonal for every head, a few more, and random causal rows for some heads. */
export function randomMask(r: () => number, H: number, Nb: number, B: number): BlockMask {
  const vertical: number[][] = [];
  const slash: number[][] = [];
  for (let h = 0; h < H; h++) {
    vertical.push([0, ...Array.from({ length: 3 }, () => int(r, Nb))]);
    slash.push([0, ...Array.from({ length: 3 }, () => int(r, Nb))]);
  }
  const rowPtr = new Int32Array(H * Nb + 1);
  const cols: number[] = [];
  const withRows = new Set(Array.from({ length: Math.ceil(H / 3) }, () => int(r, H)));
  for (let h = 0; h < H; h++) {
    for (let I = 0; I < Nb; I++) {
      if (withRows.has(h)) cols.push(...new Set(Array.from({ length: 2 }, () => int(r, I + 1))));
      const row = cols.splice(rowPtr[h * Nb + I]).sort((a, b) => a - b);
      cols.push(...row);
      rowPtr[h * Nb + I + 1] = cols.length;
    }
  }
  return { heads: H, numBlocks: Nb, blockSize: B, vs: vsListsFromArrays(vertical, slash), rows: { rowPtr, cols: Int32Array.from(cols) } };
}

/** The problems up (seeded), their extras, and the persistent tensors of the invalid calls. */
export async function buildHelpers(ctx: SoakContext, specs: readonly ProblemSpec[], computes: boolean): Promise<Helpers> {
  const { be, r } = ctx;
  const caps = be.capabilities;
  const problems: Problem[] = [];
  const extras = new Map<Problem, Extra>();
  for (const s of specs) {
    const q = randomHost(r, s.dtype, [s.n, s.H, s.d], 2);
    const k = randomHost(r, s.dtype, [s.n, s.Hkv, s.d], 2);
    const v = randomHost(r, s.dtype, [s.n, s.Hkv, s.d], 1);
    const host = { q: toFloat32(q), k: toFloat32(k), v: toFloat32(v) };
    const p: Problem = {
      name: `${s.dtype} n${s.n} H${s.H}/${s.Hkv} d${s.d}`,
      ...s,
      bits: { q: q.data as Uint16Array, k: k.data as Uint16Array, v: v.data as Uint16Array },
      host,
      q: be.upload(q),
      k: be.upload(k),
      v: be.upload(v),
    };
    problems.push(p);
    const m = Math.min(s.n, 300);
    const stride = s.H * s.d;
    extras.set(p, {
      tail: { q: be.upload({ dtype: s.dtype, shape: [m, s.H, s.d], data: p.bits.q.slice((s.n - m) * stride) }), host: host.q.slice((s.n - m) * stride) },
      out: be.allocate(s.dtype, [s.n, s.H, s.d]),
      smallOut: be.allocate(s.dtype, [4, s.H, s.d]),
      otherOut: be.allocate(other(s.dtype), [4, s.H, s.d]),
    });
  }
  const ex = (p: Problem) => extras.get(p) as Extra;
  const small = { bf16: be.allocate('bf16', [64, 1, 64]), f16: be.allocate('f16', [64, 1, 64]) };
  const trio = (dtype: 'f32' | 'bf16', d: number) => {
    const t = be.allocate(dtype, [256, 2, d]);
    return { q: t, k: t, v: t };
  };
  const f32 = caps.dtypes.includes('f32') ? undefined : trio('f32', 64);
  const d96 = caps.headDims.includes(96) ? undefined : trio('bf16', 96);
  const longN = caps.maxSequence + 1;
  const tooLong = longN * 64 * 2 <= 2 ** 29 ? { q: be.allocate('bf16', [64, 1, 64]), k: be.allocate('bf16', [longN, 1, 64]) } : undefined;
  const first = problems[0];
  const densePlan: PrefillPlan = await planPrefill(be, first, densePolicy);
  const foreign = ctx.target.foreign ? ctx.target.foreign.upload({ dtype: first.dtype, shape: first.v.shape, data: first.bits.v }) : undefined;
  const writable = be.allocate('bf16', [16, 16]);

  const sparseAt = (p: Problem, B: number) => ({ Nb: numBlocks(p.n, B), B });
  const pickB = () => (caps.blockSizes.includes(64) && r() < 0.5 ? 64 : 128);

  // Left out on a stand-in: FlexPrefill's router refuses its zero statistics, and a released
  // plan's mask (its PE rows read back from the device, all empty there) is refused by core.
  const validKinds = VALID_KINDS.filter((k) => computes || (k !== 'prefill:flexPrefill' && k !== 'planRun:released'));
  const valid = (p: Problem, kind: string = 'prefill:crisp'): Call => {
    const inputs = { q: p.q, k: p.k, v: p.v };
    const run = async (): Promise<Valid> => {
      const [what, name] = kind.split(':');
      if (what === 'prefill') {
        const res = await sparsePrefill(be, inputs, POLICIES[name], { minSparseLength: 0 });
        return { problem: p, output: res.output, mask: res.plan.mask, release: () => res.output.dispose() };
      }
      if (what === 'planRun') {
        const plan = await planPrefill(be, inputs, POLICIES[name === 'custom64' ? 'custom64' : 'crisp'], { minSparseLength: 0 });
        try {
          // a released plan still runs, from plan.mask
          if (name === 'released') releasePlan(plan);
          const res = await runPlan(be, plan, inputs);
          return { problem: p, output: res.output, mask: plan.mask, release: () => res.output.dispose() };
        } finally {
          releasePlan(plan);
        }
      }
      if (what === 'dense') {
        const res = await be.denseAttention(p.q, p.k, p.v, { returnLse: name === 'lse' });
        return {
          problem: p,
          output: res.output,
          release: () => {
            res.output.dispose();
            res.lse?.dispose();
          },
        };
      }
      if (what === 'chunked') {
        const t = ex(p).tail;
        if (r() < 0.5) {
          // chunked prefill through the whole pipeline: the chunk's own plan over all keys
          const res = await sparsePrefill(be, { q: t.q, k: p.k, v: p.v }, crisp, { minSparseLength: 0 });
          return { problem: p, output: res.output, qHost: t.host, mask: res.plan.mask, release: () => res.output.dispose() };
        }
        const res = await be.denseAttention(t.q, p.k, p.v);
        return { problem: p, output: res.output, qHost: t.host, release: () => res.output.dispose() };
      }
      const { Nb, B } = sparseAt(p, pickB());
      const mask = randomMask(r, p.H, Nb, B);
      if (name === 'out') {
        const res = await be.sparseAttention(p.q, p.k, p.v, mask, { out: ex(p).out });
        if (res.output !== ex(p).out) throw new Error('sparseAttention with opts.out returned another tensor');
        return { problem: p, output: res.output, mask, release: () => {} };
      }
      const res = await be.sparseAttention(p.q, p.k, p.v, mask);
      return { problem: p, output: res.output, mask, release: () => res.output.dispose() };
    };
    return { kind, family: 'valid', run };
  };

  /** An invalid call ending in `expect`; `run` throws (its result, if any, is released). */
  const bad = (kind: string, expect: readonly string[], run: () => Promise<unknown>, cleanup?: () => void, family: Call['family'] = 'invalid'): Call => ({
    kind,
    family,
    expect,
    run: async () => {
      const res = (await run()) as { output?: DeviceTensor } | undefined;
      res?.output?.dispose();
      return undefined;
    },
    ...(cleanup ? { cleanup } : {}),
  });

  /** A copy of one of p's inputs with one value replaced by `bits` (NaN or Inf). */
  const poisoned = (p: Problem, which: 'q' | 'v', bits: number) => {
    const data = p.bits[which].slice();
    data[int(r, data.length)] = bits;
    return be.upload({ dtype: p.dtype, shape: p[which].shape, data });
  };

  const invalid: ((p: Problem) => Call | undefined)[] = [
    (p) => bad('invalid:shape', ['SHAPE_MISMATCH'], () => be.denseAttention(p.q, p.k, small[p.dtype])),
    (p) => bad('invalid:dtype', ['DTYPE_MISMATCH'], () => be.denseAttention(p.q, small[other(p.dtype)], small[other(p.dtype)])),
    () => (f32 ? bad('invalid:f32', ['UNSUPPORTED'], () => be.denseAttention(f32.q, f32.k, f32.v)) : undefined),
    () => (d96 ? bad('invalid:headDim', ['UNSUPPORTED'], () => be.denseAttention(d96.q, d96.k, d96.v)) : undefined),
    (p) => {
      const gone = be.allocate(p.dtype, p.v.shape);
      gone.dispose();
      return bad('invalid:disposed', ['DISPOSED'], () => be.denseAttention(p.q, p.k, gone));
    },
    () => (foreign ? bad('invalid:foreign', ['WRONG_BACKEND'], () => be.denseAttention(first.q, first.k, foreign)) : undefined),
    (p) => {
      const { Nb, B } = sparseAt(p, pickB());
      const none = Array.from({ length: p.H }, () => [0]);
      const mask = { heads: p.H, numBlocks: Nb, blockSize: B, vs: vsListsFromArrays([[0, Nb + int(r, 4)], ...none.slice(1)], none) };
      return bad('invalid:maskRange', ['INVALID_MASK'], () => be.sparseAttention(p.q, p.k, p.v, mask));
    },
    (p) => {
      if (!computes) return undefined;
      const { Nb, B } = sparseAt(p, pickB());
      const mask = randomMask(r, p.H, Nb, B);
      // one row points past its own query block (not causal): found while expanding on the device
      const rows = mask.rows as NonNullable<BlockMask['rows']>;
      const r0 = int(r, p.H) * Nb + int(r, Nb - 1);
      const cols: number[] = [];
      const rowPtr = new Int32Array(rows.rowPtr.length);
      for (let i = 0; i < p.H * Nb; i++) {
        if (i === r0) cols.push((i % Nb) + 1);
        else cols.push(...rows.cols.subarray(rows.rowPtr[i], rows.rowPtr[i + 1]));
        rowPtr[i + 1] = cols.length;
      }
      return bad('invalid:maskCausal', ['INVALID_MASK'], () => be.sparseAttention(p.q, p.k, p.v, { ...mask, rows: { rowPtr, cols: Int32Array.from(cols) } }));
    },
    (p) => {
      const { Nb, B } = sparseAt(p, 128);
      return bad('invalid:maskHeads', ['INVALID_MASK'], () => be.sparseAttention(p.q, p.k, p.v, randomMask(r, p.H + 1, Nb, B)));
    },
    (p) => {
      if (!computes || p.n * p.H * p.d > 2 ** 22) return undefined;
      const t = poisoned(p, 'q', NAN_BITS[p.dtype]);
      return bad('invalid:nanInput', ['NON_FINITE'], () => (r() < 0.5 ? sparsePrefill(be, { q: t, k: p.k, v: p.v }, crisp, { minSparseLength: 0 }) : be.denseAttention(t, p.k, p.v)), () => t.dispose());
    },
    (p) => {
      if (!computes || p.n * p.Hkv * p.d > 2 ** 22) return undefined;
      const t = poisoned(p, 'v', INF_BITS[p.dtype]);
      return bad('invalid:infInput', ['NON_FINITE'], () => be.denseAttention(p.q, p.k, t), () => t.dispose());
    },
    () => {
      const t = ctx.tools;
      if (!t) return undefined;
      const total = t.memoryInfo().total;
      return bad('invalid:oomHuge', ['OUT_OF_MEMORY'], async () => be.allocate('bf16', [Math.ceil(total / 2) + 2 ** 20]).dispose());
    },
    () => {
      const t = ctx.tools;
      if (!t) return undefined;
      const { free, total } = t.memoryInfo();
      const bytes = free + 2 ** 29;
      if (bytes >= total) return undefined;
      return bad('invalid:oomFree', ['OUT_OF_MEMORY'], async () => be.allocate('bf16', [Math.ceil(bytes / 2)]).dispose());
    },
    (p) => (be.name === 'cuda' ? bad('invalid:outAlias', ['INVALID_ARGUMENT'], () => be.denseAttention(p.q, p.k, p.v, { out: p.q })) : undefined),
    (p) => bad('invalid:outShape', ['SHAPE_MISMATCH'], () => be.denseAttention(p.q, p.k, p.v, { out: ex(p).smallOut })),
    (p) => bad('invalid:outDtype', ['DTYPE_MISMATCH'], () => be.denseAttention(p.q, p.k, p.v, { out: ex(p).otherOut })),
    (p) => {
      const scale = [Number.NaN, -1, 0, Number.POSITIVE_INFINITY][int(r, 4)];
      return bad('invalid:scale', ['INVALID_ARGUMENT'], () => be.denseAttention(p.q, p.k, p.v, { scale }));
    },
    (p) => (caps.blockSizes.includes(32) ? undefined : bad('invalid:blockSize', ['INVALID_ARGUMENT'], () => be.sparseAttention(p.q, p.k, p.v, randomMask(r, p.H, numBlocks(p.n, 32), 32)))),
    () => (tooLong ? bad('invalid:tooLong', ['LIMIT_EXCEEDED'], () => be.denseAttention(tooLong.q, tooLong.k, tooLong.k)) : undefined),
    (p) => (p.n === first.n ? undefined : bad('invalid:planMismatch', ['INVALID_ARGUMENT'], () => runPlan(be, densePlan, { q: p.q, k: p.k, v: p.v }))),
    () => bad('invalid:writeArray', ['DTYPE_MISMATCH'], async () => be.write(writable, 0, new Float64Array(16) as unknown as Uint16Array)),
    () => bad('invalid:writeOverrun', ['INVALID_ARGUMENT'], async () => be.write(writable, 250, new Uint16Array(16))),
    (p) => bad('invalid:policyBlock', ['INVALID_ARGUMENT'], () => sparsePrefill(be, { q: p.q, k: p.k, v: p.v }, { ...POLICIES.custom128, blockSize: 96 }, { minSparseLength: 0 })),
  ];

  // Policies returning garbage: core refuses them (which code, INVALID_ARGUMENT or INVALID_MASK, is core's choice)
  const POLICY_CODES = ['INVALID_ARGUMENT', 'INVALID_MASK'] as const;
  const base = POLICIES.custom128;
  const garbage = (name: string, part: Partial<Policy>) => (p: Problem) =>
    bad(`policy:${name}`, POLICY_CODES, () => sparsePrefill(be, { q: p.q, k: p.k, v: p.v }, { ...base, name, ...part }, { minSparseLength: 0 }), undefined, 'policy');
  const router = (route: Router['route']): Partial<Policy> => ({ router: { name: 'garbage', route } });
  const selector = (select: VsSelector['select']): Partial<Policy> => ({ vs: { name: 'garbage', select } });
  const policy: ((p: Problem) => Call)[] = [
    garbage('routesShort', router((s) => ({ routes: Array(s.heads - 1).fill('vs'), scores: new Float64Array(s.heads - 1), scoreName: 'x' }))),
    garbage('routerUndefined', router(() => undefined as never)),
    garbage('indexPastEnd', selector(({ blockScores }) => Int32Array.from([0, blockScores.length + 3]))),
    garbage('indexNegative', selector(() => Int32Array.from([-1, 0]))),
  ];
  if (ctx.strictPolicy) {
    policy.push(
      garbage('routeUnknown', router((s) => ({ routes: Array.from({ length: s.heads }, (_, h) => (h === 1 ? 'xx' : 'vs')) as Route[], scores: new Float64Array(s.heads), scoreName: 'x' }))),
      garbage('routerAsync', router((async (s: { heads: number }) => ({ routes: Array(s.heads).fill('vs'), scores: new Float64Array(s.heads), scoreName: 'x' })) as never)),
      garbage('indexNaN', selector(() => Float64Array.from([0, Number.NaN]) as unknown as Int32Array)),
      garbage('indexFraction', selector(() => Float64Array.from([0, 1.5]) as unknown as Int32Array)),
      garbage('selectionEmpty', selector(() => new Int32Array(0))),
    );
  }

  // Faults part way through a valid call: the call fails with the code, or (the fault not reached) succeeds and is checked
  const faultKinds = ['prefill:crisp', 'prefill:custom64', 'dense', 'mask'];
  const fault = (p: Problem): Call | undefined => {
    const { faults, tools } = ctx;
    if (!faults || !tools) return undefined;
    const inner = valid(p, faultKinds[int(r, faultKinds.length)]);
    const oom = r() < 0.5;
    return {
      kind: oom ? 'fault:oom' : 'fault:launch',
      family: 'fault',
      expect: oom ? ['OUT_OF_MEMORY'] : ['BACKEND_ERROR'],
      mayPass: true,
      run: async () => {
        if (oom) {
          // every allocation of the call then reaches the driver
          tools.trimMemory();
          faults.failAlloc({ at: 1 + int(r, 8) });
        } else faults.failLaunch({ at: 1 + int(r, 30), mode: 'invalid' });
        try {
          return await inner.run();
        } finally {
          faults.clear();
        }
      },
    };
  };

  const draw = (): Call => {
    for (;;) {
      const p = problems[int(r, problems.length)];
      const x = r();
      const call =
        x < 0.55
          ? valid(p, validKinds[int(r, validKinds.length)])
          : x < 0.85
            ? invalid[int(r, invalid.length)](p)
            : x < 0.93
              ? policy[int(r, policy.length)](p)
              : fault(p);
      if (call) return call;
    }
  };

  return { problems, validKinds, valid, draw };
}
