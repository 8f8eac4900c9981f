// Reading numpy's .npz files (a zip of .npy arrays, as numpy.savez and savez_compressed write them).
//
// A federated client's local data comes as the `.npz` of `onnxblocks train` (arrays by the model's input
// names, or arr_0, arr_1, ... in input order). This module imports nothing: deflated members need an
// `inflate` function (Node: zlib's inflateRawSync; browsers: DecompressionStream('deflate-raw')).

/** @typedef {import('./safetensors.mjs').NamedTensor} NamedTensor */
/** @typedef {(bytes: Uint8Array) => Promise<Uint8Array> | Uint8Array} Inflate  raw deflate to bytes */

const DTYPES = /** @type {Record<string, [string, any]>} */ ({
  f4: ['float32', Float32Array],
  f8: ['float64', Float64Array],
  i8: ['int64', BigInt64Array],
  i4: ['int32', Int32Array],
  i2: ['int16', Int16Array],
  i1: ['int8', Int8Array],
  u1: ['uint8', Uint8Array],
  b1: ['bool', Uint8Array],
});

/**
 * The arrays of an `.npz` file, by member name without `.npy`.
 * @param {ArrayBuffer | Uint8Array} source
 * @param {{what?: string, inflate?: Inflate}} [options]
 * @returns {Promise<Map<string, NamedTensor>>}
 * @throws {RangeError | TypeError} for a file that is not an .npz of plain little-endian arrays
 */
export async function parseNpz(source, { what = '.npz file', inflate } = {}) {
  // a plain view: a Node Buffer's slice() shares memory where a Uint8Array's copies
  const bytes = source instanceof Uint8Array ? new Uint8Array(source.buffer, source.byteOffset, source.byteLength) : new Uint8Array(source);
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  let end = -1;
  for (let i = bytes.length - 22; i >= Math.max(0, bytes.length - 22 - 65535); i--) {
    if (view.getUint32(i, true) === 0x06054b50) {
      end = i;
      break;
    }
  }
  if (end < 0) throw new TypeError(`${what}: not a zip file (no end of central directory); save it with numpy.savez`);
  const count = view.getUint16(end + 10, true);
  let at = view.getUint32(end + 16, true);
  /** @type {Map<string, NamedTensor>} */
  const out = new Map();
  const decoder = new TextDecoder();
  for (let n = 0; n < count; n++) {
    if (at + 46 > bytes.length || view.getUint32(at, true) !== 0x02014b50) throw new RangeError(`${what}: central directory entry ${n} is malformed`);
    const method = view.getUint16(at + 10, true);
    let size = view.getUint32(at + 20, true);
    const nameLength = view.getUint16(at + 28, true);
    const extraLength = view.getUint16(at + 30, true);
    const commentLength = view.getUint16(at + 32, true);
    let offset = view.getUint32(at + 42, true);
    const name = decoder.decode(bytes.subarray(at + 46, at + 46 + nameLength));
    // zip64: the sizes and offset that do not fit 32 bits are in extra field 0x0001, in this order
    const uncompressed = view.getUint32(at + 24, true);
    let extra = at + 46 + nameLength;
    const extraEnd = extra + extraLength;
    while (extra + 4 <= extraEnd) {
      const id = view.getUint16(extra, true);
      const length = view.getUint16(extra + 2, true);
      if (id === 0x0001) {
        let field = extra + 4;
        const next = () => {
          const value = Number(view.getBigUint64(field, true));
          field += 8;
          return value;
        };
        if (uncompressed === 0xffffffff) next();
        if (size === 0xffffffff) size = next();
        if (offset === 0xffffffff) offset = next();
      }
      extra += 4 + length;
    }
    at = extraEnd + commentLength;
    if (offset + 30 > bytes.length || view.getUint32(offset, true) !== 0x04034b50) throw new RangeError(`${what}: member '${name}' has no local header`);
    const start = offset + 30 + view.getUint16(offset + 26, true) + view.getUint16(offset + 28, true);
    if (start + size > bytes.length) throw new RangeError(`${what}: member '${name}' runs past the end of the file`);
    let data = bytes.subarray(start, start + size);
    if (method === 8) {
      if (!inflate) throw new TypeError(`${what}: member '${name}' is compressed and no inflate function was given`);
      data = await inflate(data);
    } else if (method !== 0) {
      throw new TypeError(`${what}: member '${name}' uses zip method ${method}; numpy writes 0 (stored) or 8 (deflate)`);
    }
    const key = name.endsWith('.npy') ? name.slice(0, -4) : name;
    out.set(key, parseNpy(data, key, `${what} '${name}'`));
  }
  return out;
}

/**
 * One `.npy` array (format 1.0 to 3.0, little-endian, C order).
 * @param {Uint8Array} bytes
 * @param {string} name
 * @param {string} what
 * @returns {NamedTensor}
 */
export function parseNpy(bytes, name, what = name) {
  const magic = [0x93, 0x4e, 0x55, 0x4d, 0x50, 0x59];
  if (bytes.length < 10 || magic.some((b, i) => bytes[i] !== b)) throw new TypeError(`${what}: not a .npy array`);
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const major = bytes[6];
  const headerLength = major === 1 ? view.getUint16(8, true) : view.getUint32(8, true);
  const headerStart = major === 1 ? 10 : 12;
  const header = new TextDecoder().decode(bytes.subarray(headerStart, headerStart + headerLength));
  const descr = /'descr':\s*'([<>|=])([a-z])(\d+)'/.exec(header);
  const shapeText = /'shape':\s*\(([^)]*)\)/.exec(header);
  if (!descr || !shapeText) throw new TypeError(`${what}: unreadable .npy header ${header.slice(0, 80)}`);
  if (/'fortran_order':\s*True/.test(header)) throw new TypeError(`${what}: Fortran-ordered arrays are not read; save np.ascontiguousarray(a)`);
  if (descr[1] === '>') throw new TypeError(`${what}: big-endian arrays are not read`);
  const entry = DTYPES[descr[2] + descr[3]];
  if (!entry) throw new TypeError(`${what}: dtype '${descr[2]}${descr[3]}' is not read (float32/64, int8-64, uint8, bool are)`);
  const shape = shapeText[1].split(',').map((s) => s.trim()).filter(Boolean).map(Number);
  const count = shape.reduce((a, b) => a * b, 1);
  const [dtype, Typed] = entry;
  const start = headerStart + headerLength;
  if (bytes.length - start !== count * Typed.BYTES_PER_ELEMENT) throw new RangeError(`${what}: ${bytes.length - start} data bytes for shape [${shape}] of ${dtype}`);
  const copy = Uint8Array.prototype.slice.call(bytes, start, start + count * Typed.BYTES_PER_ELEMENT);
  return { name, dtype: /** @type {any} */ (dtype), shape, data: new Typed(copy.buffer, 0, count) };
}
