import { type HostTensor, type Policy, type Router, sparsePrefill, type VsSelector } from '@crisp/core';
import { createReferenceBackend } from '@crisp/reference';
import { crisp, flexPrefill } from '@crisp/presets';
import { robustFloor } from '@crisp/select';

// A router of your own: VS when the anchors hold mass (C_struct) OR the proxy rows are
// concentrated anywhere (low entropy), so sink-free concentrated heads still take VS.
export const anchorsOrConcentrated: Router = {
  name: 'anchorsOrConcentrated',
  needs: { wSink: 128, wLocal: 128, optionalStats: ['rowEntropy'] },
  route(stats) {
    const scores = Float64Array.from(stats.cStruct, (c, h) => Math.max(c, 1 - stats.rowEntropy[h] / Math.log(stats.n)));
    return {
      routes: Array.from(scores, (s) => (s >= 0.2 ? 'vs' : 'pe')),
      scores,
      scoreName: 'max(C_struct, 1 - H / ln n)',
      threshold: 0.2,
    };
  },
};

// A VS selector of your own: blocks above twice the mean background, at least 4 blocks,
// and always both end blocks. Return ascending indices; break ties toward the lower index.
export const twiceTheMean: VsSelector = {
  name: 'twiceTheMean',
  select({ blockScores: p }) {
    const Nb = p.length;
    const mu = Math.max(1 - p[0] - p[Nb - 1], 0) / Math.max(Nb - 2, 1);
    const order = [...p.keys()].sort((a, b) => p[b] - p[a] || a - b);
    const keep = new Set(order.filter((J) => p[J] > 2 * mu));
    for (const J of order.slice(0, 4)) keep.add(J);
    keep.add(0).add(Nb - 1);
    return Int32Array.from(keep).sort();
  },
};

// Mix freely: your router and selector with CRISP's PE path and defaults...
export const mine: Policy = { ...crisp, name: 'mine', router: anchorsOrConcentrated, vs: twiceTheMean };
// ...or FlexPrefill's JSD router with the robust floor from @crisp/select.
export const jsdRobust: Policy = { ...crisp, name: 'jsdRobust', router: flexPrefill.router, vs: robustFloor({ c: 3 }) };

export async function prefill(policy: Policy, q: HostTensor, k: HostTensor, v: HostTensor) {
  const backend = createReferenceBackend();
  const inputs = { q: backend.upload(q), k: backend.upload(k), v: backend.upload(v) };
  const { output, plan } = await sparsePrefill(backend, inputs, policy);
  console.log(`${policy.name}: routes ${plan.routing?.routes.join(' ')}, density ${plan.overallDensity.toFixed(3)}`);
  return { output: await backend.download(output), plan };
}
