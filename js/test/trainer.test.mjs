// node --test: the Trainer's bookkeeping over a fake ONNX Runtime (step counter, feeds, moments, state, refusals;
// the flat step model's one state tensor).
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { FLAT_STATE, Trainer, flatLayout, frozenBaseOptions } from '../src/trainer.mjs';

class Tensor {
  /** @param {string} type @param {any} data @param {number[]} dims */
  constructor(type, data, dims) {
    Object.assign(this, { type, data, dims });
  }

  async getData() {
    return /** @type {any} */ (this).data;
  }
}

/** A step model: w.out = w - lr * x * step, moments + 1; loss = sum(w); one feed log per run. */
function fakeOrt() {
  /** @type {Record<string, any>[]} */
  const runs = [];
  const step = {
    inputNames: ['x', 'learning_rate', 'step', 'w', 'w.exp_avg', 'w.exp_avg_sq'],
    outputNames: ['loss', 'w.out', 'w.exp_avg.out', 'w.exp_avg_sq.out'],
    inputMetadata: [{ name: 'w', isTensor: true, type: 'float32' }],
    /** @param {Record<string, any>} feeds */
    async run(feeds) {
      runs.push(feeds);
      const lr = feeds.learning_rate.data[0];
      const n = Number(feeds.step.data[0]);
      const w = feeds.w.data.map((/** @type {number} */ v, /** @type {number} */ i) => v - lr * feeds.x.data[i] * n);
      const plus = (/** @type {string} */ name) => new Tensor('float32', feeds[name].data.map((/** @type {number} */ v) => v + 1), [2]);
      return {
        loss: new Tensor('float32', Float32Array.of(feeds.w.data[0] + feeds.w.data[1]), []),
        'w.out': new Tensor('float32', Float32Array.from(w), [2]),
        'w.exp_avg.out': plus('w.exp_avg'),
        'w.exp_avg_sq.out': plus('w.exp_avg_sq'),
      };
    },
    async release() {},
  };
  const ort = { Tensor, InferenceSession: { create: async () => step } };
  return { ort, runs };
}

const initial = () => ({
  tensors: new Map([['w', { name: 'w', dtype: /** @type {const} */ ('float32'), shape: [2], data: Float32Array.of(1, 2) }]]),
  trainable: ['w'],
  frozen: [],
  step: 4,
  learningRate: null,
  extra: {},
});

test('steps feed the next step number, the learning rate and the updated values', async () => {
  const { ort, runs } = fakeOrt();
  const trainer = await Trainer.create(/** @type {any} */ (ort), { stepModel: 'step.onnx', state: initial() });
  assert.deepEqual(trainer.inputNames, ['x']);
  assert.equal(trainer.momentsPerParameter, 2);
  const x = { dtype: /** @type {const} */ ('float32'), shape: [2], data: Float32Array.of(1, 1) };
  const first = await trainer.trainStep([x], 0.5);
  const second = await trainer.trainStep({ x }, 0.25);
  assert.equal(first.loss, 3);
  assert.deepEqual(runs.map((f) => Number(f.step.data[0])), [5, 6]);
  assert.deepEqual([...runs[1].w.data], [1 - 0.5 * 5, 2 - 0.5 * 5]);
  assert.deepEqual([...runs[1]['w.exp_avg'].data], [1, 1], 'missing moments start at zero, then are fed back');
  assert.equal(second.loss, 1 - 2.5 + 2 - 2.5);
  const state = await trainer.state();
  assert.equal(state.step, 6);
  assert.equal(state.learningRate, 0.25);
  assert.deepEqual([.../** @type {any} */ (state.tensors.get('w')).data], [1 - 2.5 - 1.5, 2 - 2.5 - 1.5]);
  assert.deepEqual([.../** @type {any} */ (state.tensors.get('w.exp_avg_sq')).data], [2, 2]);
});

test('bad learning rates and inputs are refused, naming what is wrong', async () => {
  const { ort } = fakeOrt();
  const trainer = await Trainer.create(/** @type {any} */ (ort), { stepModel: 'step.onnx', state: initial() });
  const x = { dtype: /** @type {const} */ ('float32'), shape: [2], data: Float32Array.of(1, 1) };
  await assert.rejects(trainer.trainStep([x], Number.NaN), TypeError);
  await assert.rejects(trainer.trainStep([x, x], 0.1), /trainStep takes 1 inputs \(x\), got 2/);
  await assert.rejects(trainer.trainStep(/** @type {any} */ ({ x, y: x }), 0.1), /unknown input\(s\) y/);
  const wrong = { ...initial(), trainable: ['v'], tensors: new Map([['v', /** @type {any} */ (initial().tensors.get('w'))]]) };
  await assert.rejects(Trainer.create(/** @type {any} */ (ort), { stepModel: 'step.onnx', state: wrong }), /trainable parameter\(s\) v/);
});

test('frozenBaseOptions turns off folding, pre-packing and the memory pattern, and keeps what the caller set', () => {
  assert.deepEqual(frozenBaseOptions(), {
    enableMemPattern: false,
    extra: { session: { disable_prepacking: '1' }, optimization: { disable_specified_optimizers: 'ConstantFolding' } },
  });
  const mine = frozenBaseOptions({
    executionProviders: ['wasm'],
    enableMemPattern: true,
    extra: { session: { intra_op: 1 }, optimization: { disable_specified_optimizers: 'NoneOfThem' } },
  });
  assert.deepEqual(mine, {
    executionProviders: ['wasm'],
    enableMemPattern: true,
    extra: {
      session: { disable_prepacking: '1', intra_op: 1 },
      optimization: { disable_specified_optimizers: 'NoneOfThem' },
    },
  });
});

/**
 * The fake step model's flat form: the state `[w, w.exp_avg, w.exp_avg_sq]` as one tensor `onnxblocks.flat_state`,
 * the same arithmetic.
 */
function fakeFlatOrt() {
  const { ort, runs: inner } = fakeOrt();
  /** @type {Record<string, any>[]} */
  const runs = [];
  const names = ['w', 'w.exp_avg', 'w.exp_avg_sq'];
  const step = {
    inputNames: ['x', 'learning_rate', 'step', FLAT_STATE],
    outputNames: ['loss', `${FLAT_STATE}.out`],
    inputMetadata: [],
    /** @param {Record<string, any>} feeds */
    async run(feeds) {
      runs.push(feeds);
      const flat = feeds[FLAT_STATE].data;
      /** @type {Record<string, any>} */
      const split = Object.fromEntries(names.map((n, i) => [n, new Tensor('float32', flat.slice(2 * i, 2 * i + 2), [2])]));
      const out = /** @type {Record<string, any>} */ (await (await ort.InferenceSession.create()).run({ ...feeds, ...split }));
      const joined = new Float32Array(6);
      names.forEach((n, i) => joined.set(out[`${n}.out`].data, 2 * i));
      return { loss: out.loss, [`${FLAT_STATE}.out`]: new Tensor('float32', joined, [6]) };
    },
    async release() {},
  };
  return { ort: { Tensor, InferenceSession: { create: async () => step } }, runs, inner };
}

/** @type {import('../src/trainer.mjs').FlatLayout} */
const LAYOUT = [['w', 0, [2]], ['w.exp_avg', 2, [2]], ['w.exp_avg_sq', 4, [2]]];

test('a flat step model gets one state tensor per run, and the state is cut from it when read', async () => {
  const x = { dtype: /** @type {const} */ ('float32'), shape: [2], data: Float32Array.of(1, 1) };
  const { ort: plainOrt } = fakeOrt();
  const plain = await Trainer.create(/** @type {any} */ (plainOrt), { stepModel: 'step.onnx', state: initial() });
  const { ort, runs } = fakeFlatOrt();
  const trainer = await Trainer.create(/** @type {any} */ (ort), { stepModel: 'flat.onnx', state: initial(), flatLayout: LAYOUT });
  assert.deepEqual(trainer.inputNames, ['x']);
  assert.deepEqual(trainer.outputNames, ['loss']);
  assert.equal(trainer.momentsPerParameter, 2);
  for (const [i, rate] of [0.5, 0.25, 0.125].entries()) {
    assert.equal((await trainer.trainStep([x], rate)).loss, (await plain.trainStep([x], rate)).loss, `step ${i}`);
  }
  assert.deepEqual(Object.keys(runs[1]).sort(), ['learning_rate', FLAT_STATE, 'step', 'x'], 'the parameters travel in the flat state only');
  assert.deepEqual([...runs[0][FLAT_STATE].data], [1, 2, 0, 0, 0, 0], 'packed in the layout order, missing moments zero');
  assert.deepEqual([...(/** @type {any} */ (trainer.parameters().get('w'))).data], [...(/** @type {any} */ (plain.parameters().get('w'))).data]);
  const [mine, theirs] = [await trainer.state(), await plain.state()];
  assert.equal(mine.step, theirs.step);
  for (const name of LAYOUT.map(([n]) => n)) {
    assert.deepEqual(mine.tensors.get(name), theirs.tensors.get(name), name);
  }
});

test('a flat step model without its layout, or with a layout that does not tile the state, is refused', async () => {
  const { ort } = fakeFlatOrt();
  await assert.rejects(Trainer.create(/** @type {any} */ (ort), { stepModel: 'flat.onnx', state: initial() }), /pass its layout/);
  const gap = /** @type {any} */ ([['w', 0, [2]], ['w.exp_avg', 3, [2]], ['w.exp_avg_sq', 5, [2]]]);
  await assert.rejects(Trainer.create(/** @type {any} */ (ort), { stepModel: 'flat.onnx', state: initial(), flatLayout: gap }), /puts 'w.exp_avg' at 3, not 2/);
  const shape = /** @type {any} */ ([['w', 0, [3]], ['w.exp_avg', 3, [2]], ['w.exp_avg_sq', 5, [2]]]);
  await assert.rejects(Trainer.create(/** @type {any} */ (ort), { stepModel: 'flat.onnx', state: initial(), flatLayout: shape }), /carries 'w' as float32 \[3\]; the state has float32 \[2\]/);
  assert.equal(flatLayout({}), null);
  assert.deepEqual(flatLayout({ [FLAT_STATE]: JSON.stringify(LAYOUT) }), LAYOUT);
  assert.throws(() => flatLayout({ [FLAT_STATE]: '[["w", -1, [2]]]' }), /list of \[name, offset, shape\]/);
});
