// node --test: the safetensors reader and writer (round trip of every dtype, refusals).
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { parseSafetensors, serializeSafetensors, SUPPORTED_DTYPES } from '../src/safetensors.mjs';

const ARRAYS = {
  float32: Float32Array.of(1.5, -2, 3.25, 0),
  float64: Float64Array.of(1e-300, -2, 3, 4),
  float16: Uint16Array.of(0x3c00, 0xc000, 0, 1),
  int8: Int8Array.of(-128, 0, 1, 127),
  uint8: Uint8Array.of(0, 1, 2, 255),
  int16: Int16Array.of(-32768, 0, 1, 32767),
  uint16: Uint16Array.of(0, 1, 2, 65535),
  int32: Int32Array.of(-5, 0, 7, 2 ** 31 - 1),
  uint32: Uint32Array.of(0, 1, 2, 2 ** 32 - 1),
  int64: BigInt64Array.of(-(2n ** 63n), 0n, 1n, 2n ** 63n - 1n),
  uint64: BigUint64Array.of(0n, 1n, 2n, 2n ** 64n - 1n),
  bool: Uint8Array.of(0, 1, 1, 0),
};

test('every dtype round-trips with its shape, order and metadata', () => {
  assert.deepEqual([...SUPPORTED_DTYPES].sort(), Object.keys(ARRAYS).sort());
  const tensors = Object.entries(ARRAYS).map(([dtype, data]) => ({ name: `t_${dtype}`, dtype: /** @type {any} */ (dtype), shape: [2, 2], data }));
  const bytes = serializeSafetensors(tensors, { note: 'kept' });
  const parsed = parseSafetensors(bytes, 'round trip');
  assert.deepEqual([...parsed.tensors.keys()], tensors.map((t) => t.name));
  for (const tensor of tensors) {
    const back = /** @type {any} */ (parsed.tensors.get(tensor.name));
    assert.equal(back.dtype, tensor.dtype);
    assert.deepEqual(back.shape, [2, 2]);
    assert.deepEqual([...back.data], [...tensor.data]);
  }
  assert.equal(parsed.metadata.note, 'kept');
});

test('a truncated file is refused, naming the file', () => {
  const bytes = serializeSafetensors([{ name: 'w', dtype: 'float32', shape: [4], data: Float32Array.of(1, 2, 3, 4) }]);
  assert.throws(() => parseSafetensors(bytes.subarray(0, bytes.length - 3), 'cut.safetensors'), /cut\.safetensors/);
  assert.throws(() => parseSafetensors(new Uint8Array(4), 'tiny.safetensors'), /tiny\.safetensors/);
});
