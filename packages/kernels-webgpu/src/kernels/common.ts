/**
 * WGSL building blocks shared by the kernels, and the program descriptor.
 *
 * Storage: f32 tensors bind as array<vec4<f32>>; f16 tensors bind as array<vec2<u32>>
 * (four halves in two words) and are widened with unpack2x16float, a core WGSL builtin, so
 * f16 storage works on every adapter, with or without `shader-f16`. Arithmetic is f32.
 * Every kernel reads element groups of four, so head dims must be multiples of 4.
 */
import type { DType } from '@crisp/core';

/** A compute program: a name, a cache key holding compile-time facts only, and its WGSL. */
export interface ProgramDescriptor {
  readonly name: string;
  /** compile-time facts (dtype, head dim, variant); shapes travel as uniforms */
  readonly cacheKey: string;
  readonly wgsl: string;
  readonly entryPoint: string;
}

export type StorageDType = Extract<DType, 'f32' | 'f16'>;

/** WGSL array type of one storage tensor of this dtype (element groups of four). */
export function vec4ArrayType(dtype: StorageDType): string {
  return dtype === 'f32' ? 'array<vec4<f32>>' : 'array<vec2<u32>>';
}

/** WGSL expression widening one group of four stored elements to vec4<f32>. */
export function widen(dtype: StorageDType, expr: string): string {
  return dtype === 'f32' ? expr : `vec4<f32>(unpack2x16float((${expr}).x), unpack2x16float((${expr}).y))`;
}

/** WGSL expression narrowing a vec4<f32> to the stored form. */
export function narrow(dtype: StorageDType, expr: string): string {
  return dtype === 'f32' ? expr : `vec2<u32>(pack2x16float((${expr}).xy), pack2x16float((${expr}).zw))`;
}

/**
 * WGSL `nonFinite(x)`: whether any lane of x is NaN or ±Inf, by the exponent bits (a bit
 * test, so no fast-math folding can hide it). The kernels flag bad inputs with it.
 */
export const NON_FINITE_WGSL = `fn nonFinite(x: vec4<f32>) -> bool {
  return any((bitcast<vec4<u32>>(x) & vec4<u32>(0x7f800000u)) == vec4<u32>(0x7f800000u));
}`;

/** WGSL `packU2` / `unpackU2`: two u32 passed through a vec4<f32> workgroup slot. */
export const PACK_U2_WGSL = `// Two u32 (< 2^30) through an f32 slot: bit 30 set keeps the pattern a normal float, so no
// flush-to-zero of denormals can touch it on the way.
fn packU2(v: vec2<u32>) -> vec4<f32> { return bitcast<vec4<f32>>(vec4<u32>(v | vec2<u32>(0x40000000u), 0x40000000u, 0x40000000u)); }
fn unpackU2(f: vec4<f32>) -> vec2<u32> { return bitcast<vec4<u32>>(f).xy & vec2<u32>(0x3fffffffu); }`;

/** log2(e): kernels work in base 2 with the softmax scale folded into q. */
export const LOG2E = Math.LOG2E;

/**
 * The binding interface every attention kernel shares (the host binds one uniform layout
 * and the same buffers whichever kernel runs): Params, then q, k, v, o, lse (f32 bits,
 * -inf for empty rows), rowPtr, cols, and the head table HT (a dispatch's workgroup x runs
 * head HT[headBase + x]: every head, or a subset such as a plan's PE heads, in one
 * dispatch); the varlen form has the sequence table VT in HT's place. Array types per kernel: vec4 storage for the FMA
 * kernels, scalar f16 or packed u32 for the subgroup-matrix ones.
 */
export function attentionInterface(
  t: { readonly q: string; readonly k: string; readonly v: string; readonly o: string },
  varlen = false,
): string {
  // (the varlen Params has the same layout: the host fills both from one field list)
  const params = varlen
    ? `struct Params {
  m: u32, workBase: u32, H: u32, Hkv: u32,
  B: u32, unused0: u32, unused1: u32, headBase: u32,
  firstWork: u32, numWork: u32, returnLse: u32, scaleLog2: f32,
}`
    : `struct Params {
  m: u32, n: u32, H: u32, Hkv: u32,
  B: u32, Nb: u32, dense: u32, headBase: u32,
  firstTile: u32, numTiles: u32, returnLse: u32, scaleLog2: f32,
}`;
  return `${params}
@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> Q: ${t.q};
@group(0) @binding(2) var<storage, read> K: ${t.k};
@group(0) @binding(3) var<storage, read> V: ${t.v};
@group(0) @binding(4) var<storage, read_write> O: ${t.o};
@group(0) @binding(5) var<storage, read_write> LSE: array<u32>; // f32 bits; -inf for empty rows
@group(0) @binding(6) var<storage, read> rowPtr: array<u32>;
@group(0) @binding(7) var<storage, read> cols: array<u32>;
${varlen ? '@group(0) @binding(8) var<storage, read> VT: array<u32>; // sequence table' : '@group(0) @binding(8) var<storage, read> HT: array<u32>; // head table: workgroup x runs head HT[headBase + x]'}`;
}

/** u32 words per sequence record of the varlen table. */
export const VARLEN_RECORD_WORDS = 8;

/**
 * The varlen form's per-workgroup lookup. VT holds one record per sequence (8 u32: first
 * query row qs and first key row ks in the packed tensors, keys sn, queries sm, the base rp
 * of its rows in the concatenated rowPtr, the base cb of its entries in the concatenated
 * cols, its block count nbs, and sd = 1 for dense causal), then from P.workBase the work
 * entries (sequence, query tile t), two u32 each, heaviest first. Workgroup y of a dispatch
 * takes entry P.firstWork + y. The mask's rows of a sequence hold indices into its own cols
 * (rowPtr starts at 0 for every sequence); its tile t counts from the sequence's position 0.
 */
export const VARLEN_ENTRY_WGSL = `let we = P.workBase + 2u * (P.firstWork + wid.y);
  let rec = ${VARLEN_RECORD_WORDS}u * VT[we];
  let t = VT[we + 1u];
  let qs = VT[rec]; let ks = VT[rec + 1u]; let sn = VT[rec + 2u]; let sm = VT[rec + 3u];
  let rp = VT[rec + 4u]; let cb = VT[rec + 5u]; let nbs = VT[rec + 6u]; let sd = VT[rec + 7u];`;

/**
 * WGSL statements: an inclusive scan (sum) of `arr`, a workgroup array<u32, 256>, in place,
 * by all 256 invocations (`lid` their local index); uniform control flow required.
 */
export function workgroupInclusiveScan(arr: string): string {
  return `for (var off = 1u; off < 256u; off <<= 1u) {
    var add = 0u;
    if (lid >= off) { add = ${arr}[lid - off]; }
    workgroupBarrier();
    ${arr}[lid] += add;
    workgroupBarrier();
  }`;
}
