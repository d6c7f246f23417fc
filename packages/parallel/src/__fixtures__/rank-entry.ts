// A rank's entry for the worker-thread test: each rank builds the same scenario, takes its
// shard and runs parallelPrefill on the reference backend.
import type { DType, Policy } from '@crisp/core';
import { crispGuardedSmall, crispSmall, flexPrefillSmall } from '@crisp/conformance';
import { createReferenceBackend } from '@crisp/reference';
import { type ProfileName, scenario } from '@crisp/synth';
import { shardTensor, zigzagLayout } from '../layout.js';
import { serveRank } from '../node.js';
import { parallelPrefill } from '../prefill.js';

export interface RankJob {
  readonly profile: ProfileName;
  readonly n: number;
  readonly seed: number;
  readonly dtype: DType;
  readonly policy: string;
  /** rank whose keys get a NaN, to check a failing rank stops the others */
  readonly poisonRank?: number;
}

const policies: Record<string, Policy> = { [crispSmall.name]: crispSmall, [crispGuardedSmall.name]: crispGuardedSmall, [flexPrefillSmall.name]: flexPrefillSmall };

serveRank(async (comm, data) => {
  const job = data as RankJob;
  const policy = policies[job.policy];
  const whole = scenario(job.profile, { n: job.n, heads: 4, kvHeads: 2, headDim: 32, seed: job.seed, dtype: job.dtype }).rows(0, job.n);
  const layout = zigzagLayout(job.n, comm.size, policy.blockSize ?? 128);
  const k = shardTensor(layout, comm.rank, whole.k);
  if (job.poisonRank === comm.rank) k.data[3] = job.dtype === 'f32' ? Number.NaN : 0x7fc0;
  const res = await parallelPrefill(comm, createReferenceBackend(), layout, { q: shardTensor(layout, comm.rank, whole.q), k, v: shardTensor(layout, comm.rank, whole.v) }, policy);
  return { output: res.output, routes: res.plan.routing?.routes, traffic: res.traffic, commTraffic: comm.traffic };
});
