/**
 * safetensors and `.npy` reading and writing, streamed.
 *
 * @module @crisp/io
 */
export { LAYOUTS, type Layout, type QkvDims, dimsFromFileShape, fileShapeFor, parseLayout } from './layout.js';
export type { FileFormat, TensorFile, TensorInfo } from './tensor-file.js';
export {
  MAX_SAFETENSORS_HEADER,
  SAFETENSORS_DTYPE_BITS,
  SAFETENSORS_DTYPE_BYTES,
  openSafetensors,
  parseSafetensorsBuffer,
  parseSafetensorsHeader,
} from './safetensors.js';
export {
  MAX_NPY_HEADER,
  type NpyHeader,
  type NpyOpenOptions,
  encodeNpyHeader,
  npyDescrToDType,
  openNpy,
  parseNpyBuffer,
  parseNpyHeader,
} from './npy.js';
export {
  DEFAULT_CHUNK_BYTES,
  DEFAULT_MAX_BYTES,
  MAX_CHUNK_BYTES,
  type StreamOptions,
  type StreamPlan,
  type TensorChunk,
  type UploadOptions,
  planStream,
  readTensor,
  streamTensor,
  tensorSource,
  uploadTensor,
} from './stream.js';
export {
  type SafetensorsWriteOptions,
  type IndexTensor,
  type TensorSource,
  type WritableTensor,
  type WriteOptions,
  writeNpy,
  writeSafetensors,
} from './write.js';
export { type DeviceSourceOptions, type WriteTensorOptions, deviceTensorSource, writeTensor } from './device-source.js';
export {
  QKV_NAME_ALIASES,
  type Qkv,
  type QkvLayer,
  type QkvNames,
  type ReadQkvOptions,
  openTensorFile,
  readQkv,
  resolveQkvLayers,
  resolveQkvNames,
  splitLayerName,
} from './open.js';
