import { deviceRouteTerms, isCrispError, type ProxyStats, type Route, type Router, mulberry32 as rng } from '@crisp/core';
import { describe, expect, it } from 'vitest';
import { anyPe, cStruct, entropy, fixed, jsd, jsDistance, residualJsd, routingAgreement } from './index.js';


function normalised(r: () => number, len: number, sharp: number): Float64Array {
  const a = Float64Array.from({ length: len }, () => Math.exp(sharp * (r() - 0.5)));
  let s = 0;
  for (const x of a) s += x;
  return a.map((x) => x / s);
}

/** Hand-built statistics (what a backend would return) for H heads over Nb blocks. */
function stats(seed: number, H: number, Nb: number, B = 128): ProxyStats {
  const r = rng(seed);
  const vb = new Float64Array(H * Nb);
  const pe = new Float64Array(H * Nb);
  for (let h = 0; h < H; h++) {
    const v = normalised(r, Nb, 8 * r());
    vb.set(v, h * Nb);
    if (h % 2 === 0) {
      // A pooled estimate that agrees with p_v up to a few percent (small D).
      const w = v.map((x) => x * (1 + 0.2 * (r() - 0.5)));
      let t = 0;
      for (const x of w) t += x;
      pe.set(w.map((x) => x / t), h * Nb);
    } else {
      pe.set(normalised(r, Nb, 8 * r()), h * Nb);
    }
  }
  return {
    n: Nb * B,
    heads: H,
    blockSize: B,
    numBlocks: Nb,
    proxyRows: B,
    cStruct: Float64Array.from({ length: H }, () => r()),
    verticalBlocks: vb,
    slashBlocks: Float64Array.from(vb),
    pooledEstimate: pe,
    rowEntropy: Float64Array.from({ length: H }, () => r() * Math.log(Nb * B)),
  };
}

function errCode(f: () => unknown): string {
  try {
    f();
  } catch (e) {
    expect(isCrispError(e)).toBe(true);
    return (e as { code: string }).code;
  }
  return 'no error';
}

/** D computed the textbook way: logs of the mixture, natural base, then sqrt. */
function textbookD(p: ArrayLike<number>, q: ArrayLike<number>): number {
  let js = 0;
  for (let i = 0; i < p.length; i++) {
    const m = (p[i] + q[i]) / 2;
    if (p[i] > 0) js += 0.5 * p[i] * (Math.log(p[i]) - Math.log(m));
    if (q[i] > 0) js += 0.5 * q[i] * (Math.log(q[i]) - Math.log(m));
  }
  return Math.sqrt(js);
}

describe('cStruct', () => {
  it('routes VS iff C_struct >= τ_proxy and returns the scores it used', () => {
    const seed = (Math.random() * 2 ** 31) >>> 0;
    const s = stats(seed, 32, 40);
    for (const tauProxy of [0.2, 0.5]) {
      const d = cStruct({ tauProxy }).route(s);
      expect(d.routes, `seed ${seed}`).toEqual(Array.from(s.cStruct, (c) => (c >= tauProxy ? 'vs' : 'pe')));
      expect(Array.from(d.scores)).toEqual(Array.from(s.cStruct));
      expect(d.threshold).toBe(tauProxy);
      expect(d.scoreName).toBe('C_struct');
    }
    // The boundary: exactly τ_proxy is VS.
    const edge = { ...s, cStruct: Float64Array.from([0.2, 0.19999999, 0.2000001]).subarray(0, 3), heads: 3 };
    expect(cStruct().route({ ...edge, verticalBlocks: s.verticalBlocks.subarray(0, 120) }).routes).toEqual(['vs', 'pe', 'vs']);
  });

  it('offers its rule for device routing, not inherited by a router with its own route()', () => {
    const r = cStruct({ tauProxy: 0.35 });
    expect(r.device).toEqual({ kind: 'cStruct', tauProxy: 0.35 });
    expect(Object.keys(r)).not.toContain('device');
    const mine = { ...r, route: (s: ProxyStats) => r.route(s) };
    expect((mine as { device?: unknown }).device).toBeUndefined();
  });

  it('declares its windows for the pipeline and validates its options', () => {
    const r = cStruct({ wSink: 64, wLocal: 256 });
    expect(r.needs).toEqual({ wSink: 64, wLocal: 256, optionalStats: [] });
    expect(cStruct().needs).toEqual({ wSink: 128, wLocal: 128, optionalStats: [] });
    for (const tauProxy of [0, 1, -0.5, Number.NaN]) expect(errCode(() => cStruct({ tauProxy }))).toBe('INVALID_ARGUMENT');
    for (const wSink of [0, 1.5, -1]) expect(errCode(() => cStruct({ wSink }))).toBe('INVALID_ARGUMENT');
    expect(errCode(() => cStruct({ wLocal: 0 }))).toBe('INVALID_ARGUMENT');
  });

  it('rejects malformed or non-finite statistics', () => {
    const s = stats(1, 4, 10);
    expect(errCode(() => cStruct().route({ ...s, cStruct: new Float64Array(3) }))).toBe('SHAPE_MISMATCH');
    expect(errCode(() => cStruct().route({ ...s, cStruct: Float64Array.from([0.1, Number.NaN, 0.3, 0.4]) }))).toBe('NON_FINITE');
    expect(errCode(() => cStruct().route(undefined as unknown as ProxyStats))).toBe('INVALID_ARGUMENT');
  });
});

describe('jsd', () => {
  it('D = sqrt(½KL(ā‖m) + ½KL(â‖m)) (natural logs); D < τ goes to PE', () => {
    const seed = (Math.random() * 2 ** 31) >>> 0;
    const H = 24;
    const Nb = 33;
    const s = stats(seed, H, Nb);
    const d = jsd().route(s);
    for (let h = 0; h < H; h++) {
      const a = s.pooledEstimate.subarray(h * Nb, (h + 1) * Nb);
      const b = s.verticalBlocks.subarray(h * Nb, (h + 1) * Nb);
      const D = textbookD(a, b);
      expect(d.scores[h], `seed ${seed} head ${h}`).toBeCloseTo(D, 12);
      expect(d.routes[h]).toBe(D < 0.1 ? 'pe' : 'vs');
    }
    expect(d.threshold).toBe(0.1);
    // Both routes occur on these heads, so the comparison above tested both sides.
    expect(new Set(d.routes).size, `seed ${seed}`).toBe(2);
  });

  it('known values: identical -> 0, disjoint -> sqrt(ln 2)', () => {
    expect(jsDistance([0.2, 0.8], [0.2, 0.8])).toBe(0);
    expect(jsDistance([1, 0], [0, 1])).toBeCloseTo(Math.sqrt(Math.LN2), 14);
    // [1,0] vs [0.5,0.5]: m = [0.75, 0.25]
    const js = 0.5 * Math.log(1 / 0.75) + 0.5 * (0.5 * Math.log(0.5 / 0.75) + 0.5 * Math.log(0.5 / 0.25));
    expect(jsDistance([1, 0], [0.5, 0.5])).toBeCloseTo(Math.sqrt(js), 14);
  });

  it('validates τ and distributions', () => {
    for (const tau of [0, 0.9, -1, Number.NaN]) expect(errCode(() => jsd({ tau }))).toBe('INVALID_ARGUMENT');
    const s = stats(2, 2, 4);
    const bad = Float64Array.from([0.5, 0.5, 0, 0, -0.5, 0.5, 0.5, 0.5]);
    expect(errCode(() => jsd().route({ ...s, pooledEstimate: bad }))).toBe('INVALID_ARGUMENT');
    expect(errCode(() => jsd().route({ ...s, pooledEstimate: new Float64Array(8) }))).toBe('INVALID_ARGUMENT');
    expect(errCode(() => jsd().route({ ...s, verticalBlocks: new Float64Array(7) }))).toBe('SHAPE_MISMATCH');
  });
});

describe('entropy', () => {
  it('score η = H / ln n; VS iff η <= η_max', () => {
    const seed = (Math.random() * 2 ** 31) >>> 0;
    const s = stats(seed, 32, 16);
    const d = entropy().route(s);
    const logN = Math.log(s.n);
    for (let h = 0; h < 32; h++) {
      expect(d.scores[h], `seed ${seed}`).toBeCloseTo(s.rowEntropy[h] / logN, 14);
      expect(d.routes[h]).toBe(s.rowEntropy[h] / logN <= 0.8 ? 'vs' : 'pe');
    }
    // exp(H) = n^0.5 is VS at η_max = 0.8 and PE at 0.4.
    const one = { ...s, heads: 1, cStruct: new Float64Array(1), rowEntropy: Float64Array.from([0.5 * logN]) };
    expect(entropy().route(one).routes).toEqual(['vs']);
    expect(entropy({ maxSupportExponent: 0.4 }).route(one).routes).toEqual(['pe']);
    for (const m of [0, 1, Number.NaN]) expect(errCode(() => entropy({ maxSupportExponent: m }))).toBe('INVALID_ARGUMENT');
  });
});

describe('fixed and routingAgreement', () => {
  it('fixed routes every head one way', () => {
    const s = stats(3, 5, 4);
    expect(fixed('vs').route(s).routes).toEqual(['vs', 'vs', 'vs', 'vs', 'vs']);
    expect(fixed('pe').route(s).routes).toEqual(['pe', 'pe', 'pe', 'pe', 'pe']);
    expect(errCode(() => fixed('x' as 'vs'))).toBe('INVALID_ARGUMENT');
  });

  it('agreement is the fraction of heads routed the same', () => {
    expect(routingAgreement(['vs', 'pe', 'vs', 'vs'], ['vs', 'vs', 'vs', 'pe'])).toBe(0.5);
    const s = stats(4, 10, 8);
    const a = cStruct().route(s);
    const b = fixed('vs').route(s);
    const vsCount = a.routes.filter((r) => r === 'vs').length;
    expect(routingAgreement(a, b)).toBe(vsCount / 10);
    expect(errCode(() => routingAgreement(['vs'], ['vs', 'pe']))).toBe('INVALID_ARGUMENT');
    expect(errCode(() => routingAgreement([], []))).toBe('INVALID_ARGUMENT');
    expect(errCode(() => routingAgreement(['vs', 'x' as 'vs'], ['vs', 'pe']))).toBe('INVALID_ARGUMENT');
  });
});

describe('residualJsd', () => {
  it('scores the JSD over blocks 1..Nb−2 (renormalised) and routes PE iff it is below τ with enough residual mass', () => {
    const seed = (Math.random() * 2 ** 31) >>> 0;
    const H = 24;
    const Nb = 33;
    const s = stats(seed, H, Nb);
    const r = residualJsd({ tau: 0.1, minResidual: 0.3 });
    const d = r.route(s);
    const sides = new Set<string>();
    for (let h = 0; h < H; h++) {
      const a = s.pooledEstimate.subarray(h * Nb + 1, (h + 1) * Nb - 1);
      const b = s.verticalBlocks.subarray(h * Nb + 1, (h + 1) * Nb - 1);
      const sa = a.reduce((x, y) => x + y, 0);
      const sb = b.reduce((x, y) => x + y, 0);
      const D = textbookD(a.map((x) => x / sa), b.map((x) => x / sb));
      const residual = 1 - s.verticalBlocks[h * Nb] - s.verticalBlocks[(h + 1) * Nb - 1];
      expect(d.scores[h], `seed ${seed} head ${h}`).toBeCloseTo(D, 12);
      const want = residual >= 0.3 && D < 0.1 ? 'pe' : 'vs';
      expect(d.routes[h], `seed ${seed} head ${h}`).toBe(want);
      sides.add(want);
    }
    expect(sides.size, `seed ${seed}: both routes occur`).toBe(2);
    expect(d.scoreName).toBe('residual JSD distance');
    expect(d.threshold).toBe(0.1);
  });

  it('sends a sink head whose residual the pooled estimate matches to PE, where jsd keeps it VS', () => {
    const Nb = 10;
    // p_v: 0.4 on the sink block, the rest spread over the middle blocks; ā: the sink diluted
    // (one mean key per block), the middle in the same proportions
    const pv = [0.4, 0.1, 0.05, 0.1, 0.05, 0.1, 0.05, 0.05, 0.05, 0.05];
    const mid = pv.slice(1, Nb - 1);
    const midSum = mid.reduce((x, y) => x + y, 0);
    const pa = [0.02, ...mid.map((x) => (x / midSum) * 0.93), 0.05];
    const one = { ...stats(1, 1, Nb), verticalBlocks: Float64Array.from(pv), pooledEstimate: Float64Array.from(pa) };
    expect(residualJsd().route(one).routes).toEqual(['pe']);
    expect(residualJsd().route(one).scores[0]).toBeCloseTo(0, 12);
    expect(jsd().route(one).routes).toEqual(['vs']);
    // the same head with most of its mass on the anchors: too little residual to matter
    const anchored = { ...one, verticalBlocks: Float64Array.from([0.8, ...mid.map((x) => (x / midSum) * 0.1), 0.1]) };
    expect(residualJsd().route(anchored).routes).toEqual(['vs']);
  });

  it('offers its rule for device routing, and anyPe of device rules offers their union; deviceRouteTerms reduces it to two tests', () => {
    const r = residualJsd({ tau: 0.2, minResidual: 0.25 });
    expect(r.device).toEqual({ kind: 'residualJsd', tau: 0.2, minResidual: 0.25 });
    expect(Object.keys(r)).not.toContain('device');
    const both = anyPe([cStruct({ tauProxy: 0.3 }), r, cStruct({ tauProxy: 0.1 })]);
    expect(both.device).toEqual({ kind: 'anyPe', rules: [{ kind: 'cStruct', tauProxy: 0.3 }, r.device, { kind: 'cStruct', tauProxy: 0.1 }] });
    // PE iff C_struct < 0.3 or C_struct < 0.1: one test with the larger τ
    expect(deviceRouteTerms(both.device!)).toEqual({ tauProxy: 0.3, residual: { tau: 0.2, minResidual: 0.25 } });
    expect(deviceRouteTerms(r.device!)).toEqual({ tauProxy: Number.NEGATIVE_INFINITY, residual: { tau: 0.2, minResidual: 0.25 } });
    // jsd's device form is its distance over every block: the other distance test
    expect(jsd({ tau: 0.15 }).device).toEqual({ kind: 'jsd', tau: 0.15 });
    expect(Object.keys(jsd())).not.toContain('device');
    expect(deviceRouteTerms(anyPe([cStruct({ tauProxy: 0.3 }), jsd({ tau: 0.15 })]).device!)).toEqual({ tauProxy: 0.3, jsd: { tau: 0.15 } });
    // two distance tests do not reduce; a part with no device form leaves the union without one
    expect(deviceRouteTerms(anyPe([r, residualJsd()]).device!)).toBeUndefined();
    expect(deviceRouteTerms(anyPe([r, jsd()]).device!)).toBeUndefined();
    const own = { ...cStruct(), name: 'own', route: cStruct().route };
    expect(anyPe([own, jsd()]).device).toBeUndefined();
  });

  it('anyPe holds each part to the Router contract: a malformed part is an error naming it, never read as VS', () => {
    const s = stats(4, 4, 10);
    const part = (route: (st: ProxyStats) => unknown) => ({ name: 'mine', route }) as unknown as Router;
    const decision = (routes: unknown[], scores = new Float64Array(routes.length)) => ({ routes, scores, scoreName: 'x' });
    const bad: [string, (st: ProxyStats) => unknown, string, RegExp][] = [
      ['too few routes', () => decision(['pe']), 'INVALID_ARGUMENT', /router mine returned 1 routes for 4 heads/],
      ["'PE'", () => decision(['PE', 'PE', 'PE', 'PE']), 'INVALID_ARGUMENT', /router mine: route of head 0 is 'PE'/],
      ['a Promise', async () => decision(['pe', 'pe', 'pe', 'pe']), 'INVALID_ARGUMENT', /router mine returned a Promise/],
      ['NaN scores', () => decision(['vs', 'vs', 'vs', 'vs'], new Float64Array(4).fill(Number.NaN)), 'NON_FINITE', /router mine: scores\[0\] is NaN/],
      ['a throw', () => { throw new RangeError('boom'); }, 'INVALID_ARGUMENT', /router mine threw RangeError: boom/],
    ];
    for (const [what, route, code, message] of bad) {
      for (const parts of [[cStruct(), part(route)], [part(route), cStruct()]]) {
        let err: unknown;
        try {
          anyPe(parts).route(s);
        } catch (e) {
          err = e;
        }
        expect(isCrispError(err) && err.code, what).toBe(code);
        expect((err as Error).message, what).toMatch(message);
      }
    }
    // a well-formed part still decides: every head it sends to PE goes to PE
    const routes: Route[] = ['pe', 'vs', 'vs', 'pe'];
    const ok = anyPe([fixed('vs'), part(() => decision(routes))]).route(s);
    expect(ok.routes).toEqual(routes);
    expect(ok.scoreName).toBe(fixed('vs').route(s).scoreName);
  });

  it('validates its options', () => {
    for (const tau of [0, 0.9, -1, Number.NaN]) expect(errCode(() => residualJsd({ tau }))).toBe('INVALID_ARGUMENT');
    for (const minResidual of [-0.1, 1, Number.NaN]) expect(errCode(() => residualJsd({ minResidual }))).toBe('INVALID_ARGUMENT');
    expect(residualJsd()).toMatchObject({ tau: 0.1, minResidual: 0.3, needs: { optionalStats: ['pooledEstimate'] } });
  });
});

describe('declared optional statistics', () => {
  it('each router routes without reading an optional statistic it does not declare', () => {
    for (const r of [cStruct(), entropy(), jsd(), residualJsd(), fixed('vs')]) {
      const declared = r.needs?.optionalStats;
      expect(declared, r.name).toBeDefined();
      const s = { ...stats(3, 4, 10) };
      // what a backend that skipped them hands over: the fields throw when read
      for (const f of ['rowEntropy', 'pooledEstimate'] as const) {
        if (declared?.includes(f)) continue;
        Object.defineProperty(s, f, {
          get() {
            throw new Error(`${r.name} read ${f}`);
          },
        });
      }
      expect(r.route(s).routes, r.name).toHaveLength(4);
    }
    expect(entropy().needs?.optionalStats).toEqual(['rowEntropy']);
    expect(jsd().needs?.optionalStats).toEqual(['pooledEstimate']);
  });
});
