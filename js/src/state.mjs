// The training state file: parameters and optimizer state as one safetensors file.
//
// Written by Python (`onnxblocks.web.write_state`, from a checkpoint) and by this client
// (`Trainer.state()`), read by both; `onnxblocks.web.state_to_checkpoint` turns it back into
// an ONNX Runtime checkpoint. Layout (docs/web.md):
//
//   tensors:       every parameter by name; the optimizer's state tensors as `<p>.exp_avg`,
//                  `<p>.exp_avg_sq`, `<p>.state2`, `<p>.state3` (the fused step model's input names),
//                  when the state has them
//   __metadata__:  format     "onnxblocks-web/1"
//                  trainable  JSON list of the trainable parameters, in order
//                  frozen     JSON list of the frozen parameters
//                  step       optimizer steps taken so far (decimal)
//                  learning_rate  JSON number: the learning rate the state was saved with (optional)
//                  states     state tensors per trainable parameter (decimal, 1 to 4; absent: 2, AdamW's)
//                  other keys (e.g. the checkpoint's properties) are kept as they are

import { parseSafetensors, serializeSafetensors } from './safetensors.mjs';

/** @typedef {import('./safetensors.mjs').NamedTensor} NamedTensor */

/** The value of `__metadata__.format` this client reads and writes. */
export const STATE_FORMAT = 'onnxblocks-web/1';
/** Suffixes of a parameter's AdamW moments (onnxblocks `_core/contracts.py`: `moment_names`). */
export const MOMENT_SUFFIXES = /** @type {const} */ (['.exp_avg', '.exp_avg_sq']);
const OWN_KEYS = new Set(['format', 'trainable', 'frozen', 'step', 'learning_rate', 'states']);
/** The most state tensors per parameter an optimizer keeps (onnxblocks `_core/contracts.py`: MAX_STATES). */
export const MAX_STATES = 4;

/**
 * Parameters and optimizer state, in JavaScript memory.
 * @typedef {object} TrainingState
 * @property {Map<string, NamedTensor>} tensors  parameters and moments by name
 * @property {string[]} trainable  trainable parameter names, in order
 * @property {string[]} frozen  frozen parameter names
 * @property {number} step  optimizer steps taken
 * @property {number | null} learningRate  learning rate saved with the state, if any
 * @property {Record<string, string>} extra  other metadata, written back unchanged
 * @property {number} [states]  state tensors per trainable parameter the optimizer declares (default 2)
 */

/**
 * The names of a parameter's AdamW moments.
 * @param {string} param
 * @returns {[string, string]}
 */
export function momentNames(param) {
  return [param + MOMENT_SUFFIXES[0], param + MOMENT_SUFFIXES[1]];
}

/**
 * The names of a parameter's first `count` optimizer state tensors, in slot order
 * (onnxblocks `_core/contracts.py`: `state_names`): the two moments, then `<p>.state2`, `<p>.state3`.
 * @param {string} param
 * @param {number} [count]
 * @returns {string[]}
 */
export function stateNames(param, count = MAX_STATES) {
  const names = [...momentNames(param)];
  for (let k = 2; k < MAX_STATES; k++) names.push(`${param}.state${k}`);
  return names.slice(0, count);
}

/** Largest step counter (onnxblocks `_core/hyperparams.py`: MAX_STEP, the largest exact JavaScript integer). */
export const MAX_STEP = Number.MAX_SAFE_INTEGER;
const FLOAT32_MAX = 3.4028234663852886e38;
const INT64_LIMIT = 2 ** 63;

/**
 * Parse a state file, trusting nothing in it: the safetensors layout (`parseSafetensors`), then
 * the rules of onnxblocks' Python reader (`onnxblocks/web/state.py`, `check_state`): parameter
 * lists without repeats, no parameter both trainable and frozen, every listed parameter present
 * and no other tensor than the parameters and their moments, none or both moments per trainable
 * parameter with its dtype and shape, `step` a decimal integer in [0, 2**53 - 1], `learning_rate`
 * a finite number >= 0 that is finite as float32, and each property an int in int64, a float32
 * float or a str.
 * @param {ArrayBuffer | Uint8Array} bytes
 * @param {string} [what]  how to name the file in errors
 * @returns {TrainingState}
 * @throws {TypeError | RangeError | SyntaxError} on a file that is not a state file of this format (the message starts with `what`)
 */
export function parseState(bytes, what = 'state file') {
  const { tensors, metadata } = parseSafetensors(bytes, what);
  if (metadata.format !== STATE_FORMAT) {
    throw new TypeError(`${what}: __metadata__.format is ${JSON.stringify(metadata.format)}, expected '${STATE_FORMAT}'. Write it with onnxblocks.web.write_state.`);
  }
  const trainable = jsonList(metadata.trainable, 'trainable', what);
  const frozen = jsonList(metadata.frozen, 'frozen', what);
  const both = trainable.filter((name) => frozen.includes(name));
  if (both.length) throw new RangeError(`${what}: parameters ${JSON.stringify(both)} are listed as trainable and as frozen`);
  for (const name of [...trainable, ...frozen]) {
    if (!tensors.has(name)) throw new RangeError(`${what}: parameter '${name}' is listed in the metadata but has no tensor`);
  }
  const statesText = metadata.states ?? '2';
  const states = /^[0-9]{1,2}$/.test(statesText) ? Number(statesText) : NaN;
  if (!(states >= 1 && states <= MAX_STATES)) throw new RangeError(`${what}: __metadata__.states ${JSON.stringify(statesText)} must be an integer in [1, ${MAX_STATES}]`);
  const known = new Set([...trainable, ...frozen, ...trainable.flatMap((name) => stateNames(name, states))]);
  const stray = [...tensors.keys()].filter((name) => !known.has(name));
  if (stray.length) throw new RangeError(`${what}: tensors ${JSON.stringify(stray.slice(0, 5))} are neither listed parameters nor their moments`);
  for (const name of trainable) {
    const param = /** @type {NamedTensor} */ (tensors.get(name));
    const present = stateNames(name, states).filter((m) => tensors.has(m));
    if (states === 2 && present.length === 1) throw new RangeError(`${what}: '${name}' has only one of its two moments (${present[0]})`);
    if (present.length && present.length !== states) throw new RangeError(`${what}: '${name}' has ${present.length} of its ${states} optimizer state tensors; give all or none`);
    for (const moment of present) {
      const value = /** @type {NamedTensor} */ (tensors.get(moment));
      if (value.dtype !== param.dtype || value.shape.join(',') !== param.shape.join(',')) {
        throw new RangeError(`${what}: moment '${moment}' is ${value.dtype} [${value.shape}], its parameter ${param.dtype} [${param.shape}]`);
      }
    }
  }
  const stepText = metadata.step ?? '0';
  const step = /^[0-9]{1,20}$/.test(stepText) ? Number(stepText) : NaN;
  if (!(step <= MAX_STEP)) throw new RangeError(`${what}: step ${JSON.stringify(stepText)} is not an integer in [0, ${MAX_STEP}]`);
  let learningRate = null;
  if (metadata.learning_rate !== undefined) {
    learningRate = jsonValue(metadata.learning_rate, 'learning_rate', what);
    if (typeof learningRate !== 'number' || !(learningRate >= 0 && learningRate <= FLOAT32_MAX)) {
      throw new RangeError(`${what}: learning_rate ${metadata.learning_rate} must be a finite number >= 0 (and finite as float32)`);
    }
  }
  checkProperties(metadata.properties, what);
  const extra = Object.fromEntries(Object.entries(metadata).filter(([key]) => !OWN_KEYS.has(key)));
  return { tensors, trainable, frozen, step, learningRate, extra, states };
}

/**
 * Check `__metadata__.properties`: a JSON object of `[kind, value]` pairs (kept as text: the client writes it back unchanged).
 * @param {string | undefined} text
 * @param {string} what
 */
function checkProperties(text, what) {
  if (text === undefined) return;
  const properties = jsonValue(text, 'properties', what) ?? {};
  if (typeof properties !== 'object' || Array.isArray(properties)) throw new TypeError(`${what}: __metadata__.properties must be a JSON object`);
  for (const [name, pair] of Object.entries(properties)) {
    const [kind, value] = Array.isArray(pair) && pair.length === 2 ? pair : [null, null];
    const ok =
      (kind === 'int' && Number.isInteger(value) && value >= -INT64_LIMIT && value < INT64_LIMIT) ||
      (kind === 'float' && typeof value === 'number' && Math.fround(value) === value) ||
      (kind === 'str' && typeof value === 'string');
    if (!ok) throw new TypeError(`${what}: property '${name}' is ${JSON.stringify(pair)}; expected ["int", int64], ["float", float32] or ["str", string]`);
  }
}

/**
 * @param {string} text
 * @param {string} key
 * @param {string} what
 * @returns {unknown}
 */
function jsonValue(text, key, what) {
  try {
    return JSON.parse(text);
  } catch {
    throw new SyntaxError(`${what}: __metadata__.${key} is not JSON`);
  }
}

/**
 * Serialize a state: parameters in `trainable`, `frozen` order, then the moments present.
 * @param {TrainingState} state
 * @returns {Uint8Array}
 */
export function serializeState(state) {
  /** @type {NamedTensor[]} */
  const ordered = [];
  const seen = new Set();
  const add = (/** @type {string} */ name) => {
    const tensor = state.tensors.get(name);
    if (tensor && !seen.has(name)) {
      ordered.push(tensor);
      seen.add(name);
    }
  };
  for (const name of [...state.trainable, ...state.frozen]) {
    if (!state.tensors.has(name)) throw new RangeError(`state: parameter '${name}' has no tensor`);
    add(name);
  }
  const states = state.states ?? 2;
  for (const name of state.trainable) stateNames(name, states).forEach(add);
  /** @type {Record<string, string>} */
  const metadata = {
    ...state.extra,
    format: STATE_FORMAT,
    trainable: JSON.stringify(state.trainable),
    frozen: JSON.stringify(state.frozen),
    step: String(state.step),
  };
  if (state.learningRate !== null && Number.isFinite(state.learningRate)) metadata.learning_rate = JSON.stringify(state.learningRate);
  if (states !== 2) metadata.states = String(states);
  return serializeSafetensors(ordered, metadata);
}

/**
 * @param {string | undefined} text
 * @param {string} key
 * @param {string} what
 * @returns {string[]}
 */
function jsonList(text, key, what) {
  let value;
  try {
    value = JSON.parse(text ?? '[]');
  } catch {
    throw new SyntaxError(`${what}: __metadata__.${key} is not JSON`);
  }
  if (!Array.isArray(value) || !value.every((v) => typeof v === 'string')) {
    throw new TypeError(`${what}: __metadata__.${key} must be a JSON list of names`);
  }
  const repeated = value.filter((v, i) => value.indexOf(v) !== i);
  if (repeated.length) throw new RangeError(`${what}: __metadata__.${key} lists ${JSON.stringify(repeated)} more than once`);
  return value;
}
