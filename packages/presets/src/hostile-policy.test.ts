/**
 * Hostile custom policies through sparsePrefill on the reference backend, property-based
 * (fast-check): random router decisions and selector outputs, valid and not. A valid one
 * gives a plan whose output equals exact attention on that plan's mask; anything else gives
 * the exact CrispError code, with a poisoned `out` left untouched. The router and selector
 * factories take any parameter value without a bare exception.
 */
import {
  CrispError,
  type CrispErrorCode,
  type DirectionScores,
  NonFiniteError,
  type Policy,
  type Route,
  type RoutingDecision,
  sparsePrefill,
  toFloat32,
} from '@crisp/core';
import { attentionRows, createReferenceBackend, sampleRows } from '@crisp/reference';
import { cStruct, entropy, fixed, jsd } from '@crisp/router';
import { cumulativeCoverage, globalCoverage, medianFloor, noiseFloor, quantileFloor, robustFloor, topK } from '@crisp/select';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { basePolicy, codeOf, errorOf, poisoned, problem, untouched } from './__fixtures__/hostile.js';
import { presetByName, presets } from './index.js';

const [n, H, d, B] = [512, 3, 16, 64];
const Nb = n / B;

/** Checks a successful run: the output is exact attention on the plan's mask, at a few rows. */
async function matchesMask(be: ReturnType<typeof createReferenceBackend>, x: ReturnType<typeof problem>, res: Awaited<ReturnType<typeof sparsePrefill>>, label: string) {
  const rows = sampleRows(n, 8);
  const want = attentionRows(x.host.q, x.host.k, x.host.v, rows, res.plan.mask);
  const got = toFloat32(await be.download(res.output));
  let worst = 0;
  for (let t = 0; t < rows.length; t++) for (let c = 0; c < H * d; c++) worst = Math.max(worst, Math.abs(got[rows[t] * H * d + c] - want.output[t * H * d + c]));
  expect(worst, label).toBeLessThan(1e-5);
}

type Decision = { readonly kind: string; readonly make: () => unknown; readonly code?: CrispErrorCode };

const routesArb = fc.array(fc.constantFrom<Route>('vs', 'pe'), { minLength: H, maxLength: H });
const scoresArb = fc.array(fc.double({ noNaN: true, noDefaultInfinity: true }), { minLength: H, maxLength: H });

/** What a router may return (or do), tagged with the pipeline's answer. */
const decisionArb: fc.Arbitrary<Decision> = fc.oneof(
  fc.record({ routes: routesArb, scores: scoresArb, typed: fc.boolean(), threshold: fc.option(fc.double({ noNaN: true, noDefaultInfinity: true }), { nil: undefined }) }).map(
    (r): Decision => ({
      kind: `valid ${r.routes}`,
      make: () => ({ routes: r.routes, scores: r.typed ? Float64Array.from(r.scores) : r.scores, scoreName: 'mine', threshold: r.threshold }),
    }),
  ),
  fc.constantFrom<Decision>(
    { kind: 'undefined', make: () => undefined, code: 'INVALID_ARGUMENT' },
    { kind: 'null', make: () => null, code: 'INVALID_ARGUMENT' },
    { kind: 'a Promise of a decision', make: () => Promise.resolve({ routes: ['vs', 'vs', 'vs'], scores: [0, 0, 0], scoreName: 'x' }), code: 'INVALID_ARGUMENT' },
    { kind: 'the routes alone', make: () => ['vs', 'vs', 'vs'], code: 'INVALID_ARGUMENT' },
    { kind: 'H - 1 routes', make: () => ({ routes: ['vs', 'pe'], scores: [0, 0], scoreName: 'x' }), code: 'INVALID_ARGUMENT' },
    { kind: 'H + 1 routes', make: () => ({ routes: ['vs', 'pe', 'vs', 'pe'], scores: [0, 0, 0, 0], scoreName: 'x' }), code: 'INVALID_ARGUMENT' },
    { kind: "a route 'VS'", make: () => ({ routes: ['vs', 'VS', 'pe'], scores: [0, 0, 0], scoreName: 'x' }), code: 'INVALID_ARGUMENT' },
    { kind: "a route 'dense'", make: () => ({ routes: ['dense', 'vs', 'pe'], scores: [0, 0, 0], scoreName: 'x' }), code: 'INVALID_ARGUMENT' },
    { kind: 'a route undefined', make: () => ({ routes: ['vs', undefined, 'pe'], scores: [0, 0, 0], scoreName: 'x' }), code: 'INVALID_ARGUMENT' },
    { kind: 'routes as a string', make: () => ({ routes: 'vs,vs,vs', scores: [0, 0, 0], scoreName: 'x' }), code: 'INVALID_ARGUMENT' },
    { kind: 'no scores', make: () => ({ routes: ['vs', 'vs', 'vs'], scoreName: 'x' }), code: 'INVALID_ARGUMENT' },
    { kind: 'H - 1 scores', make: () => ({ routes: ['vs', 'vs', 'vs'], scores: [0, 0], scoreName: 'x' }), code: 'INVALID_ARGUMENT' },
    { kind: 'a NaN score', make: () => ({ routes: ['vs', 'vs', 'vs'], scores: [0, Number.NaN, 0], scoreName: 'x' }), code: 'NON_FINITE' },
    { kind: 'an Infinity score', make: () => ({ routes: ['vs', 'pe', 'vs'], scores: Float64Array.of(0, 0, Number.POSITIVE_INFINITY), scoreName: 'x' }), code: 'NON_FINITE' },
    { kind: 'a string score', make: () => ({ routes: ['vs', 'vs', 'vs'], scores: [0, '1', 0], scoreName: 'x' }), code: 'INVALID_ARGUMENT' },
    { kind: 'no scoreName', make: () => ({ routes: ['vs', 'vs', 'vs'], scores: [0, 0, 0] }), code: 'INVALID_ARGUMENT' },
    { kind: 'a NaN threshold', make: () => ({ routes: ['vs', 'vs', 'vs'], scores: [0, 0, 0], scoreName: 'x', threshold: Number.NaN }), code: 'INVALID_ARGUMENT' },
    {
      kind: 'a throw',
      make: () => {
        throw new TypeError('router bug');
      },
      code: 'INVALID_ARGUMENT',
    },
    {
      kind: 'a CrispError throw',
      make: () => {
        throw new NonFiniteError('stats hold NaN');
      },
      code: 'NON_FINITE',
    },
  ),
);

describe('random router decisions', () => {
  it('a valid decision is the plan’s routing and its output is attention on the plan’s mask; the rest are the exact code', async () => {
    const be = createReferenceBackend();
    const x = problem(be, { n, H, d, seed: 11 });
    await fc.assert(
      fc.asyncProperty(decisionArb, async (dec) => {
        let kept: RoutingDecision | undefined;
        const router = {
          name: 'hostileRouter',
          route: () => {
            const r = dec.make();
            kept = r as RoutingDecision;
            return r as RoutingDecision;
          },
        };
        const out = poisoned(be, 'f32', [n, H, d]);
        const policy: Policy = { ...basePolicy(B), router };
        let res: Awaited<ReturnType<typeof sparsePrefill>> | undefined;
        const code = await codeOf(async () => {
          res = await sparsePrefill(be, x, policy, { minSparseLength: 0, out });
        });
        expect(code, dec.kind).toBe(dec.code);
        if (dec.code !== undefined) return untouched(be, out, dec.kind);
        const given = kept!;
        expect(res!.plan.routing!.routes, dec.kind).toEqual(Array.from(given.routes));
        expect(Array.from(res!.plan.routing!.scores), dec.kind).toEqual(Array.from(given.scores));
        // the plan holds a copy: changing the router's arrays afterwards changes nothing
        (given.routes as Route[])[0] = 'dense' as never;
        expect(res!.plan.routing!.routes[0]).not.toBe('dense');
        await matchesMask(be, x, res!, dec.kind);
      }),
      { numRuns: 120 },
    );
  });

  it('a throwing router is named in the error, with its own error as the cause', async () => {
    const be = createReferenceBackend();
    const x = problem(be, { n, H, d, seed: 12 });
    const bug = new RangeError('index 9 out of range');
    const router = {
      name: 'buggy',
      route: (): RoutingDecision => {
        throw bug;
      },
    };
    const e = await errorOf(sparsePrefill(be, x, { ...basePolicy(B), router }, { minSparseLength: 0 }));
    expect(e?.code).toBe('INVALID_ARGUMENT');
    expect(e?.message).toMatch(/^router buggy threw RangeError: index 9 out of range/);
    expect(e?.cause).toBe(bug);
    const async = { name: 'later', route: (async () => ({ routes: [], scores: [], scoreName: '' })) as never };
    expect((await errorOf(sparsePrefill(be, x, { ...basePolicy(B), router: async }, { minSparseLength: 0 })))?.message).toMatch(
      /router later returned a Promise: routers must be synchronous/,
    );
  });
});

type Selection = { readonly kind: string; readonly value: unknown; readonly error?: CrispErrorCode; readonly zero: boolean };

/** What a selector may return for one direction: the list's own code, and whether it keeps block 0. */
const selectionArb: fc.Arbitrary<Selection> = fc.oneof(
  fc.array(fc.integer({ min: 0, max: Nb - 1 }), { maxLength: 3 * Nb }).map((a) => ({ kind: `any order [${a}]`, value: a, zero: a.includes(0) })),
  fc.array(fc.integer({ min: 1, max: Nb - 1 }), { maxLength: Nb }).map((a) => ({ kind: `with 0 [${a}]`, value: Int32Array.from([...a, 0]), zero: true })),
  fc.constantFrom<Selection>(
    { kind: 'empty', value: [], zero: false },
    { kind: 'future only', value: Int32Array.of(Nb - 1), zero: false },
    { kind: '100,000 zeros', value: new Int32Array(100_000), zero: true },
    { kind: 'NaN', value: [0, Number.NaN], error: 'INVALID_MASK', zero: true },
    { kind: 'a fraction', value: [0, 2.5], error: 'INVALID_MASK', zero: true },
    { kind: 'negative', value: Int32Array.of(0, -3), error: 'INVALID_MASK', zero: true },
    { kind: 'Nb', value: [0, Nb], error: 'INVALID_MASK', zero: true },
    { kind: '2^32', value: [2 ** 32], error: 'INVALID_MASK', zero: false },
    { kind: 'strings', value: ['0', '1'], error: 'INVALID_MASK', zero: false },
    { kind: 'a BigInt64Array', value: new BigInt64Array(2), error: 'INVALID_MASK', zero: false },
    { kind: 'undefined', value: undefined, error: 'INVALID_ARGUMENT', zero: false },
    { kind: 'a Set', value: new Set([0]), error: 'INVALID_ARGUMENT', zero: false },
    { kind: 'a Promise', value: Promise.resolve([0]), error: 'INVALID_ARGUMENT', zero: false },
  ),
);

/**
 * One property over random selector outputs (vertical, slash) and routes: `place` puts the
 * hostile selector into a policy, `want` is the code it must end with (undefined: success),
 * and on success `check` looks at the plan's lists before the output is compared with
 * attention on the plan's mask; on failure `out` must be untouched.
 */
async function selectorProperty(
  seed: number,
  numRuns: number,
  place: (selector: { name: string; select: (input: DirectionScores) => Int32Array }, routes: Route[]) => Policy,
  want: (vertical: Selection, slash: Selection, routes: Route[]) => CrispErrorCode | undefined,
  check: (res: Awaited<ReturnType<typeof sparsePrefill>>, vertical: Selection, routes: Route[], label: string) => void,
): Promise<void> {
  const be = createReferenceBackend();
  const x = problem(be, { n, H, d, seed });
  const arb = fc.record({ vertical: selectionArb, slash: selectionArb, routes: routesArb });
  await fc.assert(
    fc.asyncProperty(arb, async ({ vertical, slash, routes }) => {
      const selector = {
        name: 'hostileSelector',
        select: (input: DirectionScores) => (input.direction === 'vertical' ? vertical : slash).value as Int32Array,
      };
      const expected = want(vertical, slash, routes);
      const label = `${vertical.kind} / ${slash.kind}, routes ${routes}`;
      const out = poisoned(be, 'f32', [n, H, d]);
      let res: Awaited<ReturnType<typeof sparsePrefill>> | undefined;
      const code = await codeOf(async () => {
        res = await sparsePrefill(be, x, place(selector, routes), { minSparseLength: 0, out });
      });
      expect(code, label).toBe(expected);
      if (expected !== undefined) return untouched(be, out, label);
      check(res!, vertical, routes, label);
      await matchesMask(be, x, res!, label);
    }),
    { numRuns },
  );
}

/** A router that routes as given. */
const given = (routes: Route[]) => ({ name: 'given', route: () => ({ routes, scores: new Float64Array(H), scoreName: 'given' }) });

/** Head h's vertical list in a plan. */
function verticalOf(res: Awaited<ReturnType<typeof sparsePrefill>>, h: number): number[] {
  const vs = res.plan.mask!.vs!;
  return Array.from(vs.vertical.subarray(vs.verticalPtr[h], vs.verticalPtr[h + 1]));
}

describe('random selector outputs', () => {
  it('valid lists (any order, duplicates) give the sorted lists and attention on them; the rest are the exact code', async () => {
    await selectorProperty(
      13,
      150,
      (selector, routes) => ({ ...basePolicy(B), router: given(routes), vs: selector }),
      // checked in order: the vertical list, the slash list, then coverage (block 0 in one of them)
      (vertical, slash, routes) => (routes.includes('vs') ? (vertical.error ?? slash.error ?? (vertical.zero || slash.zero ? undefined : 'INVALID_MASK')) : undefined),
      (res, vertical, routes, label) => {
        const h = routes.indexOf('vs');
        if (h >= 0) expect(verticalOf(res, h), label).toEqual([...new Set(Array.from(vertical.value as ArrayLike<number>))].sort((a, b) => a - b));
      },
    );
  });
});

describe('random peVs outputs (the lists PE heads keep, Policy.peVs)', () => {
  it('valid lists join the PE heads\' lists and attention runs on them; the rest are the exact code', async () => {
    await selectorProperty(
      17,
      100,
      (selector, routes) => ({ ...basePolicy(B), router: given(routes), peWithVs: true, peVs: selector }),
      // PE heads always keep block 0 and offset 0, so only the lists themselves are checked
      (vertical, slash, routes) => (routes.includes('pe') ? (vertical.error ?? slash.error) : undefined),
      (res, vertical, routes, label) => {
        const h = routes.indexOf('pe');
        if (h < 0) return;
        const got = new Set(verticalOf(res, h));
        for (const J of Array.from(vertical.value as ArrayLike<number>)) expect(got.has(J), `${label}: block ${J}`).toBe(true);
      },
    );
  });
});

describe('router and selector factories', () => {
  const factories: Array<[string, (o: never) => unknown, readonly string[]]> = [
    ['cStruct', cStruct, ['tauProxy', 'wSink', 'wLocal']],
    ['jsd', jsd, ['tau']],
    ['entropy', entropy, ['maxSupportExponent']],
    ['noiseFloor', noiseFloor, ['alpha', 'kMin']],
    ['cumulativeCoverage', cumulativeCoverage, ['gamma', 'kMin']],
    ['globalCoverage', globalCoverage, ['gamma', 'kMin']],
    ['quantileFloor', quantileFloor, ['q', 'alpha', 'kMin']],
    ['medianFloor', medianFloor, ['alpha', 'kMin']],
    ['robustFloor', robustFloor, ['c', 'relSpread', 'kMin']],
    ['topK', topK, ['k', 'keepAnchors']],
  ];

  it('take any value of any parameter: a frozen part, or INVALID_ARGUMENT at creation', () => {
    for (const [name, make, keys] of factories) {
      fc.assert(
        fc.property(fc.constantFrom(...keys), fc.anything(), (key, value) => {
          let made: unknown;
          let code: CrispErrorCode | undefined;
          try {
            made = make({ ...(name === 'topK' && key !== 'k' ? { k: 2 } : {}), [key]: value } as never);
          } catch (e) {
            if (!(e instanceof CrispError)) throw new Error(`${name}({ ${key}: … }) threw ${String(e)}`);
            code = e.code;
          }
          if (code !== undefined) expect(code, `${name}.${key}`).toBe('INVALID_ARGUMENT');
          else expect(Object.isFrozen(made), `${name}.${key}`).toBe(true);
        }),
        { numRuns: 60 },
      );
    }
  });

  it('refuse null, non-object and misspelt options, and NaN or out-of-range values, by name', () => {
    for (const [name, make] of factories) {
      for (const bad of [null, 3, 'fast', [0.2]]) {
        expect(() => make(bad as never), `${name}(${String(bad)})`).toThrow(expect.objectContaining({ code: 'INVALID_ARGUMENT' }));
      }
      expect(() => make({ tau_proxy: 0.3 } as never), name).toThrow(/unknown option 'tau_proxy'/);
    }
    const cases: Array<[string, () => unknown, RegExp]> = [
      ['cStruct tauProxy NaN', () => cStruct({ tauProxy: Number.NaN }), /tauProxy/],
      ['cStruct wSink 0', () => cStruct({ wSink: 0 }), /wSink/],
      ['jsd tau 1', () => jsd({ tau: 1 }), /tau/],
      ['noiseFloor alpha -1', () => noiseFloor({ alpha: -1 }), /alpha/],
      ['noiseFloor kMin 1.5', () => noiseFloor({ kMin: 1.5 }), /kMin/],
      ['globalCoverage gamma 0', () => globalCoverage({ gamma: 0 }), /gamma/],
      ['robustFloor relSpread -0.1', () => robustFloor({ relSpread: -0.1 }), /relSpread/],
      ['topK with no options', () => topK(undefined as never), /k is required/],
      ["topK keepAnchors 'no'", () => topK({ k: 2, keepAnchors: 'no' as never }), /keepAnchors/],
      ["fixed('dense')", () => fixed('dense' as never), /route must be/],
    ];
    for (const [what, call, names] of cases) expect(call, what).toThrow(expect.objectContaining({ code: 'INVALID_ARGUMENT', message: expect.stringMatching(names) }));
  });

  it('presets are found by own name only', () => {
    expect(presetByName('crisp')).toBe(presets.crisp);
    for (const bad of ['__proto__', 'constructor', 'toString', 'CRISP', '', 3]) {
      expect(() => presetByName(bad as never), String(bad)).toThrow(expect.objectContaining({ code: 'INVALID_ARGUMENT' }));
      expect((presets as Record<string, unknown>)[bad as string], String(bad)).toBeUndefined();
    }
  });
});
