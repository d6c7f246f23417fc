/**
 * Test helpers (Node only): the seed and float64 checks. The Chromium path and flags and
 * the static file server are @crisp/browser-test's (tooling/browser-test), shared with
 * packages/tfjs.
 */

export function testSeed(): number {
  const seed = Number(process.env.CRISP_TEST_SEED ?? Math.floor(Math.random() * 2 ** 31));
  console.log(`demo tests: seed ${seed} (replay with CRISP_TEST_SEED=${seed})`);
  return seed;
}

/** ‖a − b‖ / ‖b‖ (Frobenius) in float64. */
export function relErr(a: ArrayLike<number>, b: ArrayLike<number>): number {
  if (a.length !== b.length) throw new Error(`length ${a.length} != ${b.length}`);
  let num = 0;
  let den = 0;
  for (let i = 0; i < a.length; i++) {
    const e = a[i] - b[i];
    num += e * e;
    den += b[i] * b[i];
  }
  return Math.sqrt(num / den);
}

/**
 * The plot data agrees with the mask: block masses sum to 1, and every selected vertical key
 * block J (slash offset O) is in the mask's rows for every query block I >= J (I >= O).
 * Returns a description of the first disagreement, or null.
 */
export function checkCliffData(
  heads: readonly { head: number; verticalMass: number[] | null; slashMass: number[] | null; verticalSelected: number[]; slashSelected: number[] }[],
  mask: { numBlocks: number; rowPtr: number[]; cols: number[] },
): string | null {
  const Nb = mask.numBlocks;
  const has = (h: number, I: number, J: number) => mask.cols.slice(mask.rowPtr[h * Nb + I], mask.rowPtr[h * Nb + I + 1]).includes(J);
  for (const h of heads) {
    for (const [name, m] of [
      ['p_v', h.verticalMass],
      ['p_s', h.slashMass],
    ] as const) {
      if (!m || m.length !== Nb) return `head ${h.head}: ${name} has ${m?.length} blocks, not ${Nb}`;
      const sum = m.reduce((a, b) => a + b, 0);
      if (Math.abs(sum - 1) > 1e-3 || m.some((x) => !(x >= 0))) return `head ${h.head}: ${name} sums to ${sum}`;
    }
    for (const J of h.verticalSelected) {
      for (let I = J; I < Nb; I++) if (!has(h.head, I, J)) return `head ${h.head}: vertical block ${J} missing in query block ${I}`;
    }
    for (const O of h.slashSelected) {
      for (let I = O; I < Nb; I++) if (!has(h.head, I, I - O)) return `head ${h.head}: slash offset ${O} missing in query block ${I}`;
    }
  }
  return null;
}
