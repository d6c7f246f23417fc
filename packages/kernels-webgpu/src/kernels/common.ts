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

/** log2(e): kernels work in base 2 with the softmax scale folded into q. */
export const LOG2E = Math.LOG2E;
