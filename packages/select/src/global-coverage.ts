/**
 * The PE path's global adaptive selection (FlexPrefill's, kept by CRISP because diffuse
 * heads have no mass cliff). The backend does the O(Nb²) work (`peBlockRows`):
 *
 *   Q̄_I, K̄_J  = mean query / key of each block
 *   Ā[I, J]   = softmax_J(Q̄_I · K̄_J · scale) over J <= I
 *   flatten the Nb(Nb+1)/2 causal entries, normalise to sum 1, sort descending, keep the
 *   shortest prefix whose cumulative sum reaches γ.
 *
 * PE heads also receive the kMin / B best vertical and slash blocks (the pipeline adds them,
 * with offset 0 added to the slash ones), so every query block keeps its diagonal block.
 * FlexPrefill forces key block 0 and offset 0 inside its kMin / B; here key block 0 is kept
 * only when it ranks (see @crisp/presets' README on flexPrefill).
 * The pipeline uses ceil(kMin / B) blocks, so kMin should be a multiple of B.
 */
import type { PeSelector } from '@crisp/core';
import { checkOptions } from '@crisp/core';
import { checkGamma, checkKMin } from './checks.js';

export interface GlobalCoverageOptions {
  /** γ: the pooled-map mass to cover, 0 < γ < 1. Default 0.95. */
  readonly gamma?: number;
  /** k_min: tokens per direction of best VS blocks also given to PE heads. Default 1024. */
  readonly kMin?: number;
}

/** The PE selector: γ coverage of the pooled block map, plus kMin / B VS blocks per direction. */
export function globalCoverage(options?: GlobalCoverageOptions): PeSelector {
  const opts: GlobalCoverageOptions = checkOptions(options, 'globalCoverage', ['gamma', 'kMin']);
  const gamma = checkGamma(opts.gamma ?? 0.95);
  const kMin = checkKMin(opts.kMin ?? 1024);
  return Object.freeze({ name: `globalCoverage(gamma=${gamma})`, gamma, kMin });
}
