/** The soak's shared shapes (soak.ts runs the calls soak-calls.ts draws; fault-cases.ts adds the explicit ones). */
import type { Backend, BlockMask, DeviceTensor, HostTensor } from '@crisp/core';
import type { CudaFaults } from '@crisp/kernels-cuda';
import type { Problem } from './soak-check.js';

/** What the soak reads of a CUDA backend beyond core's Backend (CudaBackend has them). */
export interface CudaTools {
  memoryInfo(): { free: number; total: number; pooled: number };
  poolStats(): { liveBytes: number; pooledBytes: number; misses: number; keptStats: number };
  trimMemory(): void;
  readRows(t: DeviceTensor, rows: Int32Array): HostTensor;
}

export interface SoakTarget {
  readonly backend: Backend & Partial<CudaTools>;
  /** the injector installed in the backend (CudaBackendOptions.faults): enables the fault calls */
  readonly faults?: CudaFaults;
  /** another backend, whose tensors this one must refuse with WRONG_BACKEND */
  readonly foreign?: Backend;
}

/** A valid call's result: the output to check (under `mask`; dense without), then release it. */
export interface Valid {
  readonly problem: Problem;
  readonly output: DeviceTensor;
  readonly mask?: BlockMask;
  /** q's host values when the call ran on other queries than the problem's (chunked: its last rows) */
  readonly qHost?: Float32Array;
  readonly release: () => void;
}

/** One drawn call. */
export interface Call {
  readonly kind: string;
  readonly family: 'valid' | 'invalid' | 'policy' | 'fault';
  /** the CrispError codes it must end in (none: a valid call, which must succeed and match) */
  readonly expect?: readonly string[];
  /** a fault that may not be reached (the call then succeeds and is checked as a valid one) */
  readonly mayPass?: boolean;
  readonly run: () => Promise<Valid | undefined>;
  readonly cleanup?: () => void | Promise<void>;
}

/** What the call builders read of the running soak. */
export interface SoakContext {
  readonly be: Backend & Partial<CudaTools>;
  readonly tools: CudaTools | undefined;
  readonly faults: CudaFaults | undefined;
  readonly target: SoakTarget;
  readonly r: () => number;
  readonly strictPolicy: boolean;
  readonly h: Helpers;
  log(line: string): void;
}

/** The problems (and the persistent tensors the invalid calls use, kept inside). */
export interface Helpers {
  readonly problems: readonly Problem[];
  /** the valid call kinds this backend runs (the warm-up makes one of each on each problem) */
  readonly validKinds: readonly string[];
  /** a valid call of `kind` on `p` (crisp's plan when no kind is given) */
  valid(p: Problem, kind?: string): Call;
  /** a random call: valid, invalid, a policy returning garbage, or a fault part way through */
  draw(): Call;
}
