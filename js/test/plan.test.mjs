// node --test: the plan file's batches and learning rates (src/plan.mjs), as onnxblocks-train and demo/plan.html read them.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { planBatches, planRates } from '../src/plan.mjs';

const tensor = (/** @type {string} */ name) => ({ name, dtype: /** @type {const} */ ('float32'), shape: [1], data: Float32Array.of(1) });

test('tensors group into batches by split and index, inputs by the rest of the name', () => {
  const names = ['train/1/x', 'train/0/x', 'train/0/y', 'train/1/y', 'eval/0/x', 'train/0/sub/name'];
  const batches = planBatches(new Map(names.map((n) => [n, tensor(n)])), 'train');
  assert.equal(batches.length, 2);
  assert.deepEqual(Object.keys(batches[0]).sort(), ['sub/name', 'x', 'y']);
  assert.equal(batches[1].x.name, 'train/1/x');
  assert.equal(planBatches(new Map(names.map((n) => [n, tensor(n)])), 'eval').length, 1);
});

test('a missing batch or an index that is not a number is named', () => {
  assert.throws(() => planBatches(new Map([['train/1/x', tensor('train/1/x')]]), 'train'), /train batch 0 is missing/);
  assert.throws(() => planBatches(new Map([['train/a/x', tensor('train/a/x')]]), 'train'), /'a' is not a batch index/);
});

test('learning rates: a JSON list of numbers, or null without one', () => {
  assert.deepEqual(planRates({ learning_rates: '[0.1, 0.05]' }), [0.1, 0.05]);
  assert.equal(planRates({}), null);
  assert.throws(() => planRates({ learning_rates: '{"a": 1}' }), /JSON list of finite numbers/);
  assert.throws(() => planRates({ learning_rates: '[0.1, "x"]' }), /JSON list of finite numbers/);
});
