/** The harness's command-line flags (`--name value`), read once from process.argv. */
import { ATTENTION_VARIANTS, type AttentionVariant, type ProxyLayout } from '@crisp/kernels-cuda';

const argv = process.argv.slice(2);
export const arg = (name: string, dflt: string) => {
  const i = argv.indexOf(`--${name}`);
  return i >= 0 ? argv[i + 1] : dflt;
};
export const phase = arg('phase', 'all');
export const outDir = arg('out', '/tmp/crisp-out');
export const budget = Number(arg('budget', '400')) * 1000;
/** 'none' (or an empty list) skips a step list */
export const list = (name: string, dflt: string) => (arg(name, dflt) === 'none' ? [] : arg(name, dflt).split(',').filter(Boolean).map(Number));
export const ns = list('ns', '65536,131072,262144,524288');
export const crossNs = list('cross', '8192,16384,32768');
export const peerDir = arg('peer', '/tmp/crisp-cuda');
export const reps = Number(arg('reps', '3'));
/** e2e inputs: the device llama fill, or the @crisp/synth llama-like scenario from the host */
export const inputsKind = arg('inputs', 'fill');
export const e2eNs = arg('e2e', '').split(',').filter(Boolean).map(Number);
/** conformance dtypes (run bf16 and f16 as two processes to halve the wall time) */
export const confDtypes = arg('dtypes', 'bf16,f16').split(',') as ('bf16' | 'f16')[];
/** attention kernel layout for conformance and the e2e/bench phases ('' = the backend's default for the GPU) */
export const variantArg = arg('variant', '') as AttentionVariant | '';
/** sizes for the kernel-layout sweep (phase kernels) */
export const sweepNs = arg('sweep', '16384,65536,131072,524288').split(',').map(Number);
export const layouts = arg('layouts', Object.keys(ATTENTION_VARIANTS).join(',')).split(',') as AttentionVariant[];
/** phase kernels: the self-check size run before any timing ('none' skips it) */
export const checkN = arg('check', '4096') === 'none' ? 0 : Number(arg('check', '4096'));
/** proxy statistics kernel layout for every phase (the proxy phase times both) */
export const proxyLayoutArg = (arg('proxyLayout', '') || undefined) as ProxyLayout | undefined;
/** --pdl off: every kernel launched plainly (CudaBackendOptions.programmaticLaunch), for A/B runs */
export const pdlArg = arg('pdl', 'on');
/** the layouts the proxy phase times at 128k / 512k (--proxyLayouts) */
export const PROXY_TIMED_LAYOUTS = arg('proxyLayouts', 'w32,wg').split(',') as ProxyLayout[];
