/** The Llama attention shape the kernel and bench phases use (--headDim 64 for d = 64), and the block masks built for it. */
import { type BlockMask, vsListsFromArrays } from '@crisp/core';
import { arg } from './args.js';

export const H = 32;
export const Hkv = 8;
/** head dimension: 128 (Llama), or --headDim 64 */
export const D = Number(arg('headDim', '128'));
export const B = 128;

export function fullVsMask(Nb: number): BlockMask {
  const all = Int32Array.from({ length: Nb }, (_, i) => i);
  return { heads: H, numBlocks: Nb, blockSize: B, vs: vsListsFromArrays(Array(H).fill([]), Array(H).fill(all)) };
}
export function patternMask(Nb: number, every: number, band: number, blockSize = B): BlockMask {
  const v: number[][] = [];
  const s: number[][] = [];
  for (let h = 0; h < H; h++) {
    v.push(Array.from({ length: Math.ceil(Nb / every) }, (_, i) => (i * every + h) % Nb));
    s.push(Array.from({ length: band }, (_, i) => i));
  }
  return { heads: H, numBlocks: Nb, blockSize, vs: vsListsFromArrays(v, s) };
}
