/** The run's flags (`--name value`; the list is in webgpu-main.ts), its output paths, the shape and the variants. */
import { mkdirSync } from 'node:fs';
import { dirname, join } from 'node:path';
import {
  ATTENTION_KERNELS,
  type AttentionKernel,
  SUBGROUP_MATRIX_FORMS,
  SUBGROUP_MATRIX_PARTS,
  type SubgroupMatrixForm,
  type SubgroupMatrixPart,
} from '@crisp/kernels-webgpu';
import { DEFAULT_DAWN_FLAGS } from '@crisp/kernels-webgpu/node';

export const args = new Map<string, string>();
for (let i = 2; i < process.argv.length; i++) {
  const a = process.argv[i];
  if (!a.startsWith('--')) continue;
  const next = process.argv[i + 1];
  if (next === undefined || next.startsWith('--')) args.set(a.slice(2), '');
  else {
    args.set(a.slice(2), next);
    i++;
  }
}
export const smoke = args.has('smoke');
export const list = (k: string, dflt: string) =>
  (args.get(k) ?? dflt)
    .split(',')
    .filter(Boolean)
    .map(Number);
const outArg = args.get('out') || 'webgpu-device-out';
export const outDir = outArg.endsWith('.json') ? dirname(outArg) : outArg;
export const writeWgsl = !args.has('no-wgsl');
mkdirSync(writeWgsl ? join(outDir, 'wgsl') : outDir, { recursive: true });
export const jsonPath = outArg.endsWith('.json') ? outArg : join(outDir, 'webgpu-device.json');
export const logPath = join(outDir, 'webgpu-device.log');
export const budgetMs = Number(args.get('budget') || 420) * 1000;

export const H = Number(args.get('heads') || (smoke ? 4 : 32));
export const HKV = Number(args.get('kvheads') || (smoke ? 2 : 8));
export const D = 128;
/** Dawn device toggles per variant suffix (passed through create()'s enable-dawn-features). */
const TOGGLES: Record<string, string[]> = {
  fast: ['disable_robustness', 'disable_workgroup_init', 'skip_validation'],
  norobust: ['disable_robustness'],
};
export interface VariantSpec {
  label: string;
  kernel: AttentionKernel;
  form?: string;
  /** parts of the tensor-core kernel left out (a timing-only build: FORM~PART~PART) */
  without?: SubgroupMatrixPart[];
  toggles?: string;
}
function parseVariant(label: string): VariantSpec {
  const [main, toggles] = label.split('+');
  const [kernel, formSpec] = main.split(':') as [AttentionKernel, string | undefined];
  const [form, ...without] = formSpec === undefined ? [undefined] : formSpec.split('~');
  for (const part of without) {
    if (kernel !== 'subgroup-matrix' || !SUBGROUP_MATRIX_PARTS.includes(part as SubgroupMatrixPart)) {
      throw new Error(`variant ${label}: only subgroup-matrix forms leave parts out, and the parts are ${SUBGROUP_MATRIX_PARTS.join(', ')}`);
    }
  }
  if (!ATTENTION_KERNELS.includes(kernel)) throw new Error(`unknown kernel in variant ${label}; known: ${ATTENTION_KERNELS.join(', ')}`);
  if (form !== undefined && kernel === 'fma' && form !== 'rolled') throw new Error(`variant ${label}: the fma kernel's only form is rolled`);
  if (form !== undefined && kernel === 'subgroup-matrix' && !SUBGROUP_MATRIX_FORMS.includes(form as SubgroupMatrixForm)) {
    throw new Error(`variant ${label}: the subgroup-matrix forms are ${SUBGROUP_MATRIX_FORMS.join(', ')}`);
  }
  if (toggles !== undefined && !(toggles in TOGGLES)) throw new Error(`variant ${label}: toggles are ${Object.keys(TOGGLES)}`);
  return { label, kernel, form, without: without.length ? (without as SubgroupMatrixPart[]) : undefined, toggles };
}
export function flagsFor(toggles: string | undefined): string[] {
  if (!toggles) return [...DEFAULT_DAWN_FLAGS];
  return DEFAULT_DAWN_FLAGS.map((f) => (f.startsWith('enable-dawn-features=') ? `${f},${TOGGLES[toggles].join(',')}` : f));
}
export const VARIANTS = (args.get('variants') || 'fma,subgroup-matrix:pipelined,subgroup-matrix:staged,subgroup-matrix:direct,subgroup-matrix:two-pass').split(',').filter(Boolean).map(parseVariant);
export const PROBES = (args.get('probes') ?? 'fma,lds,robust').split(',').filter(Boolean);
export const BEST_DENSE = list('best-dense', '');
export const CHECK_N = Number(args.get('check') || (smoke ? 256 : 4096));
export const DENSE = list('dense', smoke ? '256,512' : '8192,16384,32768,65536');
export const SPARSE = list('sparse', smoke ? '512,1024' : '32768,65536,131072');
export const TFJS = list('tfjs', smoke ? '256' : '8192,16384');
export const PROBE = Number(args.get('smm-probe') ?? (smoke ? 256 : 8192));
/** a variant whose max relative error on sampled rows exceeds this is not timed as "best" */
export const ERR_OK = 2e-2;
