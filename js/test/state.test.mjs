// node --test: the training state file (params.safetensors) written and read back.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { serializeSafetensors } from '../src/safetensors.mjs';
import { momentNames, parseState, serializeState, STATE_FORMAT } from '../src/state.mjs';

/** @returns {import('../src/state.mjs').TrainingState} */
function state() {
  const w = { name: 'w', dtype: /** @type {const} */ ('float32'), shape: [2], data: Float32Array.of(1, 2) };
  const [m, v] = momentNames('w');
  return {
    tensors: new Map(/** @type {[string, import('../src/safetensors.mjs').NamedTensor][]} */ ([
      ['w', w],
      [m, { ...w, name: m, data: Float32Array.of(0.1, 0.2) }],
      [v, { ...w, name: v, data: Float32Array.of(0.01, 0.02) }],
      ['frozen', { name: 'frozen', dtype: 'int64', shape: [1], data: BigInt64Array.of(7n) }],
    ])),
    trainable: ['w'],
    frozen: ['frozen'],
    step: 12,
    learningRate: 0.005,
    extra: { epoch: '3' },
  };
}

test('a state round-trips: tensors, names, step, learning rate, other metadata', () => {
  const back = parseState(serializeState(state()), 'state');
  assert.deepEqual(back.trainable, ['w']);
  assert.deepEqual(back.frozen, ['frozen']);
  assert.equal(back.step, 12);
  assert.equal(back.learningRate, 0.005);
  assert.deepEqual(back.extra, { epoch: '3' });
  assert.deepEqual([...back.tensors.keys()], ['w', 'frozen', 'w.exp_avg', 'w.exp_avg_sq']);
  assert.deepEqual([.../** @type {any} */ (back.tensors.get('w.exp_avg_sq')).data], [...Float32Array.of(0.01, 0.02)]);
});

test('a safetensors file of another format is refused with what to do', () => {
  const other = serializeSafetensors([{ name: 'w', dtype: 'float32', shape: [1], data: Float32Array.of(1) }], { format: 'pt' });
  assert.throws(() => parseState(other, 'model.safetensors'), (error) => error instanceof TypeError && error.message.includes(STATE_FORMAT) && error.message.includes('write_state'));
});
