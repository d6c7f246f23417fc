/** Unaligned f16 writes: whole 32-bit words, keeping the neighbouring half of edge words. */
import type { ProgramDescriptor } from './common.js';

export function writeHalvesProgram(): ProgramDescriptor {
  const wgsl = /* wgsl */ `
struct Params { firstWord: u32, words: u32, off: u32, len: u32 }
@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> src: array<u32>;   // halves aligned like the destination
@group(0) @binding(2) var<storage, read_write> dst: array<u32>;
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let w = gid.x;
  if (w >= P.words) { return; }
  let word = P.firstWord + w;
  let lo = word * 2u;
  let hi = lo + 1u;
  let lowIn = lo >= P.off && lo < P.off + P.len;
  let highIn = hi >= P.off && hi < P.off + P.len;
  let old = dst[word];
  let s = src[w];
  let lowBits = select(old & 0xffffu, s & 0xffffu, lowIn);
  let highBits = select(old & 0xffff0000u, s & 0xffff0000u, highIn);
  dst[word] = lowBits | highBits;
}
`;
  return { name: 'writeHalves', cacheKey: 'writeHalves', wgsl, entryPoint: 'main' };
}
