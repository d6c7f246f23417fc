/**
 * The mask a WebGPU device plan prepares (core's PreparedMask): the routes and VS lists the
 * device selected, expanded into rows on the device, plus the PE heads' rows once they are
 * there. The PE rows' γ cut runs on the host in this backend (peBlockRows), which needs the
 * routes on the host: so the PE part is made once, when first needed (`complete()`): by
 * sparseAttention before its one attention run over every head's final rows, by the plan's
 * read(), or by readBlockCounts(). Until then only the VS rows exist.
 */
import { type BlockRows, InvalidArgumentError, type PreparedMask, type Route, spreadRowPtr, type VsLists } from '@crisp/core';
import { type QueuedSelection, readRowCounts, readSelection } from '../ops/device-select.js';
import { expandBuffers } from '../ops/expand-mask.js';
import type { OpHost } from '../ops/host.js';
import { peBlockRows } from '../ops/pe-rows.js';
import type { WebGpuTensor } from '../runtime/tensor.js';

/** What the PE heads' rows are made from (the plan request's `pe`). */
export interface PeInputs {
  readonly q: WebGpuTensor;
  readonly k: WebGpuTensor;
  readonly gamma: number;
  readonly scale: number | undefined;
}

/** The plan with its PE part: the device's routes, the PE heads (ascending) and their rows, and every head's rows. */
export interface CompletePlan {
  readonly routes: Route[];
  readonly peHeads: number[];
  /** the PE heads' rows (peBlockRows' form), when there are PE heads */
  readonly peRows: BlockRows | undefined;
  /** every head's rows (the VS lists ∪ the PE rows) on the device */
  readonly rowPtr: GPUBuffer;
  readonly cols: GPUBuffer;
}

/** A prepared mask dropped unreleased gives its buffers back once collected. */
const PREPARED_FINALIZER = new FinalizationRegistry<{ gpu: OpHost['gpu']; held: GPUBuffer[] }>((h) => h.gpu.retire(...h.held));

export class WebGpuPreparedMask implements PreparedMask {
  readonly backend: string;
  readonly heads: number;
  readonly numBlocks: number;
  readonly blockSize: number;
  readonly #host: OpHost;
  readonly #sel: QueuedSelection;
  readonly #pe: PeInputs;
  readonly #held: GPUBuffer[];
  #complete: Promise<CompletePlan> | undefined;
  #released = false;

  constructor(host: OpHost, shape: { readonly heads: number; readonly numBlocks: number; readonly blockSize: number }, sel: QueuedSelection, pe: PeInputs) {
    this.backend = host.name;
    this.#host = host;
    this.heads = shape.heads;
    this.numBlocks = shape.numBlocks;
    this.blockSize = shape.blockSize;
    this.#sel = sel;
    this.#pe = pe;
    this.#held = [...sel.held];
    PREPARED_FINALIZER.register(this, { gpu: host.gpu, held: this.#held }, this);
  }

  /** Whether `host` (a backend's) made this mask. */
  ownedBy(host: OpHost): boolean {
    return this.#host === host;
  }

  get released(): boolean {
    return this.#released;
  }

  /** the VS lists expanded (the PE heads' rows not in them), capacity in blocks */
  get vsRows(): { readonly rowPtr: GPUBuffer; readonly cols: GPUBuffer; readonly cap: number } {
    return this.#sel;
  }


  #alive(): void {
    this.#host.alive();
    if (this.#released) throw new InvalidArgumentError('the device plan was read after its prepared mask was released; read it first');
  }

  /**
   * The plan with its PE part, made once: the routes read back, the PE heads' rows by
   * peBlockRows (the γ cut on the host), and every head's rows expanded again with them.
   */
  complete(): Promise<CompletePlan> {
    this.#alive();
    this.#complete ??= this.#makeComplete();
    return this.#complete;
  }

  async #makeComplete(): Promise<CompletePlan> {
    const H = this.heads;
    const Nb = this.numBlocks;
    const sel = this.#sel;
    const routes = Array.from(new Uint32Array(await this.#host.gpu.read(sel.routes, 0, H * 4)), (x): Route => (x === 1 ? 'vs' : 'pe'));
    const peHeads = routes.flatMap((r, h) => (r === 'pe' ? [h] : []));
    if (peHeads.length === 0) {
      return { routes, peHeads, peRows: undefined, rowPtr: sel.rowPtr, cols: sel.cols };
    }
    const { q, k, gamma, scale } = this.#pe;
    const peRows = await peBlockRows(this.#host, q, k, { blockSize: this.blockSize, gamma, heads: peHeads, scale });
    this.#alive();
    const rows = { rowPtr: spreadRowPtr(peRows.rowPtr, peHeads, H, Nb), cols: peRows.cols };
    const e = await expandBuffers(this.#host, H, Nb, { vsPtr: sel.vsPtr, vsList: sel.vsList, sliceBase: H * Nb }, rows, sel.cap);
    if (this.#released) this.#host.gpu.retire(e.rowPtr, e.cols);
    else this.#held.push(e.rowPtr, e.cols);
    return { routes, peHeads, peRows, rowPtr: e.rowPtr, cols: e.cols };
  }

  /** The device's routes, VS lists and PE rows (the PE part made first when it is not yet). */
  async read(): Promise<{ routes: Route[]; vs: VsLists; peRows: BlockRows | undefined }> {
    const c = await this.complete();
    this.#alive();
    const { vs } = await readSelection(this.#host, this.#sel, this.heads, this.numBlocks);
    return { routes: c.routes, vs, peRows: c.peRows };
  }

  async readBlockCounts(): Promise<Float64Array> {
    const c = await this.complete();
    this.#alive();
    return readRowCounts(this.#host, c.rowPtr, this.heads, this.numBlocks);
  }

  release(): void {
    if (this.#released) return;
    this.#released = true;
    PREPARED_FINALIZER.unregister(this);
    // (destroyed once the work submitted so far, an attention on these rows included, is done)
    this.#host.gpu.retire(...this.#held);
  }
}
