/** The shape of bench.json. */
import type { BenchConfig } from './config.js';
import type { MachineInfo } from './machine.js';
import type { PeerResult } from './peers.js';
import type { AccuracyResult } from './suites/accuracy.js';
import type { CrossoverResult } from './suites/crossover.js';
import type { FloorsResult } from './suites/floors.js';
import type { LatencyResult } from './suites/latency.js';
import type { OnCurveResult } from './suites/on-curve.js';
import type { ParallelResult } from './suites/parallel.js';
import type { ParityResult } from './suites/parity.js';
import type { TfjsResult } from './suites/tfjs.js';
import type { VarlenResult } from './suites/varlen.js';

/**
 * A suite merged as a whole (tfjs, varlen, parity: their rows have no per-row run): the
 * startedAt of the command that ran it, so a merged file can tell which earlier commands
 * still contribute. Results written before suites carried it lack it.
 */
export interface SuiteRun {
  readonly run?: string;
}

export interface BenchResult {
  readonly schema: 'crisp-bench/1';
  readonly command: string;
  readonly cwd: string;
  readonly startedAt: string;
  finishedAt?: string;
  durationS?: number;
  /**
   * Set while the run is going: the suite it was in when this file was written. A file
   * that still has it is from a run stopped early (e.g. killed at a wall-clock limit); its
   * finished sizes are valid, the rest is missing.
   */
  inProgress?: string;
  readonly machine: MachineInfo;
  readonly config: BenchConfig;
  readonly backends: { name: string; available: boolean; reason?: string; device?: string; shippedCrossover?: number }[];
  readonly suites: {
    latency?: LatencyResult & { peers: PeerResult };
    accuracy?: AccuracyResult;
    onCurve?: OnCurveResult;
    crossover?: CrossoverResult;
    floors?: FloorsResult;
    tfjs?: TfjsResult & SuiteRun;
    varlen?: VarlenResult & SuiteRun;
    parity?: ParityResult & SuiteRun;
    parallel?: ParallelResult;
  };
  figures?: string[];
  /** with --merge: the commands whose results this file also holds */
  readonly earlierRuns?: { command: string; startedAt: string; durationS?: number; backends: string[]; inProgress?: string }[];
}
