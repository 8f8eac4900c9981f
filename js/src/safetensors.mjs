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

/** Most dimensions a tensor may have (numpy's limit); no dimension may reach 2**62. */
const MAX_RANK = 64;
const MAX_DIM = 2 ** 62;
const ENTRY_KEYS = new Set(['dtype', 'shape', 'data_offsets']);

/**
 * Parse a safetensors file, trusting nothing in it (the rules of onnxblocks' Python reader,
 * `onnxblocks/web/safetensors.py`): the header is a JSON object with no repeated key; each
 * tensor has a supported dtype, a shape of at most 64 non-negative integers, and
 * `data_offsets` spanning exactly the bytes its dtype and shape need; sorted by offset, the
 * tensors tile the data bytes (each starts where the one before ends, the last ends at the
 * end of the file), so no tensor overlaps or aliases another.
 * @param {ArrayBuffer | Uint8Array} bytes  the whole file
 * @param {string} [what]  how to name the file in errors
 * @returns {{tensors: Map<string, NamedTensor>, metadata: Record<string, string>}}
 *   tensors in file order; each tensor's data is a copy (aligned, independent of `bytes`)
 * @throws {RangeError | SyntaxError | TypeError} on a malformed file or an unsupported dtype (the message starts with `what`)
 */
export function parseSafetensors(bytes, what = 'safetensors file') {
  requireLittleEndian();
  const view = bytes instanceof Uint8Array ? bytes : new Uint8Array(bytes);
  if (view.byteLength < 8) throw new RangeError(`${what}: ${view.byteLength} bytes, too short for a safetensors header`);
  const headerLength = new DataView(view.buffer, view.byteOffset, 8).getBigUint64(0, true);
  if (headerLength > BigInt(view.byteLength - 8)) {
    throw new RangeError(`${what}: the header claims ${headerLength} bytes but the file has ${view.byteLength - 8} after the length: it is truncated or not a safetensors file`);
  }
  const start = 8 + Number(headerLength);
  let header;
  let text;
  try {
    text = new TextDecoder('utf-8', { fatal: true }).decode(view.subarray(8, start));
    header = JSON.parse(text);
  } catch (error) {
    throw new SyntaxError(`${what}: the header is not UTF-8 JSON (${/** @type {Error} */ (error).message})`);
  }
  if (header === null || typeof header !== 'object' || Array.isArray(header)) {
    throw new SyntaxError(`${what}: the header must be a JSON object`);
  }
  const hidden = hiddenProblem(text);
  if (hidden !== null) throw new SyntaxError(`${what}: the header holds ${hidden}`);
  const { __metadata__: rawMetadata = null, ...entries } = header;
  const metadata = rawMetadata ?? {};
  if (typeof metadata !== 'object' || Array.isArray(metadata) || !Object.values(metadata).every((v) => typeof v === 'string')) {
    throw new TypeError(`${what}: __metadata__ must be an object of strings`);
  }
  const dataLength = view.byteLength - start;
  /** @type {{name: string, dtype: DType, shape: number[], begin: number, end: number}[]} */
  const parsed = [];
  for (const [name, entry] of Object.entries(entries)) {
    if (entry === null || typeof entry !== 'object' || Array.isArray(entry)) throw new TypeError(`${what}: the header entry of '${name}' is not an object`);
    const extra = Object.keys(entry).filter((key) => !ENTRY_KEYS.has(key));
    if (extra.length) throw new TypeError(`${what}: the header entry of '${name}' has unknown fields ${JSON.stringify(extra)}`);
    const dtype = typeof entry.dtype === 'string' && Object.hasOwn(FROM_SAFETENSORS, entry.dtype) ? FROM_SAFETENSORS[entry.dtype] : undefined;
    if (!dtype) throw new TypeError(`${what}: tensor '${name}' has dtype ${JSON.stringify(entry.dtype)}; supported: ${Object.keys(FROM_SAFETENSORS).join(', ')}`);
    const { shape, data_offsets: offsets } = entry;
    if (!Array.isArray(shape) || shape.length > MAX_RANK || !shape.every((d) => Number.isInteger(d) && d >= 0 && d < MAX_DIM)) {
      throw new TypeError(`${what}: tensor '${name}' has shape ${JSON.stringify(shape)}; expected at most ${MAX_RANK} integers in [0, 2**62)`);
    }
    if (!Array.isArray(offsets) || offsets.length !== 2 || !offsets.every((o) => Number.isSafeInteger(o) && o >= 0)) {
      throw new RangeError(`${what}: tensor '${name}' has data_offsets ${JSON.stringify(offsets)}; expected [begin, end], two integers >= 0`);
    }
    const [begin, end] = offsets;
    if (end < begin) {
      throw new RangeError(`${what}: tensor '${name}' has data_offsets ${JSON.stringify(offsets)}, which end before they begin`);
    }
    if (end > dataLength) { // each tensor inside the data before tiling: the one moved out is named, not its neighbour
      throw new RangeError(`${what}: tensor '${name}' spans data bytes [${begin}, ${end}) but the file has ${dataLength} data bytes: its span lies outside the data (the file is truncated, or its header is corrupted)`);
    }
    const needed = shape.reduce((a, d) => a * BigInt(d), 1n) * BigInt(DTYPES[dtype][2]); // BigInt: no overflow
    if (BigInt(offsets[1] - offsets[0]) !== needed) {
      throw new RangeError(`${what}: tensor '${name}' of shape [${shape}] ${dtype} needs ${needed} bytes, its data_offsets span ${offsets[1] - offsets[0]}`);
    }
    parsed.push({ name, dtype, shape: [...shape], begin: offsets[0], end: offsets[1] });
  }
  // overlaps first: they name both tensors that claim the same bytes; a gap names only its neighbours
  /** @type {string[]} */
  const overlaps = [];
  /** @type {string[]} */
  const gaps = [];
  let at = 0;
  /** @type {{name: string, begin: number, end: number} | null} */
  let last = null; // the tensor reaching furthest so far
  for (const entry of [...parsed].sort((a, b) => a.begin - b.begin || a.end - b.end)) {
    if (entry.begin < at && last !== null) {
      overlaps.push(`tensor '${entry.name}' (data bytes [${entry.begin}, ${entry.end})) overlaps '${last.name}' (data bytes [${last.begin}, ${last.end})): no two tensors may share bytes`);
    } else if (entry.begin > at) {
      gaps.push(`data bytes [${at}, ${entry.begin}) ${last !== null ? `after '${last.name}' ` : ''}and before '${entry.name}' belong to no tensor`);
    }
    if (last === null || entry.end >= at) {
      at = entry.end;
      last = entry;
    }
  }
  if (at < dataLength) gaps.push(`data bytes [${at}, ${dataLength})${last !== null ? ` after '${last.name}', the last tensor,` : ''} belong to no tensor`);
  if (overlaps.length || gaps.length) throw new RangeError(`${what}: ${[...overlaps, ...gaps][0]}`);
  /** @type {Map<string, NamedTensor>} */
  const tensors = new Map();
  for (const { name, dtype, shape, begin, end } of parsed) {
    const copy = new Uint8Array(view.subarray(start + begin, start + end)); // a copy (Node's Buffer.slice is not)
    tensors.set(name, { name, dtype, shape, data: new DTYPES[dtype][1](copy.buffer) });
  }
  return { tensors, metadata };
}

/**
 * What `JSON.parse` hides in a header: the first key an object holds twice (it keeps the last
 * silently), or a number written as a float (`48.0`, `1e2`) in a `shape` or `data_offsets`
 * (it reads them as integers). Null when there is neither.
 * @param {string} text  valid JSON
 * @returns {string | null}  what is wrong, for the error message
 */
function hiddenProblem(text) {
  /** @type {{keys: Set<string> | null, expectKey: boolean, key: string | null}[]} */
  const stack = [];
  /** @type {string | null} */
  let lastKey = null;
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    const top = stack[stack.length - 1];
    if (c === '"') {
      let j = i + 1;
      while (text[j] !== '"') j += text[j] === '\\' ? 2 : 1;
      if (top?.keys && top.expectKey) {
        const key = JSON.parse(text.slice(i, j + 1));
        if (top.keys.has(key)) return `'${key}' twice`; // quoted as Python's reader quotes it
        top.keys.add(key);
        top.expectKey = false;
        lastKey = key;
      }
      i = j;
    } else if (c === '{' || c === '[') {
      stack.push({ keys: c === '{' ? new Set() : null, expectKey: c === '{', key: lastKey });
    } else if (c === '}' || c === ']') {
      stack.pop();
    } else if (c === ',' && top?.keys) {
      top.expectKey = true;
    } else if (c === '-' || (c >= '0' && c <= '9')) {
      const token = /^-?[0-9.eE+-]+/.exec(text.slice(i))?.[0] ?? c;
      if (!top?.keys && (top?.key === 'shape' || top?.key === 'data_offsets') && /[.eE]/.test(token)) {
        const tensor = stack[stack.length - 2]?.key; // the entry holding this array: the tensor's name
        return `${token} in the ${top.key} of tensor '${tensor}', where integers belong`;
      }
      i += token.length - 1;
    }
  }
  return null;
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
