/**
 * The ONNX model the ONNX Runtime Web peer runs, generated here (no model file is shipped):
 * one `com.microsoft` GroupQueryAttention node, q [1, n, H·d], k and v [1, n, H_kv·d] in, the
 * output [1, n, H·d] out, n symbolic so one model serves every length.
 *
 * Why GroupQueryAttention: it is the attention op transformers.js's exported decoders use, the
 * one ORT's WebGPU execution provider (onnxruntime/contrib_ops/webgpu/bert/
 * group_query_attention.cc) sends to its FlashAttention shader, and it takes H_kv < H and the
 * causal mask natively (prompt processing: query i sees keys 0..i, from seqlens_k = n − 1 and
 * total_sequence_length = n). MultiHeadAttention takes one head count for q, k and v: K and V
 * would have to be repeated to H heads on the host (H/H_kv times the memory and upload of the
 * op it measures), and its causal mask is an n × n attention_bias input (n² values per run) or
 * the `unidirectional` attribute that older contrib schemas lack: not what a browser app runs
 * for a causal GQA model.
 * No rotary embedding, no KV cache (past_key/past_value empty), scale the default 1/√d.
 *
 * The protobuf is written by hand: five message types of onnx.proto, each field number named
 * below. The `onnx-proto` package would bring a second protobufjs (6.x, beside the 7.x that
 * onnxruntime-web already depends on) and its install script for what is some sixty lines.
 *
 * @module
 */

/** onnx.proto TensorProto.DataType values used here. */
export const ONNX_FLOAT = 1;
export const ONNX_INT32 = 6;
export const ONNX_FLOAT16 = 10;

/** A protobuf message being written (wire types 0 and 2 are all ONNX needs here). */
class Message {
  private readonly bytes: number[] = [];

  private varint(v: number): void {
    let x = BigInt(v);
    if (x < 0n) x += 1n << 64n; // int64 negatives: ten bytes of two's complement
    while (x >= 0x80n) {
      this.bytes.push(Number(x & 0x7fn) | 0x80);
      x >>= 7n;
    }
    this.bytes.push(Number(x));
  }

  /** a varint field (int32, int64, enum) */
  int(field: number, v: number): this {
    this.varint(field << 3);
    this.varint(v);
    return this;
  }

  /** a length-delimited field: bytes, a string, or an embedded message */
  bytesField(field: number, data: Uint8Array | readonly number[]): this {
    this.varint((field << 3) | 2);
    this.varint(data.length);
    for (const b of data) this.bytes.push(b);
    return this;
  }

  str(field: number, s: string): this {
    return this.bytesField(field, new TextEncoder().encode(s));
  }

  msg(field: number, m: Message): this {
    return this.bytesField(field, m.bytes);
  }

  encode(): Uint8Array {
    return Uint8Array.from(this.bytes);
  }
}

/** ValueInfoProto { name = 1, type = 2 }; TypeProto { tensor_type = 1 }; TypeProto.Tensor { elem_type = 1, shape = 2 }; TensorShapeProto { dim = 1 }; Dimension { dim_value = 1, dim_param = 2 } */
function valueInfo(name: string, elemType: number, dims: readonly (number | string)[]): Message {
  const shape = new Message();
  for (const d of dims) shape.msg(1, typeof d === 'number' ? new Message().int(1, d) : new Message().str(2, d));
  return new Message().str(1, name).msg(2, new Message().msg(1, new Message().int(1, elemType).msg(2, shape)));
}

/** AttributeProto { name = 1, i = 3, type = 20 (AttributeType INT = 2) } */
function intAttribute(name: string, v: number): Message {
  return new Message().str(1, name).int(3, v).int(20, 2);
}

export interface GqaModelSpec {
  readonly heads: number;
  readonly kvHeads: number;
  readonly headDim: number;
  readonly dtype: 'f16' | 'f32';
}

/** Graph input names, in the order GroupQueryAttention takes them ('' = an absent optional input). */
export const GQA_INPUTS = { q: 'q', k: 'k', v: 'v', seqlensK: 'seqlens_k', totalSequenceLength: 'total_sequence_length' } as const;
export const GQA_OUTPUT = 'o';

/**
 * The serialised ModelProto: ir_version = 1 (8), producer_name = 2, graph = 7, opset_import = 8
 * (ai.onnx 17 and com.microsoft 1). GraphProto: node = 1, name = 2, input = 11, output = 12.
 * NodeProto: input = 1, output = 2, name = 3, op_type = 4, attribute = 5, domain = 7.
 */
export function gqaModel(spec: GqaModelSpec): Uint8Array {
  const { heads: H, kvHeads: Hkv, headDim: d } = spec;
  const elem = spec.dtype === 'f16' ? ONNX_FLOAT16 : ONNX_FLOAT;
  const node = new Message();
  // query, key, value, past_key, past_value, seqlens_k, total_sequence_length
  for (const name of [GQA_INPUTS.q, GQA_INPUTS.k, GQA_INPUTS.v, '', '', GQA_INPUTS.seqlensK, GQA_INPUTS.totalSequenceLength]) node.str(1, name);
  node.str(2, GQA_OUTPUT).str(3, 'attention').str(4, 'GroupQueryAttention').str(7, 'com.microsoft');
  node.msg(5, intAttribute('num_heads', H)).msg(5, intAttribute('kv_num_heads', Hkv));
  const graph = new Message().msg(1, node).str(2, 'crisp_causal_gqa');
  graph.msg(11, valueInfo(GQA_INPUTS.q, elem, [1, 'n', H * d]));
  graph.msg(11, valueInfo(GQA_INPUTS.k, elem, [1, 'n', Hkv * d]));
  graph.msg(11, valueInfo(GQA_INPUTS.v, elem, [1, 'n', Hkv * d]));
  graph.msg(11, valueInfo(GQA_INPUTS.seqlensK, ONNX_INT32, [1]));
  graph.msg(11, valueInfo(GQA_INPUTS.totalSequenceLength, ONNX_INT32, [1]));
  graph.msg(12, valueInfo(GQA_OUTPUT, elem, [1, 'n', H * d]));
  return new Message()
    .int(1, 8)
    .str(2, 'crisp-ts')
    .msg(8, new Message().str(1, '').int(2, 17))
    .msg(8, new Message().str(1, 'com.microsoft').int(2, 1))
    .msg(7, graph)
    .encode();
}
