// A federated client: trains rounds of a Flower federation through an onnxblocks bridge (docs/federated.md).
//
// The bridge's relay (onnxblocks.federated.relay) serves the portable artifacts (`/files/<name>`) and one
// slot per bridge SuperNode. Each round the client takes its slot's task, loads the global trainable
// parameters from the task's state file (the frozen ones stay the artifacts'), trains with the Trainer on
// its local data (a fresh optimizer, as a Python client's), and posts its trainable parameters back as a
// state file (LoRA artifacts: the adapters alone) with the metrics a Python client sends. It beats while it
// trains, so a client that dies is dropped from its round. Browser and Node alike: only `fetch` is used.

import { Trainer, frozenBaseOptions } from './trainer.mjs';
import { parseState, serializeState } from './state.mjs';
import { externalDataFiles } from './onnx_proto.mjs';

/** @typedef {import('./trainer.mjs').Ort} Ort */
/** @typedef {import('./safetensors.mjs').NamedTensor} NamedTensor */
/** @typedef {import('./state.mjs').TrainingState} TrainingState */

/**
 * What a round reports to `onRound`.
 * @typedef {object} RoundReport
 * @property {number} round
 * @property {string} phase  `train` or `evaluate`
 * @property {Record<string, number>} metrics
 * @property {boolean} accepted  whether the relay took the result
 * @property {string | null} reason  why not
 */

/**
 * Join a federation through a bridge and train until it ends.
 * @param {object} options
 * @param {Ort} options.ort
 * @param {string} options.url  the relay (`http://127.0.0.1:P`: a free slot is claimed) or a slot (`.../slots/K`)
 * @param {Map<string, NamedTensor>} options.data  local data by input name (or arr_0, arr_1, ...)
 * @param {string} options.kind  `node` or `browser`
 * @param {string} [options.runtime]  what runs it, for the server's history
 * @param {import('onnxruntime-common').InferenceSession.SessionOptions} [options.sessionOptions]
 * @param {(report: RoundReport) => void} [options.onRound]
 * @param {(trainer: Trainer) => void} [options.onReady]
 * @param {(task: {round: number, phase: string}) => Promise<void>} [options.beforeSend]  awaited before a result is posted
 * @returns {Promise<{rounds: number, slot: string}>}
 */
export async function federate({ ort, url, data, kind, runtime = '', sessionOptions = {}, onRound, onReady, beforeSend }) {
  const base = url.replace(/\/+$/, '');
  const root = base.replace(/\/slots\/\d+$/, '');
  const slot = /\/slots\/\d+$/.test(base) ? base : `${root}/slots/${(await json(`${root}/claim`, { method: 'POST', body: JSON.stringify({ kind }) })).slot}`;
  const files = await fetchFiles(root);
  const baseState = parseState(files.params, 'params.safetensors');
  const external = files.base ? [{ path: 'base_weights.bin', data: files.base }] : undefined;
  const options = files.base ? frozenBaseOptions(sessionOptions) : sessionOptions;
  const first = await Trainer.create(ort, { stepModel: files.step, evalModel: files.eval ?? undefined, state: baseState, sessionOptions: options, externalData: external });
  onReady?.(first);
  let rounds = 0;
  for (;;) {
    const task = await json(`${slot}/task`);
    if (task.status === 'done') break;
    if (task.status !== 'task') continue;
    const taskUrl = `${slot}/tasks/${task.id}`;
    const beats = beating(slot);
    try {
      const global = parseState(await bytes(`${taskUrl}/state`), `round ${task.round}'s state`);
      const trainer = new Trainer(ort, first.stepSession, first.evalSession, withGlobal(baseState, global));
      const { body, metrics } = task.phase === 'train' ? await trainRound(ort, trainer, data, task.config, baseState) : await evaluateRound(trainer, data, task.config);
      await beforeSend?.(task);
      const answer = await json(`${taskUrl}/result`, { method: 'POST', body: /** @type {BodyInit} */ (/** @type {unknown} */ (body)), headers: { 'X-Metrics': JSON.stringify(metrics), 'X-Client': JSON.stringify({ kind, runtime }) } });
      rounds += task.phase === 'train' ? 1 : 0;
      onRound?.({ round: task.round, phase: task.phase, metrics, accepted: Boolean(answer.accepted), reason: answer.reason ?? null });
    } catch (error) {
      const reason = error instanceof Error ? error.message : String(error);
      await json(`${taskUrl}/error`, { method: 'POST', body: JSON.stringify({ reason }) }).catch(() => null);
      onRound?.({ round: task.round, phase: task.phase, metrics: {}, accepted: false, reason });
    } finally {
      beats.stop();
    }
  }
  await first.release();
  return { rounds, slot };
}

/**
 * The artifacts' state with the global trainable parameters in place of its own (frozen ones kept; no moments).
 * @param {TrainingState} baseState
 * @param {TrainingState} global
 * @returns {TrainingState}
 */
export function withGlobal(baseState, global) {
  const want = [...baseState.trainable].sort().join('\n');
  if ([...global.trainable].sort().join('\n') !== want) {
    throw new RangeError(`the round's parameters (${global.trainable.join(', ')}) are not the artifacts' trainable ones (${baseState.trainable.join(', ')})`);
  }
  const tensors = new Map();
  for (const name of baseState.frozen) tensors.set(name, baseState.tensors.get(name));
  for (const name of baseState.trainable) tensors.set(name, global.tensors.get(name));
  return { ...baseState, tensors, step: 0 };
}

/**
 * One round of local training; the trainable parameters as a state file, and the metrics.
 * @param {Ort} ort
 * @param {Trainer} trainer
 * @param {Map<string, NamedTensor>} data
 * @param {Record<string, any>} config  `local-epochs`, `local-steps`, `lr`, `batch-size`, `shuffle`, `seed`
 * @param {TrainingState} baseState
 */
export async function trainRound(ort, trainer, data, config, baseState) {
  const columns = pick(data, trainer.inputNames);
  const rows = columns[0].shape[0];
  const batchSize = Number(config['batch-size'] ?? 32);
  const lr = Number(config.lr ?? baseState.learningRate);
  if (!Number.isFinite(lr)) throw new TypeError('the round gives no lr and the artifacts\' state holds no learning_rate');
  const perEpoch = Math.ceil(rows / batchSize);
  const steps = config['local-steps'] !== undefined ? Number(config['local-steps']) : perEpoch * Number(config['local-epochs'] ?? 1);
  const shuffle = config.shuffle !== false;
  const random = generator(Number(config.seed ?? 0) + Number(config['server-round'] ?? 0));
  let order = [...Array(rows).keys()];
  const started = performance.now();
  let yielded = started;
  let total = 0;
  for (let step = 0; step < steps; step++) {
    const k = step % perEpoch;
    if (k === 0 && shuffle) order = permutation(rows, random);
    const batch = Object.fromEntries(trainer.inputNames.map((name, i) => [name, rowsOf(columns[i], order.slice(k * batchSize, (k + 1) * batchSize))]));
    total += (await trainer.trainStep(batch, lr)).loss;
    if (performance.now() - yielded > 200) {
      await new Promise((resolve) => setTimeout(resolve, 0)); // let the beats out
      yielded = performance.now();
    }
  }
  const seconds = (performance.now() - started) / 1000;
  const full = await trainer.state();
  const tensors = new Map(trainer.trainable.map((name) => [name, /** @type {NamedTensor} */ (full.tensors.get(name))]));
  const body = serializeState({ ...full, tensors, frozen: [] });
  const metrics = { 'num-examples': rows, 'train-loss': steps ? total / steps : NaN, steps, 'train-seconds': seconds };
  return { body, metrics };
}

/**
 * Evaluate the global parameters on the local data: `eval-loss` (row-weighted), `accuracy` for class labels.
 * @param {Trainer} trainer
 * @param {Map<string, NamedTensor>} data
 * @param {Record<string, any>} config
 */
export async function evaluateRound(trainer, data, config) {
  const columns = pick(data, trainer.evalInputNames);
  const rows = columns[0].shape[0];
  const batchSize = Math.max(1, Number(config['batch-size'] ?? 256));
  const labels = columns[columns.length - 1];
  const classes = trainer.evalOutputNames.length > 1 && columns.length > 1 && /int/.test(labels.dtype);
  let loss = 0;
  let correct = 0;
  for (let start = 0; start < rows; start += batchSize) {
    const index = [...Array(Math.min(batchSize, rows - start)).keys()].map((i) => start + i);
    const batch = Object.fromEntries(trainer.evalInputNames.map((name, i) => [name, rowsOf(columns[i], index)]));
    const { loss: value, outputs } = await trainer.evalStep(batch);
    loss += value * index.length;
    if (classes) {
      const scores = outputs[trainer.evalOutputNames[1]];
      const width = scores.dims[scores.dims.length - 1];
      const values = /** @type {Float32Array} */ (await scores.getData());
      index.forEach((row, i) => {
        let best = 0;
        for (let c = 1; c < width; c++) if (values[i * width + c] > values[i * width + best]) best = c;
        if (BigInt(best) === BigInt(labels.data[row])) correct += 1;
      });
    }
  }
  /** @type {Record<string, number>} */
  const metrics = { 'num-examples': rows, 'eval-loss': loss / rows };
  if (classes) metrics.accuracy = correct / rows;
  return { body: new Uint8Array(0), metrics };
}

/**
 * The data's arrays for the model's inputs: by name, else arr_0, arr_1, ... in order (as Python's clients).
 * float64 arrays become float32 and int32 ones int64 (what `numpy.savez` of Python lists gives).
 * @param {Map<string, NamedTensor>} data
 * @param {string[]} names
 * @returns {NamedTensor[]}
 */
export function pick(data, names) {
  const keys = names.every((n) => data.has(n)) ? names : names.map((_, i) => `arr_${i}`);
  const missing = keys.filter((k) => !data.has(k));
  if (missing.length) throw new RangeError(`the local data has arrays ${[...data.keys()].join(', ')} but none for the model inputs ${names.join(', ')}; save them under those names`);
  const columns = keys.map((k) => widen(/** @type {NamedTensor} */ (data.get(k))));
  const rows = columns[0].shape[0];
  if (columns.some((c) => c.shape[0] !== rows)) throw new RangeError('the local data\'s arrays hold different numbers of rows');
  return columns;
}

/** @param {NamedTensor} t @returns {NamedTensor} */
function widen(t) {
  if (t.dtype === 'float64') return { ...t, dtype: 'float32', data: Float32Array.from(/** @type {Float64Array} */ (t.data)) };
  if (t.dtype === 'int32') return { ...t, dtype: 'int64', data: BigInt64Array.from(/** @type {Int32Array} */ (t.data), (v) => BigInt(v)) };
  return t;
}

/** @param {NamedTensor} t @param {number[]} rows @returns {Omit<NamedTensor, 'name'>} */
function rowsOf(t, rows) {
  const width = t.shape.slice(1).reduce((a, b) => a * b, 1);
  const Typed = /** @type {any} */ (t.data.constructor);
  const out = new Typed(rows.length * width);
  rows.forEach((row, i) => out.set(t.data.subarray(row * width, (row + 1) * width), i * width));
  return { dtype: t.dtype, shape: [rows.length, ...t.shape.slice(1)], data: out };
}

/** @param {number} seed @returns {() => number} mulberry32 */
function generator(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** @param {number} n @param {() => number} random @returns {number[]} */
function permutation(n, random) {
  const out = [...Array(n).keys()];
  for (let i = n - 1; i > 0; i--) {
    const j = Math.floor(random() * (i + 1));
    [out[i], out[j]] = [out[j], out[i]];
  }
  return out;
}

/** @param {string} slot */
function beating(slot) {
  const timer = setInterval(() => fetch(`${slot}/alive`, { method: 'POST' }).catch(() => null), 1000);
  return { stop: () => clearInterval(timer) };
}

/** @param {string} root */
async function fetchFiles(root) {
  const step = await bytes(`${root}/files/step_model.onnx`);
  const params = await bytes(`${root}/files/params.safetensors`);
  const evalModel = await bytes(`${root}/files/eval_model.onnx`).catch(() => null);
  const base = externalDataFiles(step).includes('base_weights.bin') ? await bytes(`${root}/files/base_weights.bin`) : null;
  return { step, params, eval: evalModel, base };
}

/** @param {string} url @param {RequestInit} [init] @returns {Promise<Uint8Array>} */
async function bytes(url, init) {
  const response = await fetch(url, init);
  if (!response.ok) throw new Error(`${url}: HTTP ${response.status} ${await response.text()}`);
  return new Uint8Array(await response.arrayBuffer());
}

/** @param {string} url @param {RequestInit} [init] @returns {Promise<any>} */
async function json(url, init) {
  const response = await fetch(url, init);
  const text = await response.text();
  if (!response.ok) throw new Error(`${url}: HTTP ${response.status} ${text}`);
  return JSON.parse(text);
}
