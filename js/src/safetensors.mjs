// Reading and writing the safetensors format: no dependencies, browser and Node alike.
//
// A safetensors file is an 8-byte little-endian unsigned header length N, N bytes of
// UTF-8 JSON, then the tensor bytes (little-endian, C order, no gaps). The header maps
// each tensor name to {dtype, shape, data_offsets: [begin, end]} (offsets into the bytes
// after the header), plus an optional "__metadata__" object of string values.
// Specification: https://github.com/huggingface/safetensors#format

/** @typedef {'float32' | 'float64' | 'float16' | 'int8' | 'uint8' | 'int16' | 'uint16' | 'int32' | 'uint32' | 'int64' | 'uint64' | 'bool'} DType */

/**
 * @typedef {Float32Array | Float64Array | Int8Array | Uint8Array | Int16Array | Uint16Array | Int32Array | Uint32Array | BigInt64Array | BigUint64Array} TypedArray
 */

/**
 * A named tensor held in plain JavaScript memory.
 * `float16` data is held as the raw bits (`Uint16Array`) and `bool` as `Uint8Array`, as ONNX Runtime's JS API does.
 * @typedef {object} NamedTensor
 * @property {string} name
 * @property {DType} dtype  ONNX Runtime JS type name
 * @property {number[]} shape
 * @property {TypedArray} data  `shape` product elements
 */

/** @type {Record<DType, [string, new (buffer: ArrayBuffer) => TypedArray, number]>} */
const DTYPES = {
  float32: ['F32', Float32Array, 4],
  float64: ['F64', Float64Array, 8],
  float16: ['F16', Uint16Array, 2],
  int8: ['I8', Int8Array, 1],
  uint8: ['U8', Uint8Array, 1],
  int16: ['I16', Int16Array, 2],
  uint16: ['U16', Uint16Array, 2],
  int32: ['I32', Int32Array, 4],
  uint32: ['U32', Uint32Array, 4],
  int64: ['I64', BigInt64Array, 8],
  uint64: ['U64', BigUint64Array, 8],
  bool: ['BOOL', Uint8Array, 1],
};
/** @type {Record<string, DType>} */
const FROM_SAFETENSORS = Object.fromEntries(Object.entries(DTYPES).map(([name, [code]]) => [code, /** @type {DType} */ (name)]));

/** The dtypes this module reads and writes (ONNX Runtime JS names). */
export const SUPPORTED_DTYPES = /** @type {DType[]} */ (Object.keys(DTYPES));

const LITTLE_ENDIAN = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;

/**
 * Number of elements of a shape.
 * @param {readonly number[]} shape
 * @returns {number}
 */
export function elementCount(shape) {
  return shape.reduce((a, b) => a * b, 1);
}

/**
 * A zero-filled typed array of a dtype.
 * @param {DType} dtype
 * @param {number} length
 * @returns {TypedArray}
 */
export function zeros(dtype, length) {
  const entry = DTYPES[dtype];
  if (!entry) throw new TypeError(`unsupported dtype '${dtype}'; supported: ${SUPPORTED_DTYPES.join(', ')}`);
  return new entry[1](new ArrayBuffer(length * entry[2]));
}

/**
 * Parse a safetensors file.
 * @param {ArrayBuffer | Uint8Array} bytes  the whole file
 * @param {string} [what]  how to name the file in errors
 * @returns {{tensors: Map<string, NamedTensor>, metadata: Record<string, string>}}
 *   tensors in file order; each tensor's data is a copy (aligned, independent of `bytes`)
 * @throws {RangeError | SyntaxError | TypeError} on a malformed file or an unsupported dtype
 */
export function parseSafetensors(bytes, what = 'safetensors file') {
  requireLittleEndian();
  const view = bytes instanceof Uint8Array ? bytes : new Uint8Array(bytes);
  if (view.byteLength < 8) throw new RangeError(`${what}: ${view.byteLength} bytes, too short for a safetensors header`);
  const headerLength = new DataView(view.buffer, view.byteOffset, 8).getBigUint64(0, true);
  if (headerLength > BigInt(view.byteLength - 8)) {
    throw new RangeError(`${what}: the header claims ${headerLength} bytes but the file has ${view.byteLength - 8} after the length`);
  }
  const start = 8 + Number(headerLength);
  let header;
  try {
    header = JSON.parse(new TextDecoder('utf-8', { fatal: true }).decode(view.subarray(8, start)));
  } catch (error) {
    throw new SyntaxError(`${what}: the header is not UTF-8 JSON (${/** @type {Error} */ (error).message})`);
  }
  if (header === null || typeof header !== 'object' || Array.isArray(header)) {
    throw new SyntaxError(`${what}: the header must be a JSON object`);
  }
  const { __metadata__: metadata = {}, ...entries } = header;
  const dataLength = view.byteLength - start;
  /** @type {Map<string, NamedTensor>} */
  const tensors = new Map();
  for (const [name, entry] of Object.entries(entries)) {
    const dtype = FROM_SAFETENSORS[entry?.dtype];
    if (!dtype) throw new TypeError(`${what}: tensor '${name}' has dtype ${JSON.stringify(entry?.dtype)}; supported: ${Object.keys(FROM_SAFETENSORS).join(', ')}`);
    const shape = entry.shape;
    const offsets = entry.data_offsets;
    if (!Array.isArray(shape) || !shape.every((d) => Number.isSafeInteger(d) && d >= 0)) {
      throw new TypeError(`${what}: tensor '${name}' has shape ${JSON.stringify(shape)}; expected a list of non-negative integers`);
    }
    if (!Array.isArray(offsets) || offsets.length !== 2 || !(offsets[0] <= offsets[1]) || offsets[1] > dataLength) {
      throw new RangeError(`${what}: tensor '${name}' has data_offsets ${JSON.stringify(offsets)} outside the ${dataLength} data bytes`);
    }
    const [, ArrayType, size] = DTYPES[dtype];
    if (offsets[1] - offsets[0] !== elementCount(shape) * size) {
      throw new RangeError(`${what}: tensor '${name}' of shape [${shape}] ${dtype} needs ${elementCount(shape) * size} bytes, its offsets span ${offsets[1] - offsets[0]}`);
    }
    const copy = new Uint8Array(view.subarray(start + offsets[0], start + offsets[1])); // a copy (Node's Buffer.slice is not)
    tensors.set(name, { name, dtype, shape: [...shape], data: new ArrayType(copy.buffer) });
  }
  for (const [key, value] of Object.entries(metadata)) {
    if (typeof value !== 'string') throw new TypeError(`${what}: __metadata__ value '${key}' is not a string`);
  }
  return { tensors, metadata };
}

/**
 * Serialize tensors (in the order given) and string metadata as a safetensors file.
 * @param {Iterable<NamedTensor>} tensors
 * @param {Record<string, string>} [metadata]
 * @returns {Uint8Array}  the whole file
 * @throws {TypeError | RangeError} for an unsupported dtype, a duplicate name or data that does not match its shape
 */
export function serializeSafetensors(tensors, metadata = {}) {
  requireLittleEndian();
  /** @type {Record<string, unknown>} */
  const header = {};
  if (Object.keys(metadata).length) header.__metadata__ = metadata;
  /** @type {Uint8Array[]} */
  const chunks = [];
  let offset = 0;
  for (const tensor of tensors) {
    const entry = DTYPES[tensor.dtype];
    if (!entry) throw new TypeError(`tensor '${tensor.name}': unsupported dtype '${tensor.dtype}'; supported: ${SUPPORTED_DTYPES.join(', ')}`);
    if (tensor.name === '__metadata__' || Object.hasOwn(header, tensor.name)) {
      throw new TypeError(`tensor name '${tensor.name}' is reserved or used twice`);
    }
    const bytes = new Uint8Array(tensor.data.buffer, tensor.data.byteOffset, tensor.data.byteLength);
    if (bytes.byteLength !== elementCount(tensor.shape) * entry[2]) {
      throw new RangeError(`tensor '${tensor.name}': ${bytes.byteLength} bytes of data for shape [${tensor.shape}] ${tensor.dtype}`);
    }
    header[tensor.name] = { dtype: entry[0], shape: tensor.shape, data_offsets: [offset, offset + bytes.byteLength] };
    chunks.push(bytes);
    offset += bytes.byteLength;
  }
  const encoded = new TextEncoder().encode(JSON.stringify(header));
  const padded = Math.ceil(encoded.byteLength / 8) * 8; // spaces up to a multiple of 8, as the reference writer does
  const out = new Uint8Array(8 + padded + offset);
  new DataView(out.buffer).setBigUint64(0, BigInt(padded), true);
  out.set(encoded, 8);
  out.fill(0x20, 8 + encoded.byteLength, 8 + padded);
  let at = 8 + padded;
  for (const chunk of chunks) {
    out.set(chunk, at);
    at += chunk.byteLength;
  }
  return out;
}

function requireLittleEndian() {
  if (!LITTLE_ENDIAN) throw new RangeError('safetensors data is little-endian; this platform is big-endian');
}
