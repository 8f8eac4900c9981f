// node --test: filling the inference-model template with trained parameters.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { fillInferenceModel, parseLayout, TEMPLATE_FORMAT } from '../src/inference.mjs';

const template = new Uint8Array(64).map((_, i) => i);
/** @type {import('../src/inference.mjs').TemplateLayout} */
const layout = {
  format: TEMPLATE_FORMAT,
  model: 'inference_model.onnx',
  inputs: ['x'],
  outputs: ['y'],
  tensors: [
    { name: 'w', dtype: 'float32', shape: [2], offset: 8, length: 8 },
    { name: 'b', dtype: 'float32', shape: [1], offset: 40, length: 4 },
  ],
};
const w = { name: 'w', dtype: /** @type {const} */ ('float32'), shape: [2], data: Float32Array.of(1.5, -2) };
const b = { name: 'b', dtype: /** @type {const} */ ('float32'), shape: [1], data: Float32Array.of(0.25) };

test('the parameters land at their offsets, little-endian; nothing else changes', () => {
  const filled = fillInferenceModel(template, layout, new Map([['w', w], ['b', b]]));
  const view = new DataView(filled.buffer);
  assert.equal(view.getFloat32(8, true), 1.5);
  assert.equal(view.getFloat32(12, true), -2);
  assert.equal(view.getFloat32(40, true), 0.25);
  const untouched = [...filled].filter((v, i) => (i < 8 || (i >= 16 && i < 40) || i >= 44) && v !== i);
  assert.deepEqual(untouched, []);
  assert.equal(template[8], 8, 'the template itself is not modified');
});

test('a parameter of a subarray view is copied from its own bytes', () => {
  const big = Float32Array.of(9, 9, 1.5, -2, 9);
  const filled = fillInferenceModel(template, layout, new Map([['w', { ...w, data: big.subarray(2, 4) }], ['b', b]]));
  assert.equal(new DataView(filled.buffer).getFloat32(8, true), 1.5);
});

test('missing, mismatched and out-of-range parameters are refused by name', () => {
  assert.throws(() => fillInferenceModel(template, layout, new Map([['w', w]])), /no value for parameter 'b'/);
  assert.throws(() => fillInferenceModel(template, layout, new Map([['w', { ...w, shape: [1, 2] }], ['b', b]])), /parameter 'w' is float32 \[1,2\]/);
  const outside = { ...layout, tensors: [{ ...layout.tensors[0], offset: 60 }] };
  assert.throws(() => parseLayout(outside, template.length), /tensor 'w' lies at bytes \[60, 68\) outside the 64-byte model/);
  assert.throws(() => parseLayout({ format: 'other' }, 10), /write_inference_template/);
});
