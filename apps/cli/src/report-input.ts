/**
 * `crisp report --from FILE...`: read `crisp run --json` results back. Anything newer fields
 * add (provenance, truth.stripes, plan times) may be missing from an older file; the report
 * then says which section it cannot show. A file that is not a run result is a FORMAT_ERROR
 * naming the file and the first missing field.
 */
import { readFile, stat } from 'node:fs/promises';
import { CrispError } from '@crisp/core';
import type { RunSummary } from './run-job.js';

/** larger than any run JSON (they hold no block masks): a guard against reading a wrong file whole */
const MAX_BYTES = 256 * 2 ** 20;

const isObj = (x: unknown): x is Record<string, unknown> => typeof x === 'object' && x !== null && !Array.isArray(x);
const isNum = (x: unknown): x is number => typeof x === 'number' && Number.isFinite(x);

/** The first field a run result needs that `x` lacks, or null. */
export function missingRunField(x: unknown): string | null {
  if (!isObj(x)) return 'a JSON object at the top';
  if (typeof x.backend !== 'string') return 'backend';
  const inp = x.input;
  if (!isObj(inp)) return 'input';
  for (const k of ['n', 'heads', 'kvHeads', 'headDim']) if (!isNum(inp[k])) return `input.${k}`;
  if (typeof inp.source !== 'string') return 'input.source';
  if (!isNum(x.blockSize)) return 'blockSize';
  if (!isNum(x.numBlocks)) return 'numBlocks';
  if (!isObj(x.dense) || !isObj(x.dense.timeMs) || !isNum(x.dense.timeMs.median)) return 'dense.timeMs.median';
  if (!Array.isArray(x.policies) || x.policies.length === 0) return 'policies';
  for (const [i, p] of x.policies.entries()) {
    if (!isObj(p) || typeof p.policy !== 'string') return `policies[${i}].policy`;
    if (!Array.isArray(p.heads) || p.heads.length !== inp.heads) return `policies[${i}].heads (one per input head)`;
    if (!isObj(p.timeMs) || !isNum(p.timeMs.median)) return `policies[${i}].timeMs.median`;
    for (const k of ['density', 'massRecall', 'speedup']) if (!isNum(p[k])) return `policies[${i}].${k}`;
  }
  return null;
}

/** toJson writes non-finite numbers as strings; read them back as numbers. */
function revive(_key: string, v: unknown): unknown {
  return v === 'Infinity' ? Number.POSITIVE_INFINITY : v === '-Infinity' ? Number.NEGATIVE_INFINITY : v === 'NaN' ? Number.NaN : v;
}

export async function readRunJson(path: string): Promise<RunSummary> {
  let text: string;
  try {
    const st = await stat(path);
    if (!st.isFile()) throw new CrispError('IO_ERROR', `--from ${path} is not a regular file`);
    if (st.size > MAX_BYTES) throw new CrispError('LIMIT_EXCEEDED', `--from ${path} holds ${st.size} bytes; a crisp run --json result is far smaller`);
    text = await readFile(path, 'utf8');
  } catch (e) {
    if (e instanceof CrispError) throw e;
    throw new CrispError('IO_ERROR', `cannot read --from ${path}: ${(e as NodeJS.ErrnoException).code === 'ENOENT' ? 'no such file' : (e as Error).message}`);
  }
  let x: unknown;
  try {
    x = JSON.parse(text, revive);
  } catch (e) {
    throw new CrispError('FORMAT_ERROR', `--from ${path} is not JSON (${(e as Error).message})`);
  }
  const missing = missingRunField(x);
  if (missing) throw new CrispError('FORMAT_ERROR', `--from ${path} is not a crisp run --json result: it lacks ${missing}`);
  return x as RunSummary;
}
