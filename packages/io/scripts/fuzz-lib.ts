/**
 * Mutation fuzzing of the safetensors and .npy parsers. Inputs grow from valid seeds and
 * the hostile corpus by byte-level mutations (flips, sets, inserts, deletes, cuts,
 * splices) and structure-aware ones (a header value replaced by an interesting one, a
 * duplicated key, a rewritten length field). Every input must end in a valid result or a
 * CrispError; a valid result must also hold the parser's invariants (tensors inside the
 * file, the safetensors data section covered exactly). A few inputs in every hundred go
 * through real files too (open, then read every tensor whole).
 */
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { isCrispError, mulberry32 } from '@crisp/core';
import { npyCorpus, npyOf, safetensorsCorpus, safetensorsOf } from '../test/hostile/corpus.js';
import { openTensorFile, parseNpyBuffer, parseSafetensorsBuffer, readTensor } from '../src/index.js';

export interface TargetStats {
  inputs: number;
  outcomes: Record<string, number>;
  crashes: number;
}

export interface FuzzSummary {
  seed: number;
  seconds: number;
  node: string;
  totalInputs: number;
  targets: Record<'safetensors' | 'npy' | 'files', TargetStats>;
  crashes: { target: string; error: string; inputBase64: string }[];
}

type Rand = () => number;
const pick = <T>(r: Rand, xs: readonly T[]): T => xs[Math.floor(r() * xs.length)];
const int = (r: Rand, n: number) => Math.floor(r() * n);

const INTERESTING: unknown[] = [
  0, 1, -1, 2, 7, 8, 255, 256, 65535, 65536, 2 ** 31 - 1, 2 ** 31, 2 ** 32, 2 ** 53 - 1, 2 ** 53, 2 ** 64, 1.5, 1e300, -0,
  '', 'F32', 'BF16', 'F16', 'F64', 'F4', 'I32', '__proto__', 'constructor', 'toString', null, true, [], {}, [0], [0, 0], [1, 0],
  [2 ** 40, 2 ** 40], [-1, 4], { dtype: 'F32' },
];
const NPY_DESCRS = ['<f4', '<f2', '<u2', '<V2', '>f4', '<f8', '|O', '|u1', '<i4', '', '__proto__', '<M8[ns]', '|V2', '=f4'];

function seedsSafetensors(r: Rand): Uint8Array[] {
  const out: Uint8Array[] = [];
  for (const [dtype, size] of [['F32', 4], ['F16', 2], ['BF16', 2], ['F64', 8], ['U8', 1]] as const) {
    const n = 1 + int(r, 6);
    const qb = n * 4 * 8 * size;
    const kb = n * 2 * 8 * size;
    out.push(
      safetensorsOf(
        {
          __metadata__: { format: 'pt' },
          q: { dtype, shape: [n, 4, 8], data_offsets: [0, qb] },
          k: { dtype, shape: [n, 2, 8], data_offsets: [qb, qb + kb] },
          v: { dtype, shape: [n, 2, 8], data_offsets: [qb + kb, qb + 2 * kb] },
        },
        Uint8Array.from({ length: qb + 2 * kb }, () => int(r, 256)),
      ),
    );
  }
  return [...out, ...safetensorsCorpus().map((c) => c.bytes)];
}

function seedsNpy(r: Rand): Uint8Array[] {
  const out: Uint8Array[] = [];
  for (const [descr, size] of [['<f4', 4], ['<f2', 2], ['<u2', 2]] as const) {
    for (const major of [1, 2, 3]) {
      const n = 1 + int(r, 6);
      out.push(npyOf(`{'descr': '${descr}', 'fortran_order': False, 'shape': (${n}, 2, 4), }`, Uint8Array.from({ length: n * 8 * size }, () => int(r, 256)), major));
    }
  }
  return [...out, ...npyCorpus().map((c) => c.bytes)];
}

/** Byte-level mutations. */
function mutateBytes(r: Rand, input: Uint8Array, other: Uint8Array): Uint8Array {
  let b: Uint8Array = input.slice();
  const rounds = 1 + int(r, 4);
  for (let k = 0; k < rounds; k++) {
    const at = b.length === 0 ? 0 : r() < 0.6 ? int(r, Math.min(b.length, 160)) : int(r, b.length);
    switch (int(r, 8)) {
      case 0:
        if (b.length > 0) b[at] ^= 1 << int(r, 8);
        break;
      case 1:
        if (b.length > 0) b[at] = pick(r, [0, 0xff, 0x7f, 0x80, 0x20, 0x22, 0x7b, 0x7d, 0x5b, 0x5d, 0x2c, 0x3a, 0x30, 0x39, 0x2d, int(r, 256)]);
        break;
      case 2: {
        const ins = Uint8Array.from({ length: 1 + int(r, 8) }, () => int(r, 256));
        b = concat(b.subarray(0, at), ins, b.subarray(at));
        break;
      }
      case 3:
        b = concat(b.subarray(0, at), b.subarray(Math.min(b.length, at + 1 + int(r, 8))));
        break;
      case 4:
        b = b.subarray(0, int(r, b.length + 1));
        break;
      case 5:
        b = concat(b, Uint8Array.from({ length: 1 + int(r, 64) }, () => int(r, 256)));
        break;
      case 6: {
        const cut = int(r, b.length + 1);
        b = concat(b.subarray(0, cut), other.subarray(int(r, other.length + 1)));
        break;
      }
      default:
        if (b.length >= 8) new DataView(b.buffer, b.byteOffset, b.byteLength).setUint32(int(r, 2) * 4, pick(r, [0, 1, 0xffffffff, 0x7fffffff, b.length, int(r, 2 ** 32)]), true);
    }
  }
  return b;
}

function concat(...parts: Uint8Array[]): Uint8Array {
  const out = new Uint8Array(parts.reduce((a, p) => a + p.length, 0));
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}

/** Structure-aware safetensors mutation: one header value replaced, a key duplicated, or the length field rewritten. */
function mutateSafetensorsHeader(r: Rand, input: Uint8Array): Uint8Array | undefined {
  if (input.length < 10) return undefined;
  const n = Number(new DataView(input.buffer, input.byteOffset).getBigUint64(0, true));
  if (n > input.length - 8) return undefined;
  let header: Record<string, Record<string, unknown>>;
  try {
    header = JSON.parse(Buffer.from(input.subarray(8, 8 + n)).toString('utf8'));
  } catch {
    return undefined;
  }
  if (header === null || typeof header !== 'object' || Array.isArray(header)) return undefined;
  const data = input.subarray(8 + n);
  const names = Object.keys(header);
  if (names.length === 0) return undefined;
  const name = pick(r, names);
  const choice = int(r, 4);
  if (choice === 0) {
    const entry = header[name];
    if (entry !== null && typeof entry === 'object') {
      const field = pick(r, ['dtype', 'shape', 'data_offsets', 'extra']);
      const cur = entry[field];
      if (Array.isArray(cur) && cur.length > 0 && r() < 0.6) {
        const copy = [...cur];
        copy[int(r, copy.length)] = r() < 0.5 ? (copy[0] as number) + pick(r, [-1, 1, 2, -8, 8]) : pick(r, INTERESTING);
        entry[field] = copy;
      } else {
        entry[field] = pick(r, INTERESTING);
      }
    } else {
      header[name] = pick(r, INTERESTING) as Record<string, unknown>;
    }
    return safetensorsOf(header, data);
  }
  if (choice === 1) {
    const text = JSON.stringify(header);
    const dup = `${JSON.stringify(name)}:${JSON.stringify(header[name])}`;
    return safetensorsOf(`{${dup},${text.slice(1)}`, data);
  }
  if (choice === 2) {
    const text = JSON.stringify(header);
    return safetensorsOf(text + ' '.repeat(int(r, 9)), data, BigInt(text.length + pick(r, [-1, 1, 0, 4, 8, 1e9])));
  }
  return safetensorsOf(header, r() < 0.5 ? data.subarray(0, int(r, data.length + 1)) : concat(data, new Uint8Array(1 + int(r, 16))));
}

/** Structure-aware .npy mutation: descr, shape, fortran_order, the header length. */
function mutateNpyHeader(r: Rand, input: Uint8Array): Uint8Array | undefined {
  if (input.length < 12) return undefined;
  const major = input[6];
  const prefix = major === 1 ? 10 : 12;
  const text = Buffer.from(input.subarray(prefix, Math.min(input.length, prefix + 256))).toString('latin1');
  const end = text.indexOf('\n');
  if (end < 0 || ![1, 2, 3].includes(major)) return undefined;
  const data = input.subarray(prefix + end + 1);
  let dict = text.slice(0, end).trimEnd();
  switch (int(r, 5)) {
    case 0:
      dict = dict.replace(/'descr': '[^']*'/, `'descr': '${pick(r, NPY_DESCRS)}'`);
      break;
    case 1:
      dict = dict.replace(/\(([^)]*)\)/, () => `(${Array.from({ length: int(r, 5) }, () => String(pick(r, [0, 1, 2, 3, 8, -1, 2 ** 31, 2 ** 53, '99999999999999999999']))).join(', ')}${r() < 0.3 ? ',' : ''})`);
      break;
    case 2:
      dict = dict.replace(/False|True/, pick(r, ['True', 'False', '0', 'None', "'False'"]));
      break;
    case 3:
      dict = dict.replace(/'shape'/, pick(r, ["'shape'", "'descr'", "'x'", 'shape', "'shape': (1,), 'shape'"]));
      break;
    default:
      return npyOf(dict, data, pick(r, [1, 2, 3]), r() < 0.3);
  }
  return npyOf(dict, data, major);
}

/** Runs `f`: 'ok', a CrispError code, or a crash (any other exception). */
function outcome(f: () => void): { code: string; error?: unknown } {
  try {
    f();
    return { code: 'ok' };
  } catch (e) {
    return isCrispError(e) ? { code: e.code } : { code: 'CRASH', error: e };
  }
}

function checkSafetensors(b: Uint8Array): void {
  const { tensors, dataStart } = parseSafetensorsBuffer(b, 'fuzz');
  let covered = 0;
  for (const t of tensors) {
    if (t.byteOffset < dataStart || t.byteOffset + t.byteLength > b.length) throw new Error(`invariant: '${t.name}' outside the data section`);
    covered += t.byteLength;
  }
  if (covered !== b.length - dataStart) throw new Error(`invariant: tensors cover ${covered} of ${b.length - dataStart} data bytes`);
}

function checkNpy(b: Uint8Array, bf16: boolean): void {
  const t = parseNpyBuffer(b, bf16 ? { uint16As: 'bf16' } : {}, 'fuzz');
  if (t.byteOffset + t.byteLength !== b.length) throw new Error('invariant: the .npy data does not end the file');
}

/** Fuzzes for `seconds` (or until `maxInputs`), returning the summary. */
export async function fuzz(opts: { seconds: number; seed: number; maxInputs?: number; fileEvery?: number }): Promise<FuzzSummary> {
  const r = mulberry32(opts.seed);
  const stats = (): TargetStats => ({ inputs: 0, outcomes: {}, crashes: 0 });
  const summary: FuzzSummary = {
    seed: opts.seed,
    seconds: opts.seconds,
    node: process.version,
    totalInputs: 0,
    targets: { safetensors: stats(), npy: stats(), files: stats() },
    crashes: [],
  };
  const pools = { safetensors: seedsSafetensors(r), npy: seedsNpy(r) };
  const dir = await mkdtemp(join(tmpdir(), 'crisp-io-fuzz-'));
  const record = (target: keyof FuzzSummary['targets'], res: { code: string; error?: unknown }, input: Uint8Array) => {
    const s = summary.targets[target];
    s.inputs++;
    s.outcomes[res.code] = (s.outcomes[res.code] ?? 0) + 1;
    summary.totalInputs++;
    if (res.code === 'CRASH') {
      s.crashes++;
      if (summary.crashes.length < 20) {
        const err = res.error instanceof Error ? `${res.error.name}: ${res.error.message}\n${res.error.stack}` : String(res.error);
        summary.crashes.push({ target, error: err, inputBase64: Buffer.from(input).toString('base64') });
      }
    }
  };
  const deadline = performance.now() + opts.seconds * 1000;
  const fileEvery = opts.fileEvery ?? 97;
  let i = 0;
  try {
    while (performance.now() < deadline && (opts.maxInputs === undefined || i < opts.maxInputs)) {
      i++;
      const kind = r() < 0.5 ? 'safetensors' : 'npy';
      const pool = pools[kind];
      const base = pick(r, pool);
      const structured = r() < 0.4 ? (kind === 'safetensors' ? mutateSafetensorsHeader(r, base) : mutateNpyHeader(r, base)) : undefined;
      const input = structured ?? mutateBytes(r, base, pick(r, pool));
      const bf16 = r() < 0.5;
      const res = outcome(() => (kind === 'safetensors' ? checkSafetensors(input) : checkNpy(input, bf16)));
      record(kind, res, input);
      // Inputs that were accepted, or refused late, join the pool: they reach deeper checks.
      if ((res.code === 'ok' || r() < 0.02) && pool.length < 4000) pool.push(input);
      if (i % fileEvery === 0) {
        const path = join(dir, `in${i}`);
        await writeFile(path, input);
        let code = 'ok';
        let error: unknown;
        try {
          const run = (async () => {
            await using f = await openTensorFile(path, bf16 ? { uint16As: 'bf16' } : {});
            for (const t of f.tensors) {
              try {
                await readTensor(f, t.name, { layout: pick(r, ['nhd', 'hnd', '1nhd']), dtype: 'f32' });
              } catch (e) {
                if (!isCrispError(e)) throw e;
              }
            }
          })();
          let timer: NodeJS.Timeout | undefined;
          const hang = new Promise<never>((_, reject) => {
            timer = setTimeout(() => reject(new Error('HUNG: no result within 10 s')), 10_000);
          });
          try {
            await Promise.race([run, hang]);
          } finally {
            clearTimeout(timer);
          }
        } catch (e) {
          if (isCrispError(e)) code = e.code;
          else {
            code = 'CRASH';
            error = e;
          }
        }
        record('files', { code, error }, input);
        await rm(path, { force: true });
      }
    }
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
  return summary;
}
