// What a page needs to know of an ONNX model's bytes without decoding its graph: its metadata and the
// external data files its initializers name. A minimal protobuf walk over the fields it needs (ModelProto:
// graph = 7, metadata_props = 14; GraphProto: initializer = 5; TensorProto: external_data = 13,
// data_location = 14; StringStringEntryProto: key = 1, value = 2); every other field is skipped by its wire type.

/**
 * Read the `metadata_props` of an ONNX model's bytes without decoding its graph (ModelProto field 14:
 * StringStringEntryProto {key = 1, value = 2}); every other field is skipped by its wire type.
 * @param {Uint8Array} bytes  an `.onnx` file's bytes
 * @returns {Record<string, string>}
 * @throws {RangeError} on bytes that are not a protobuf message
 */
export function modelMetadata(bytes) {
  /** @type {Record<string, string>} */
  const out = {};
  const decoder = new TextDecoder();
  for (const [field, value] of fields(bytes, 0, bytes.length)) {
    if (field !== 14 || !(value instanceof Uint8Array)) continue;
    let key = '';
    let text = '';
    for (const [inner, part] of fields(value, 0, value.length)) {
      if (inner === 1 && part instanceof Uint8Array) key = decoder.decode(part);
      if (inner === 2 && part instanceof Uint8Array) text = decoder.decode(part);
    }
    out[key] = text;
  }
  return out;
}

/**
 * The fields of a protobuf message: `[field number, bytes (length-delimited) | null]`.
 * @param {Uint8Array} bytes
 * @param {number} begin
 * @param {number} end
 * @returns {Generator<[number, Uint8Array | null]>}
 */
function* fields(bytes, begin, end) {
  let at = begin;
  const varint = () => {
    let result = 0;
    let scale = 1;
    for (let i = 0; i < 10; i++) {
      if (at >= end) throw new RangeError('model bytes: truncated varint (not an ONNX model?)');
      const byte = bytes[at++];
      result += (byte & 0x7f) * scale;
      if (byte < 0x80) return result;
      scale *= 128;
    }
    throw new RangeError('model bytes: varint too long (not an ONNX model?)');
  };
  while (at < end) {
    const tag = varint();
    const field = Math.floor(tag / 8);
    const wire = tag % 8;
    if (wire === 0) {
      varint();
      yield [field, null];
    } else if (wire === 1 || wire === 5) {
      at += wire === 1 ? 8 : 4;
      yield [field, null];
    } else if (wire === 2) {
      const length = varint();
      if (at + length > end) throw new RangeError(`model bytes: field ${field} runs past the end (truncated model?)`);
      yield [field, bytes.subarray(at, at + length)];
      at += length;
    } else {
      throw new RangeError(`model bytes: unsupported wire type ${wire} (not an ONNX model?)`);
    }
  }
  if (at !== end) throw new RangeError('model bytes: the last field runs past the end (truncated model?)');
}

/**
 * The external data files the model's initializers name (their `location` entries), in order, without repeats.
 * @param {Uint8Array} bytes  an `.onnx` file's bytes
 * @returns {string[]}
 * @throws {RangeError} on bytes that are not a protobuf message
 */
export function externalDataFiles(bytes) {
  /** @type {Set<string>} */
  const out = new Set();
  const decoder = new TextDecoder();
  for (const [field, graph] of fields(bytes, 0, bytes.length)) {
    if (field !== 7 || !(graph instanceof Uint8Array)) continue;
    for (const [inner, tensor] of fields(graph, 0, graph.length)) {
      if (inner !== 5 || !(tensor instanceof Uint8Array)) continue;
      for (const [key, entry] of fields(tensor, 0, tensor.length)) {
        if (key !== 13 || !(entry instanceof Uint8Array)) continue;
        const pair = new Map([...fields(entry, 0, entry.length)].map(([k, v]) => [k, v instanceof Uint8Array ? decoder.decode(v) : '']));
        if (pair.get(1) === 'location' && pair.get(2)) out.add(/** @type {string} */ (pair.get(2)));
      }
    }
  }
  return [...out];
}
