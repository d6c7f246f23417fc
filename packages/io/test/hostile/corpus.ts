// A generated corpus of broken (and a few valid-but-odd) safetensors and .npy files. Each
// case names its family, the bytes, and the outcome: 'ok' or the exact CrispError code.
import type { CrispErrorCode } from '@crisp/core';
import { encodeNpyHeader } from '../../src/npy.js';

export interface Case {
  readonly family: string;
  readonly name: string;
  readonly bytes: Uint8Array;
  /** 'ok': opens (header accepted); otherwise the code opening must fail with. */
  readonly expect: 'ok' | CrispErrorCode;
  /** What the message must mention. */
  readonly message?: RegExp;
}

// --- safetensors -------------------------------------------------------------------------

/** A safetensors file from a header (object or raw JSON text) over `data`. */
export function safetensorsOf(header: unknown, data: Uint8Array = new Uint8Array(0), lengthField?: bigint): Uint8Array {
  const json = Buffer.from(typeof header === 'string' ? header : JSON.stringify(header), 'utf8');
  const out = new Uint8Array(8 + json.length + data.length);
  Buffer.from(out.buffer).writeBigUInt64LE(lengthField ?? BigInt(json.length), 0);
  out.set(json, 8);
  out.set(data, 8 + json.length);
  return out;
}

const bytes = (n: number) => Uint8Array.from({ length: n }, (_, i) => (i * 37 + 11) & 0xff);
type Entry = { dtype?: unknown; shape?: unknown; data_offsets?: unknown; [k: string]: unknown };
/** The valid base: a F32 [2, 3] (24 bytes) then b BF16 [4] (8 bytes). */
const base = (): Record<string, Entry> => ({
  a: { dtype: 'F32', shape: [2, 3], data_offsets: [0, 24] },
  b: { dtype: 'BF16', shape: [4], data_offsets: [24, 32] },
});
const DATA = bytes(32);

/** Every dtype of the specification with its bits per element. */
export const ST_DTYPES: readonly [string, number][] = [
  ['BOOL', 8], ['F4', 4], ['F6_E2M3', 6], ['F6_E3M2', 6], ['U8', 8], ['I8', 8], ['F8_E5M2', 8], ['F8_E4M3', 8],
  ['F8_E8M0', 8], ['F8_E4M3FNUZ', 8], ['F8_E5M2FNUZ', 8], ['I16', 16], ['U16', 16], ['F16', 16], ['BF16', 16],
  ['I32', 32], ['U32', 32], ['F32', 32], ['C64', 64], ['F64', 64], ['I64', 64], ['U64', 64],
];

export function safetensorsCorpus(): Case[] {
  const out: Case[] = [];
  const add = (family: string, name: string, b: Uint8Array, expect: Case['expect'], message?: RegExp) =>
    out.push({ family, name, bytes: b, expect, message });
  const edit = (f: (h: Record<string, Entry>) => void, data = DATA) => {
    const h = base();
    f(h);
    return safetensorsOf(h, data);
  };
  const F = 'FORMAT_ERROR' as const;

  // The length field.
  const valid = safetensorsOf(base(), DATA);
  add('length field', 'the valid base file', valid, 'ok');
  for (const n of [0, 1, 4, 7, 8]) add('length field', `a ${n}-byte file`, valid.subarray(0, n), F, /too short|not a safetensors/);
  const len = (v: bigint) => {
    const b = valid.slice();
    Buffer.from(b.buffer).writeBigUInt64LE(v, 0);
    return b;
  };
  const jsonLen = Number(Buffer.from(valid).readBigUInt64LE(0));
  add('length field', 'length 0', len(0n), F, /too short for a JSON object/);
  add('length field', 'length 1', len(1n), F, /too short for a JSON object/);
  add('length field', 'length inside the JSON', len(BigInt(jsonLen - 5)), F, /not valid JSON/);
  add('length field', 'length reaching into the data', len(BigInt(jsonLen + 4)), F, /UTF-8|not valid JSON/);
  add('length field', 'length past the end of the file', len(BigInt(valid.length)), F, /header claims \d+ bytes.*truncated/);
  add('length field', 'length 100,000,001', len(100_000_001n), F, /header too large \(limit 100 MB/);
  add('length field', 'length 2^63', len(2n ** 63n), F, /header too large/);
  add('length field', 'length 2^64 - 1', len(2n ** 64n - 1n), F, /header too large/);
  add('length field', 'cut inside the length field', valid.subarray(0, 5), F, /too short/);
  add('length field', 'cut inside the header', valid.subarray(0, 8 + Math.floor(jsonLen / 2)), F, /truncated/);
  add('length field', 'cut inside the data', valid.subarray(0, valid.length - 3), F, /tensor 'b'.*truncated/);
  add('length field', 'cut at the data start', valid.subarray(0, 8 + jsonLen), F, /truncated/);

  // The JSON text.
  const text = JSON.stringify(base());
  const raw = (name: string, t: string, expect: Case['expect'], message?: RegExp, data = DATA, family = 'header JSON') =>
    add(family, name, safetensorsOf(t, data), expect, message);
  raw('padded with spaces (the writer pads to 8 bytes)', `${text}      `, 'ok');
  raw('padded with tabs and newlines', `${text}\t\n\r `, 'ok');
  raw('padded with NUL bytes', `${text}\0\0\0`, F, /not valid JSON.*after the value/);
  raw('leading space', ` ${text}`, F, /does not start with '\{'/);
  raw('a BOM first', `\uFEFF${text}`, F, /does not start with '\{'/);
  raw('a JSON array', '[1, 2]', F, /does not start with '\{'/);
  raw('a JSON string', '"abc"', F, /does not start with '\{'/);
  raw('trailing characters after the object', `${text}x`, F, /after the value/);
  raw('two objects', `${text}{}`, F, /after the value/);
  raw('unterminated', text.slice(0, -1), F, /not valid JSON/);
  raw('a trailing comma', text.replace(/}}$/, '},}'), F, /not valid JSON/);
  raw('single quotes', text.replace(/"/g, "'"), F, /not valid JSON/);
  raw('a comment', `{/* x */${text.slice(1)}`, F, /not valid JSON/);
  raw('NaN as an offset', text.replace('[0,24]', '[NaN,24]'), F, /not valid JSON/);
  raw('a control character in a name', text.replace('"a"', '"a\u0001"'), F, /control character/);
  raw('an invalid escape', text.replace('"a"', '"a\\q"'), F, /invalid escape/);
  raw('escaped names (valid)', text.replace('"a"', '"\\u0061\\n"'), 'ok');
  raw('a lone surrogate escape in a name (valid JSON)', text.replace('"a"', '"\\ud800"'), 'ok');
  raw('nesting 200 deep in the metadata', `{"__metadata__":${'['.repeat(200)}${']'.repeat(200)},${text.slice(1)}`, F, /nesting deeper/);
  raw('an empty object (no tensors, no data)', '{}', 'ok', undefined, new Uint8Array(0));
  raw('an empty object over data bytes', '{}', F, /32 bytes after the last tensor/);
  raw('duplicate tensor key', text.replace('"b"', '"a"'), F, /duplicate key 'a'/);
  raw('duplicate field in an entry', text.replace('"dtype":"F32"', '"dtype":"F32","dtype":"F64"'), F, /duplicate key 'dtype'/);
  raw('duplicate __metadata__', `{"__metadata__":{},"__metadata__":{},${text.slice(1)}`, F, /duplicate key '__metadata__'/);
  raw('duplicate metadata key', `{"__metadata__":{"x":"1","x":"2"},${text.slice(1)}`, F, /duplicate key 'x'/);
  const badUtf8 = safetensorsOf(text, DATA);
  badUtf8[10] = 0xff;
  add('header JSON', 'invalid UTF-8', badUtf8, F, /UTF-8/);
  const overlong = safetensorsOf(text.replace('"a"', '"aa"'), DATA);
  overlong.set([0xc0, 0xa1], 10);
  add('header JSON', 'an overlong UTF-8 sequence', overlong, F, /UTF-8/);

  // Tensor entries.
  for (const [name, v] of [['null', null], ['a number', 1], ['a string', 'x'], ['an array', [1, 2]], ['an empty object', {}]] as const) {
    add('tensor entry', `entry is ${name}`, edit((h) => ((h as Record<string, unknown>).a = v)), F, /'a' has (no \{dtype|no dtype)/);
  }
  add('tensor entry', 'extra fields in an entry (ignored, as the reference does)', edit((h) => (h.a.extra = 1)), 'ok');
  add('tensor entry', "a tensor named '__proto__'", safetensorsOf(text.replace('"a"', '"__proto__"'), DATA), 'ok');
  add('tensor entry', "a tensor named ''", safetensorsOf(text.replace('"a"', '""'), DATA), 'ok');

  // dtype.
  for (const [dt, bits] of ST_DTYPES) {
    const count = 8;
    const h = { x: { dtype: dt, shape: [count], data_offsets: [0, (count * bits) / 8] } };
    add('dtype', `${dt} [${count}]`, safetensorsOf(h, bytes((count * bits) / 8)), 'ok');
  }
  add('dtype', 'F4 [3]: 12 bits, not whole bytes', safetensorsOf({ x: { dtype: 'F4', shape: [3], data_offsets: [0, 2] } }, bytes(2)), F, /not a whole number of bytes/);
  add('dtype', 'F6_E2M3 [1]: 6 bits', safetensorsOf({ x: { dtype: 'F6_E2M3', shape: [1], data_offsets: [0, 1] } }, bytes(1)), F, /not a whole number/);
  for (const dt of ['', 'f32', 'FLOAT', 'F128', 'U1', 'F32 ', '__proto__', 'constructor', 'toString', 'valueOf', 'hasOwnProperty']) {
    add('dtype', `unknown dtype ${JSON.stringify(dt)}`, edit((h) => (h.a.dtype = dt)), F, /unknown dtype/);
  }
  for (const [name, v] of [['a number', 4], ['null', null], ['an array', ['F32']], ['an object', { F32: 1 }], ['missing', undefined]] as const) {
    add('dtype', `dtype ${name}`, edit((h) => (v === undefined ? delete h.a.dtype : (h.a.dtype = v))), F, /dtype/);
  }

  // shape.
  const shapeCase = (name: string, shapeText: string, expect: Case['expect'], message?: RegExp) =>
    raw(`shape ${name}`, text.replace('"shape":[2,3]', `"shape":${shapeText}`), expect, message, DATA, 'shape');
  shapeCase('[2,3] unchanged (the control case)', '[2,3]', 'ok');
  for (const [name, s] of [
    ['negative', '[-2,-3]'],
    ['fractional', '[1.5,4]'],
    ['integer-valued float 2.0', '[2.0,3]'],
    ['with an exponent', '[2e0,3]'],
    ['of strings', '["2","3"]'],
    ['of booleans', '[true,3]'],
    ['with null', '[null,3]'],
    ['nested', '[[2],3]'],
    ['a number', '6'],
    ['a string', '"2,3"'],
    ['null', 'null'],
    ['an object', '{"0":2}'],
    ['with 2^53', '[9007199254740992,3]'],
    ['with 2^64', '[18446744073709551616,3]'],
  ] as const) {
    shapeCase(name, s, F, /invalid shape/);
  }
  add('shape', 'shape absent', edit((h) => delete h.a.shape), F, /invalid shape nothing/);
  add('shape', 'shape [] (a scalar) with 24 bytes', edit((h) => (h.a.shape = [])), F, /= 4 bytes but its data_offsets/);
  add('shape', 'shape [6] instead of [2, 3] (same bytes: valid)', edit((h) => (h.a.shape = [6])), 'ok');
  add('shape', 'shape [2, 4]: 32 bytes over a 24-byte range', edit((h) => (h.a.shape = [2, 4])), F, /= 32 bytes but its data_offsets \[0, 24\) span 24/);
  add('shape', 'huge dims whose product overflows 2^64', edit((h) => (h.a.shape = [2 ** 40, 2 ** 40, 2 ** 40])), F, /bytes but its data_offsets/);
  add('shape', 'a zero dim over a non-empty range', edit((h) => (h.a.shape = [0, 3])), F, /= 0 bytes/);

  // data_offsets: every relation.
  const offs = (name: string, a: unknown, b: unknown, expect: Case['expect'], message?: RegExp, data = DATA) =>
    add('data_offsets', name, edit((h) => {
      if (a !== undefined) h.a.data_offsets = a;
      if (b !== undefined) h.b.data_offsets = b;
    }, data), expect, message);
  offs('begin > end', [24, 0], undefined, F, /invalid data_offsets \[24, 0\]/);
  offs('negative begin', [-24, 0], undefined, F, /invalid data_offsets/);
  offs('non-integer', [0, 24.5], undefined, F, /invalid data_offsets/);
  offs('one number', [24], undefined, F, /invalid data_offsets/);
  offs('three numbers', [0, 24, 32], undefined, F, /invalid data_offsets/);
  offs('a number', 24, undefined, F, /invalid data_offsets/);
  offs('strings', ['0', '24'], undefined, F, /invalid data_offsets/);
  offs('null', null, undefined, F, /invalid data_offsets/);
  offs('huge (2^60, past 2^53)', [2 ** 60, 2 ** 60 + 24], undefined, F, /invalid data_offsets/);
  offs('far past the end (2^40)', [0, 24], [2 ** 40, 2 ** 40 + 8], F, /'b' needs data bytes .*truncated or its offsets are out of range/);
  const rawOffs = (name: string, t: string) => raw(name, t, F, /invalid data_offsets/, DATA, 'data_offsets');
  rawOffs('data_offsets 2^64 (beyond any integer)', text.replace('[0,24]', '[18446744073709551616,18446744073709551640]'));
  rawOffs('data_offsets written 0.0', text.replace('[0,24]', '[0.0,24]'));
  rawOffs('data_offsets written 2.4e1', text.replace('[0,24]', '[0,2.4e1]'));
  add('data_offsets', 'data_offsets absent', edit((h) => delete h.a.data_offsets), F, /invalid data_offsets nothing/);
  offs('overlap', [0, 24], [20, 28], F, /'a' \[0, 24\) and 'b' \[20, 28\) overlap/);
  offs('identical ranges', [0, 24], [0, 24], F, /= 8 bytes but|overlap/);
  offs('gap between tensors', [0, 24], [28, 36], F, /data bytes \[24, 28\) belong to no tensor \(between 'a' and 'b'\)/, bytes(36));
  offs('data before the first tensor', [8, 32], [32, 40], F, /data bytes \[0, 8\) belong to no tensor \(before the first tensor\)/, bytes(40));
  offs('trailing bytes after the last tensor', undefined, undefined, F, /8 bytes after the last tensor/, bytes(40));
  offs('beyond the end', [0, 24], [32, 40], F, /'b' needs data bytes \[32, 40\).*truncated/);
  offs('swapped order (valid: order is by offset)', [8, 32], [0, 8], 'ok');
  offs('range not matching the shape', [0, 20], [20, 28], F, /= 24 bytes but its data_offsets \[0, 20\) span 20/);
  add('data_offsets', 'an empty tensor at its place (valid)', edit((h) => {
    h.e = { dtype: 'F32', shape: [0, 4], data_offsets: [24, 24] };
  }), 'ok');
  add('data_offsets', 'an empty tensor at the end (valid)', edit((h) => {
    h.e = { dtype: 'F32', shape: [0], data_offsets: [32, 32] };
  }), 'ok');
  add('data_offsets', 'an empty tensor inside another', edit((h) => {
    h.e = { dtype: 'F32', shape: [0], data_offsets: [4, 4] };
  }), F, /overlap/);
  add('data_offsets', 'an empty tensor past the end', edit((h) => {
    h.e = { dtype: 'F32', shape: [0], data_offsets: [40, 40] };
  }), F, /truncated or its offsets are out of range/);

  // __metadata__.
  const meta = (name: string, m: string, expect: Case['expect'], message?: RegExp) =>
    raw(`__metadata__ ${name}`, `{"__metadata__":${m},${text.slice(1)}`, expect, message, DATA, '__metadata__');
  meta('of strings (valid)', '{"format":"pt","x":""}', 'ok');
  meta('null (valid, as the reference reads it)', 'null', 'ok');
  meta('with a __proto__ key (a plain string key)', '{"__proto__":"x"}', 'ok');
  meta('a string', '"pt"', F, /__metadata__ must be an object/);
  meta('an array', '["pt"]', F, /__metadata__ must be an object/);
  meta('a number value', '{"a":1}', F, /__metadata__\['a'\] is 1, not a string/);
  meta('a null value', '{"a":null}', F, /not a string/);
  meta('an object value', '{"a":{"b":"c"}}', F, /not a string/);
  return out;
}

// --- .npy ---------------------------------------------------------------------------------

/** An .npy file from raw header text (padded to 64 bytes + newline unless `exact`), version and data. */
export function npyOf(dict: string, data: Uint8Array, major = 1, exact = false): Uint8Array {
  const prefix = major === 1 ? 10 : 12;
  let h = dict;
  if (!exact) {
    h += ' '.repeat((64 - ((prefix + h.length + 1) % 64)) % 64);
    h += '\n';
  }
  const enc = major === 3 ? Buffer.from(h, 'utf8') : Buffer.from(h, 'latin1');
  const out = new Uint8Array(prefix + enc.length + data.length);
  out.set([0x93, 0x4e, 0x55, 0x4d, 0x50, 0x59, major, 0], 0);
  const dv = new DataView(out.buffer);
  if (major === 1) dv.setUint16(8, enc.length, true);
  else dv.setUint32(8, enc.length, true);
  out.set(enc, prefix);
  out.set(data, prefix + enc.length);
  return out;
}

const dict = (descr: string, shape: string, fortran = 'False') => `{'descr': '${descr}', 'fortran_order': ${fortran}, 'shape': ${shape}, }`;

/** NumPy descrs: [descr, bytes per element, outcome without options, outcome with uint16As: 'bf16']. */
export const NPY_DESCRS: readonly [string, number, Case['expect'], Case['expect']][] = [
  ['<f4', 4, 'ok', 'ok'],
  ['=f4', 4, 'ok', 'ok'],
  ['<f2', 2, 'ok', 'UNSUPPORTED'],
  ['<u2', 2, 'UNSUPPORTED', 'ok'],
  ['<V2', 2, 'UNSUPPORTED', 'ok'],
  ['|V2', 2, 'UNSUPPORTED', 'ok'],
  ['>f4', 4, 'UNSUPPORTED', 'UNSUPPORTED'],
  ['>f2', 2, 'UNSUPPORTED', 'UNSUPPORTED'],
  ['>u2', 2, 'UNSUPPORTED', 'UNSUPPORTED'],
  ['<f8', 8, 'UNSUPPORTED', 'UNSUPPORTED'],
  ['<f16', 16, 'UNSUPPORTED', 'UNSUPPORTED'],
  ['|i1', 1, 'UNSUPPORTED', 'UNSUPPORTED'],
  ['|u1', 1, 'UNSUPPORTED', 'UNSUPPORTED'],
  ['<i2', 2, 'UNSUPPORTED', 'UNSUPPORTED'],
  ['<i4', 4, 'UNSUPPORTED', 'UNSUPPORTED'],
  ['<i8', 8, 'UNSUPPORTED', 'UNSUPPORTED'],
  ['<u4', 4, 'UNSUPPORTED', 'UNSUPPORTED'],
  ['<u8', 8, 'UNSUPPORTED', 'UNSUPPORTED'],
  ['|b1', 1, 'UNSUPPORTED', 'UNSUPPORTED'],
  ['<c8', 8, 'UNSUPPORTED', 'UNSUPPORTED'],
  ['<c16', 16, 'UNSUPPORTED', 'UNSUPPORTED'],
  ['|O', 8, 'UNSUPPORTED', 'UNSUPPORTED'],
  ['<U4', 16, 'UNSUPPORTED', 'UNSUPPORTED'],
  ['|S4', 4, 'UNSUPPORTED', 'UNSUPPORTED'],
  ['<M8[ns]', 8, 'UNSUPPORTED', 'UNSUPPORTED'],
  ['|f4', 4, 'UNSUPPORTED', 'UNSUPPORTED'],
  ['__proto__', 4, 'UNSUPPORTED', 'UNSUPPORTED'],
  ['', 4, 'UNSUPPORTED', 'UNSUPPORTED'],
];

export function npyCorpus(): Case[] {
  const out: Case[] = [];
  const add = (family: string, name: string, b: Uint8Array, expect: Case['expect'], message?: RegExp) =>
    out.push({ family, name, bytes: b, expect, message });
  const F = 'FORMAT_ERROR' as const;
  const U = 'UNSUPPORTED' as const;
  const data = bytes(48); // (3, 4) float32
  const good = npyOf(dict('<f4', '(3, 4)'), data);
  const hdr = (name: string, d: string, expect: Case['expect'], message?: RegExp, body = data) => add('npy header', name, npyOf(d, body), expect, message);

  // Prefix: magic, version, length.
  add('npy prefix', 'the valid base file', good, 'ok');
  add('npy prefix', 'encodeNpyHeader output', new Uint8Array([...encodeNpyHeader('<f4', [3, 4]), ...data]), 'ok');
  for (const n of [0, 5, 7, 9]) add('npy prefix', `a ${n}-byte file`, good.subarray(0, n), F, /too short/);
  const patch = (at: number, v: number[]) => {
    const b = good.slice();
    b.set(v, at);
    return b;
  };
  add('npy prefix', 'wrong magic', patch(1, [0x4f]), F, /no \\x93NUMPY magic/);
  add('npy prefix', 'version 0.0', patch(6, [0]), U, /version 0\.0/);
  add('npy prefix', 'version 4.0', patch(6, [4]), U, /version 4\.0/);
  add('npy prefix', 'version 1.1', patch(7, [1]), U, /version 1\.1/);
  add('npy prefix', 'header length past the end', patch(8, [0xff, 0xff]), F, /header claims 65535 bytes.*truncated/);
  add('npy prefix', 'header length 0', patch(8, [0, 0]), F, /not a valid Python literal/);
  add('npy prefix', 'header length short of the dict', patch(8, [20, 0]), F, /not a valid Python literal/);
  const v2 = npyOf(dict('<f4', '(3, 4)'), data, 2);
  add('npy prefix', 'version 2.0 (valid)', v2, 'ok');
  add('npy prefix', 'version 3.0, UTF-8 header (valid)', npyOf(dict('<f4', '(3, 4)'), data, 3), 'ok');
  const huge = v2.slice();
  new DataView(huge.buffer).setUint32(8, 0x7fffffff, true);
  add('npy prefix', 'version 2.0 header length 2^31 - 1', huge, F, /header too large/);
  const mid = v2.slice();
  new DataView(mid.buffer).setUint32(8, (1 << 20) + 1, true);
  add('npy prefix', 'version 2.0 header length 1 MiB + 1', mid, F, /header too large/);
  const bad3 = npyOf(`${dict('<f4', '(3, 4)').slice(0, -2)}'x': 'é'}`, data, 3);
  bad3[bad3.indexOf(0xc3)] = 0xff;
  add('npy prefix', 'version 3.0 header with invalid UTF-8', bad3, F, /UTF-8/);

  // The dict literal.
  hdr('not a dict (a tuple)', "('<f4', False, (3, 4))", F, /not a dict/);
  hdr('not a dict (a string)', "'<f4'", F, /not a dict/);
  hdr('unterminated dict', "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4)", F, /not a valid Python literal/);
  hdr('unterminated string', "{'descr': '<f4, 'fortran_order': False, 'shape': (3, 4), }", F, /not a valid Python literal/);
  hdr('missing descr', "{'fortran_order': False, 'shape': (3, 4), }", F, /lacks 'descr'/);
  hdr('missing shape', "{'descr': '<f4', 'fortran_order': False, }", F, /lacks 'shape'/);
  hdr('missing fortran_order', "{'descr': '<f4', 'shape': (3, 4), }", F, /lacks 'fortran_order'/);
  hdr('an extra key', "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), 'x': 1, }", F, /unexpected keys 'x'/);
  hdr('a duplicate key', "{'descr': '<f4', 'descr': '<f2', 'fortran_order': False, 'shape': (3, 4), }", F, /duplicate key 'descr'/);
  hdr('a non-string key', "{1: '<f4', 'fortran_order': False, 'shape': (3, 4), }", F, /non-string dict key/);
  hdr('keys in another order (valid)', "{'shape': (3, 4), 'fortran_order': False, 'descr': '<f4'}", 'ok');
  hdr('double quotes (valid)', '{"descr": "<f4", "fortran_order": False, "shape": (3, 4)}', 'ok');
  hdr('an escape in a string', "{'descr': '<f\\x34', 'fortran_order': False, 'shape': (3, 4), }", F, /escape/);
  hdr('trailing characters', `${dict('<f4', '(3, 4)')} x`, F, /trailing characters/);
  hdr('nesting 40 deep', `{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), 'x': ${'('.repeat(40)}${')'.repeat(40)}}`, F, /nesting too deep/);
  hdr('a Python long 3L (valid, as NumPy 1.x headers)', dict('<f4', '(3L, 4L)'), 'ok');
  hdr('descr a number', "{'descr': 4, 'fortran_order': False, 'shape': (3, 4), }", F, /lacks 'descr' \(a string\)|lacks/);
  hdr('descr a structured list', "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (3, 4), }", U, /structured array/);
  hdr("fortran_order 'False' (a string)", dict('<f4', '(3, 4)', "'False'"), F, /fortran_order/);
  hdr('fortran_order 0', dict('<f4', '(3, 4)', '0'), F, /fortran_order/);
  hdr('fortran_order True on a 2-d array', dict('<f4', '(3, 4)', 'True'), U, /Fortran/);
  hdr('fortran_order True on a 1-d array (valid: same bytes)', dict('<f4', '(12,)', 'True'), 'ok');
  hdr('fortran_order True, shape (1, 12) (valid)', dict('<f4', '(1, 12)', 'True'), 'ok');

  // shape.
  const shape = (name: string, s: string, expect: Case['expect'], message?: RegExp, body = data) => hdr(`shape ${name}`, dict('<f4', s), expect, message, body);
  shape('a list', '[3, 4]', F, /not a tuple/);
  shape('negative', '(-3, -4)', F, /not a tuple of non-negative integers/);
  shape('a float', '(3.0, 4)', F, /not a valid Python literal/);
  shape('of strings', "('3', 4)", F, /not a tuple of non-negative/);
  shape('of booleans', '(True, 4)', F, /not a tuple of non-negative/);
  shape('with None', '(None, 4)', F, /not a tuple of non-negative/);
  shape('nested', '((3,), 4)', F, /not a tuple of non-negative/);
  shape('with a 20-digit dim', '(99999999999999999999, 4)', F, /not a tuple of non-negative/);
  shape('whose product overflows', '(4294967296, 4294967296, 4294967296)', F, /more elements than any file/);
  shape('of 65 dims', `(${Array(65).fill(1).join(', ')})`, F, /65 dimensions/);
  shape('() (a scalar: 4 bytes, 44 trailing)', '()', F, /44 trailing bytes/);
  shape('() over 4 bytes (valid)', '()', 'ok', undefined, bytes(4));
  shape('(0,) over no bytes (valid)', '(0,)', 'ok', undefined, new Uint8Array(0));
  shape('(2, 4): 32 bytes, 16 trailing', '(2, 4)', F, /16 trailing bytes belong to no array/);
  shape('(4, 4): 64 bytes, 48 present', '(4, 4)', F, /only 48 follow the header: the file is truncated/);
  shape('(12,) (valid)', '(12,)', 'ok');
  return out;
}

/** The descr family: every NumPy type over a matching data section, read without and with uint16As. */
export function npyDescrCorpus(): { name: string; bytes: Uint8Array; plain: Case['expect']; bf16: Case['expect'] }[] {
  return NPY_DESCRS.map(([descr, size, plain, bf16]) => ({
    name: `descr ${JSON.stringify(descr)}`,
    bytes: npyOf(`{'descr': '${descr}', 'fortran_order': False, 'shape': (2, 3), }`, bytes(6 * size)),
    plain,
    bf16,
  }));
}
