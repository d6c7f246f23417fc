/**
 * Block-sparse and dense causal attention (kernels/attention/): one launch over BSR rows, or
 * two on a device plan's streams (VS heads on the main one, PE heads beside them).
 * Shape legend: q [m, H, d] (the last m of n positions), k and v [n, Hkv, d], B block size.
 */
import {
  type AttentionOptions,
  type AttentionResult,
  type AttentionShape,
  type BlockMask,
  CrispError,
  DTypeError,
  type DeviceTensor,
  InvalidArgumentError,
  assertOutApart,
  MaskError,
  ShapeError,
  assertBlockSize,
  assertSupported,
  attentionShape,
  bytesPerElement,
  defaultScale,
  numBlocks,
  validateMask,
} from '@crisp/core';
import { BACKEND_NAME, CUDA_CAPABILITIES, type CudaContext } from '../runtime/context.js';
import type { KeptStats } from '../runtime/kept-stats.js';
import { type Arg, F, I, P, TMAP } from '../runtime/launcher.js';
import type { DeviceBlock } from '../runtime/pool.js';
import type { CudaTensor } from '../runtime/tensor.js';
import { expandOnDevice } from './expand.js';
import { CudaPreparedMask } from './prepared-mask.js';

/**
 * Attention kernel layouts (same math, same results up to f32 summation order). `w32`
 * (kernels/attention.cu, mma.sync, any sm_80+ GPU): B/32 warps of 32 query rows (each K/V
 * fragment feeds two MMAs), 64-key tiles, two CTAs per SM. The Hopper layouts
 * (kernels/attention-wgmma.cu, built for sm_90a): B/64 consumer warpgroups of 64 rows on
 * wgmma.mma_async with Q/K/V read from shared memory through descriptors, key tiles of B rows,
 * each tile's softmax overlapped with the previous tile's P·V, fed by a producer warpgroup
 * through mbarriers (3 stages, no CTA-wide barrier per tile). `wgw`: the producer's 128
 * threads load K and V with cp.async. `wgt`: one producer thread loads them with TMA (tensor
 * maps encoded at each launch), the two consumer warpgroups take turns to issue their
 * MMAs (ping-pong), and the causal mask's code runs only on the tiles that cross the
 * diagonal (a branch per tile, not a compare and select per score). `wg3` (d 64): `wgt`'s
 * producer and mask split with three consumer warpgroups on 192-row query tiles over 128-key
 * tiles, no ping-pong (FlashAttention-3's d 64 shape: more softmax in flight beside the
 * products); dense launches at d 64 and B 128 only, every other launch runs `wgt`. On a GPU other than compute
 * capability 9.0 the Hopper layouts launch `w32`, and a TMA layout launches `wgw` where the
 * driver cannot encode tensor maps; `attentionVariantFallback` says why. Measured dense at
 * 64k (bf16, d 128, B 128): w32 326, wgw 403 TFLOP/s on the H200; wgw 421, wgt 580-632 on an H100
 * (450 at d 64).
 * `keyTile` null: the key tile is the mask block (B rows).
 */
export const ATTENTION_VARIANTS = {
  w32: { file: 'attention/attention.cu', prefix: 'attn_w32_', rowsPerWarp: 32, keyTile: 64, queryTile: null, stages: 2, producerThreads: 0, sm90a: false, tma: false },
  wgw: { file: 'attention/attention-wgmma.cu', prefix: 'attn_wgw_', rowsPerWarp: 16, keyTile: null, queryTile: null, stages: 3, producerThreads: 128, sm90a: true, tma: false },
  wgt: { file: 'attention/attention-wgmma.cu', prefix: 'attn_wgt_', rowsPerWarp: 16, keyTile: null, queryTile: null, stages: 3, producerThreads: 128, sm90a: true, tma: true },
  wg3: { file: 'attention/attention-wgmma.cu', prefix: 'attn_wg3_', rowsPerWarp: 16, keyTile: null, queryTile: 192, stages: 3, producerThreads: 128, sm90a: true, tma: true },
} as const;
type Layout = (typeof ATTENTION_VARIANTS)[AttentionVariant];
export type AttentionVariant = keyof typeof ATTENTION_VARIANTS;
/** what a Hopper-only variant launches on other GPUs (any sm_80+ runs it) */
const PORTABLE_ATTENTION_VARIANT: AttentionVariant = 'w32';
/** what a TMA variant launches on Hopper where the driver cannot encode tensor maps */
const CP_ASYNC_HOPPER_VARIANT: AttentionVariant = 'wgw';
/**
 * The layout a backend launches unless told otherwise: the fastest measured on the GPU's
 * architecture. Hopper (compute capability 9.0): `wg3`, which is `wgt` except dense d 64 at
 * B 128 (`wgt`: 580-632 TFLOP/s dense at 64k on an H100, where `wgw` ran 421; per computed
 * block of CRISP's masks 1.03-1.06x dense at 128k-512k, a head's query blocks running
 * together; `wg3`'s d 64 dense: 503-513 TFLOP/s at 16k-64k on the H200, where `wgt` ran
 * 418-432). Elsewhere `w32`, the fastest mma.sync layout on the H200 (not measured on other GPUs).
 */
export function defaultAttentionVariant(computeCapability: readonly [number, number]): AttentionVariant {
  return computeCapability[0] === 9 && computeCapability[1] === 0 ? 'wg3' : PORTABLE_ATTENTION_VARIANT;
}

const LOG2E = Math.LOG2E;

export interface Prepared {
  readonly shape: ReturnType<typeof attentionShape>;
  readonly qt: CudaTensor;
  readonly kt: CudaTensor;
  readonly vt: CudaTensor;
  readonly out: CudaTensor;
  readonly lse: CudaTensor | undefined;
  readonly scale: number;
  readonly Nb: number;
}

/** The attention launches, with the layout knob. */
export class AttentionOp {
  readonly #cx: CudaContext;
  readonly #kept: KeptStats;
  /** the attention kernel layout launched by sparse and dense (a tuning knob) */
  variant: AttentionVariant;

  constructor(cx: CudaContext, kept: KeptStats, variant: AttentionVariant) {
    this.#cx = cx;
    this.#kept = kept;
    this.variant = variant;
  }

  /**
   * Why the selected variant is not the one launched (undefined when it is): the Hopper
   * variants need compute capability 9.0 (wgmma is an sm_90a feature, absent from
   * Ampere/Ada and not carried forward to later architectures), elsewhere `w32` runs; and
   * the TMA variant needs the driver's cuTensorMapEncodeTiled, without which `wgw` runs.
   */
  get fallback(): string | undefined {
    return this.#launched().why;
  }

  /** The variant launched for the selected one, and why it differs (see fallback). */
  #launched(): { name: AttentionVariant; why?: string } {
    const cx = this.#cx;
    const lay = ATTENTION_VARIANTS[this.variant];
    if (lay.sm90a && cx.arch !== 90) {
      return {
        name: PORTABLE_ATTENTION_VARIANT,
        why: `attention variant ${this.variant} needs a Hopper GPU (compute capability 9.0, wgmma); ${cx.info.name} is ${cx.info.computeCapability.join('.')}, so ${PORTABLE_ATTENTION_VARIANT} runs instead`,
      };
    }
    if (lay.tma && !cx.libs.cu.cuTensorMapEncodeTiled) {
      return {
        name: CP_ASYNC_HOPPER_VARIANT,
        why: `attention variant ${this.variant} loads with TMA, which needs cuTensorMapEncodeTiled (a CUDA 12 or later driver); this driver lacks it, so ${CP_ASYNC_HOPPER_VARIANT} runs instead`,
      };
    }
    return { name: this.variant };
  }

  /**
   * Check the inputs and options, allocate the output (and LSE). `packed`: a varlen batch's
   * shape (packedShape: q may have more rows than k; its sequences are checked by the batch).
   */
  prepare(q: DeviceTensor, k: DeviceTensor, v: DeviceTensor, opts: AttentionOptions, B: number, packed?: AttentionShape): Prepared {
    const cx = this.#cx;
    const shape = packed ?? attentionShape(q, k, v);
    // (a packed batch: dtype and head dim here; each sequence's length is checked by the batch)
    assertSupported(CUDA_CAPABILITIES, packed ? { ...shape, queries: 1, keys: 1 } : shape, BACKEND_NAME);
    const qt = cx.tensor(q, 'q');
    const kt = cx.tensor(k, 'k');
    const vt = cx.tensor(v, 'v');
    const { queries: m, heads: H, headDim: D } = shape;
    // every argument checked before any work (the NaN/Inf checks launch kernels)
    if (opts === null || typeof opts !== 'object') throw new InvalidArgumentError(`attention options must be an object; got ${opts === null ? 'null' : typeof opts}`);
    const scale = opts.scale ?? defaultScale(D);
    if (!(typeof scale === 'number' && scale > 0 && Number.isFinite(scale))) throw new InvalidArgumentError(`scale must be a positive finite number; got ${scale}`);
    const given = opts.out ? cx.tensor(opts.out, 'opts.out') : undefined;
    if (given) {
      if (given.dtype !== shape.dtype) throw new DTypeError(`opts.out must be ${shape.dtype} like q, k and v; got ${given.dtype}`);
      if (given.shape.length !== 3 || given.shape[0] !== m || given.shape[1] !== H || given.shape[2] !== D) {
        throw new ShapeError(`opts.out must be ${shape.dtype} [${m}, ${H}, ${D}]; got ${given.dtype} [${given.shape}]`);
      }
      // the kernel reads q, k and v while it writes out: memory they share would be overwritten mid-read
      assertOutApart(given, { q: qt, k: kt, v: vt }, (t) => (t as CudaTensor).memoryRange, { out: 'opts.out' });
    }
    cx.assertFinite(qt, 'q');
    cx.assertFinite(kt, 'k');
    cx.assertFinite(vt, 'v');
    let out: CudaTensor;
    if (given) {
      out = given;
      out.markWritten();
    } else {
      out = cx.allocate(shape.dtype, [m, H, D], m * H * D * bytesPerElement(shape.dtype));
    }
    let lse: CudaTensor | undefined;
    try {
      lse = opts.returnLse ? cx.allocate('f32', [H, m], H * m * 4) : undefined;
    } catch (e) {
      if (!opts.out) out.dispose();
      throw e;
    }
    return { shape, qt, kt, vt, out, lse, scale, Nb: numBlocks(shape.keys, B) };
  }

  /**
   * The layout launched, its shared memory and threads per CTA for block size B, head dim D.
   * `wg3` (192-row query tiles) has dense launches at d 64, B 128 only: any other launch
   * (block-sparse rows, a varlen batch, another d or B) runs `wgt`.
   */
  #layout(B: number, D: number, dense = false): { lay: Layout; smem: number; block: number; rows: number } {
    let lay: Layout = ATTENTION_VARIANTS[this.#launched().name];
    if (lay.queryTile !== null && !(dense && D === 64 && B === 128)) lay = ATTENTION_VARIANTS.wgt;
    // Q (B rows) plus `stages` stages of K and V tiles; the wgmma layouts align their tiles
    // to 1024 bytes (the 128-byte swizzle's repeat) themselves, from up to 1 KB of slack; a
    // producer warpgroup's pipeline adds 4 mbarriers (8 bytes) a stage.
    const keyTile = lay.keyTile ?? B;
    const rows = lay.queryTile ?? B;
    const smem =
      rows * D * 2 + 2 * lay.stages * keyTile * D * 2 + (lay.sm90a ? 1024 : 0) + (lay.producerThreads ? 32 * lay.stages : 0);
    return { lay, smem, block: (rows / lay.rowsPerWarp) * 32 + lay.producerThreads, rows };
  }

  /** A TMA layout's two extra arguments: the tensor maps of K and V ([rows, Hkv, D], B-row boxes). */
  #tensorMaps(lay: Layout, kt: CudaTensor, vt: CudaTensor, B: number): Arg[] {
    if (!lay.tma) return [];
    const [rows, heads, cols] = kt.shape;
    return [TMAP({ ptr: kt.ptr, rows, heads, cols, boxRows: B }), TMAP({ ptr: vt.ptr, rows, heads, cols, boxRows: B })];
  }

  /**
   * One attention launch over rows (rowPtr, cols; 0, 0: dense). `heads` (crisp-common.cuh's
   * cta_order): every head by default; `{ routes }` only the heads routed to VS there (the
   * others leave at once); `{ list, count }` the `count` heads of a device list [count][heads].
   */
  run(
    p: Prepared,
    B: number,
    rowPtr: number,
    cols: number,
    heads?: { readonly routes: number } | { readonly list: number; readonly count: number },
  ): AttentionResult {
    const cx = this.#cx;
    const { shape, qt, kt, vt, out, lse, scale, Nb } = p;
    const { keys: n, queries: m, heads: H, kvHeads: Hkv, headDim: D, dtype } = shape;
    if (Nb > 65535) throw new CrispError('LIMIT_EXCEEDED', `n = ${n} gives ${Nb} query blocks; at most 65535 per launch`);
    const { lay, smem, block, rows } = this.#layout(B, D, rowPtr === 0);
    // Chunked prefill: only the query tiles holding positions n − m .. n − 1 (tiles of B rows,
    // or of the layout's own query tile for dense launches, which then count in those tiles)
    const Nq = rows === B ? Nb : Math.ceil(n / rows);
    const firstBlock = Math.floor((n - m) / rows);
    const [gx, hsel, sel] = !heads ? [H, 0, 0] : 'routes' in heads ? [H, heads.routes, 1] : [heads.count, heads.list, 2];
    const nq = Nq - firstBlock;
    // block-sparse rows: a head's query blocks run together (CTA order 1, crisp-common.cuh)
    const swapped = rowPtr !== 0;
    const grid: [number, number] = swapped ? [nq, gx] : [gx, nq];
    const hmode = sel | (swapped ? 4 : 0);
    cx.launch(lay.file, `${lay.prefix}${dtype}_d${D}_b${B}`, grid, block, smem, [
      P(qt.ptr),
      P(kt.ptr),
      P(vt.ptr),
      P(out.ptr),
      P(lse ? lse.ptr : 0),
      P(rowPtr),
      P(cols),
      I(n),
      I(m),
      I(Nq),
      I(H),
      I(Hkv),
      F(scale * LOG2E),
      P(hsel),
      I(hmode),
      P(0),
      I(m),
      ...this.#tensorMaps(lay, kt, vt, B),
    ]);
    // housekeeping while the kernel runs: old statistics to the host (KeptStats.evictRetained)
    this.#kept.evictRetained(1);
    return lse ? { output: out, lse } : { output: out };
  }

  /**
   * One launch over a ragged batch: `segs` is the device table of VarSeg entries
   * (crisp-common.cuh), grid z the sequence, grid y the most query blocks of any sequence.
   */
  runVarlen(p: Prepared, B: number, segs: number, count: number, maxQueryBlocks: number): AttentionResult {
    const cx = this.#cx;
    const { shape, qt, kt, vt, out, lse, scale } = p;
    const { queries: Mq, heads: H, kvHeads: Hkv, headDim: D, dtype } = shape;
    if (maxQueryBlocks > 65535 || count > 65535) {
      throw new CrispError('LIMIT_EXCEEDED', `a varlen launch takes at most 65535 sequences of at most 65535 query blocks; got ${count} sequences, ${maxQueryBlocks} blocks`);
    }
    const { lay, smem, block } = this.#layout(B, D);
    cx.launch(lay.file, `${lay.prefix}${dtype}_d${D}_b${B}`, [H, maxQueryBlocks, count], block, smem, [
      P(qt.ptr),
      P(kt.ptr),
      P(vt.ptr),
      P(out.ptr),
      P(lse ? lse.ptr : 0),
      P(0),
      P(0),
      I(0),
      I(0),
      I(0),
      I(H),
      I(Hkv),
      F(scale * LOG2E),
      P(0),
      I(0),
      P(segs),
      I(Mq),
      ...this.#tensorMaps(lay, kt, vt, B),
    ]);
    this.#kept.evictRetained(1);
    return lse ? { output: out, lse } : { output: out };
  }

  sparse(
    q: DeviceTensor,
    k: DeviceTensor,
    v: DeviceTensor,
    mask: BlockMask,
    opts: AttentionOptions = {},
  ): AttentionResult {
    const cx = this.#cx;
    cx.alive();
    if (!mask || typeof mask !== 'object') throw new MaskError(`sparseAttention needs a BlockMask { heads, numBlocks, blockSize, vs?, rows? }; got ${mask === null ? 'null' : typeof mask}`);
    const B = mask.blockSize;
    assertBlockSize(B, CUDA_CAPABILITIES.blockSizes);
    const shape = attentionShape(q, k, v);
    const expect = { heads: shape.heads, numBlocks: numBlocks(shape.keys, B), blockSize: B };
    const prepared = opts.prepared;
    if (prepared) {
      // A plan's mask, expanded on this device already (its PE rows may still be on their
      // way to the host, so the mask itself is not re-read here).
      if (!(prepared instanceof CudaPreparedMask) || prepared.owner !== cx) {
        throw new InvalidArgumentError(`opts.prepared was made by ${prepared.backend}, not by this CUDA backend`);
      }
      if (prepared.released) throw new InvalidArgumentError('opts.prepared was released; run plan.mask instead (re-plan or drop opts.prepared)');
      if (prepared.heads !== expect.heads || prepared.numBlocks !== expect.numBlocks || prepared.blockSize !== B) {
        throw new MaskError(
          `opts.prepared covers H=${prepared.heads}, Nb=${prepared.numBlocks}, B=${prepared.blockSize}; the problem has H=${expect.heads}, Nb=${expect.numBlocks}, B=${B}`,
        );
      }
      if (mask.heads !== prepared.heads || mask.numBlocks !== prepared.numBlocks || mask.blockSize !== B) {
        throw new MaskError('opts.prepared does not describe this mask (heads, blocks or block size differ)');
      }
      const p = this.prepare(q, k, v, opts, B);
      const split = prepared.split;
      if (!split) return this.run(p, B, prepared.rowPtr.ptr, prepared.cols.ptr);
      // A device plan on two streams: the VS heads' attention first; then the PE heads'
      // kernels, rows and attention on the second stream, beside it (that attention also
      // waits for what the main stream had queued before this call: writes to out, say);
      // the main stream then waits for the second.
      try {
        const before = cx.streams.fence(cx.streams.main);
        const res = this.run(p, B, prepared.rowPtr.ptr, prepared.cols.ptr, { routes: split.routes });
        const pe = split.queue();
        const rows = pe.rows;
        if (rows) {
          cx.streams.onStream(split.side, () => {
            cx.streams.waitFor(split.side, before);
            this.run(p, B, rows.rowPtr, rows.cols, { list: split.list, count: pe.count });
          });
          cx.streams.fence(split.side, cx.streams.main);
        }
        return res;
      } catch (e) {
        // (a failed launch, a bad row in the plan, no memory for the PE rows): the output is
        // incomplete, and is not handed out. The main stream first waits for whatever the
        // second stream had queued: the pool hands the output's block (and the plan's) out
        // again in the main stream's order.
        cx.streams.joinQuietly(split.side);
        if (!opts.out) p.out.dispose();
        p.lse?.dispose();
        throw e;
      }
    }
    // Pointers and VS lists on the host; the BSR entries (tens of millions at 512k) on the
    // device while expanding (expand_count), which raises the same MaskError.
    // (query blocks before the first query row may stay empty in chunked prefill)
    const firstQueryBlock = Math.floor((shape.keys - shape.queries) / B);
    validateMask(mask, expect, { rowEntries: false, firstQueryBlock });
    const p = this.prepare(q, k, v, opts, B);
    const temp: DeviceBlock[] = [];
    try {
      const e = expandOnDevice(cx, mask);
      temp.push(...e.temp, e.rowPtr, e.cols);
      return this.run(p, B, e.rowPtr.ptr, e.cols.ptr);
    } catch (e) {
      if (!opts.out) p.out.dispose();
      p.lse?.dispose();
      throw e;
    } finally {
      for (const x of temp) cx.pool.release(x);
    }
  }

  dense(q: DeviceTensor, k: DeviceTensor, v: DeviceTensor, opts: AttentionOptions = {}): AttentionResult {
    const cx = this.#cx;
    cx.alive();
    const B = 128;
    const p = this.prepare(q, k, v, opts, B);
    try {
      return this.run(p, B, 0, 0);
    } catch (e) {
      if (!opts.out) p.out.dispose();
      p.lse?.dispose();
      throw e;
    }
  }

}
