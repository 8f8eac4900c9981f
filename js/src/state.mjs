// The training state file: parameters and optimizer state as one safetensors file.
//
// Written by Python (`onnxblocks.web.write_state`, from a checkpoint) and by this client
// (`Trainer.state()`), read by both; `onnxblocks.web.state_to_checkpoint` turns it back into
// an ONNX Runtime checkpoint. Layout (docs/web.md):
//
//   tensors:       every parameter by name; AdamW moments as `<p>.exp_avg`, `<p>.exp_avg_sq`
//                  (the fused step model's input names), when the state has them
//   __metadata__:  format     "onnxblocks-web/1"
//                  trainable  JSON list of the trainable parameters, in order
//                  frozen     JSON list of the frozen parameters
//                  step       optimizer steps taken so far (decimal)
//                  learning_rate  JSON number: the learning rate the state was saved with (optional)
//                  other keys (e.g. the checkpoint's properties) are kept as they are

import { parseSafetensors, serializeSafetensors } from './safetensors.mjs';

/** @typedef {import('./safetensors.mjs').NamedTensor} NamedTensor */

/** The value of `__metadata__.format` this client reads and writes. */
export const STATE_FORMAT = 'onnxblocks-web/1';
/** Suffixes of a parameter's AdamW moments (onnxblocks `_core/contracts.py`: `moment_names`). */
export const MOMENT_SUFFIXES = /** @type {const} */ (['.exp_avg', '.exp_avg_sq']);
const OWN_KEYS = new Set(['format', 'trainable', 'frozen', 'step', 'learning_rate']);

/**
 * Parameters and optimizer state, in JavaScript memory.
 * @typedef {object} TrainingState
 * @property {Map<string, NamedTensor>} tensors  parameters and moments by name
 * @property {string[]} trainable  trainable parameter names, in order
 * @property {string[]} frozen  frozen parameter names
 * @property {number} step  optimizer steps taken
 * @property {number | null} learningRate  learning rate saved with the state, if any
 * @property {Record<string, string>} extra  other metadata, written back unchanged
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
 * Parse a state file.
 * @param {ArrayBuffer | Uint8Array} bytes
 * @param {string} [what]  how to name the file in errors
 * @returns {TrainingState}
 * @throws {TypeError | RangeError | SyntaxError} on a file that is not a state file of this format
 */
export function parseState(bytes, what = 'state file') {
  const { tensors, metadata } = parseSafetensors(bytes, what);
  if (metadata.format !== STATE_FORMAT) {
    throw new TypeError(`${what}: __metadata__.format is ${JSON.stringify(metadata.format)}, expected '${STATE_FORMAT}'. Write it with onnxblocks.web.write_state.`);
  }
  const trainable = jsonList(metadata.trainable, 'trainable', what);
  const frozen = jsonList(metadata.frozen, 'frozen', what);
  for (const name of [...trainable, ...frozen]) {
    if (!tensors.has(name)) throw new RangeError(`${what}: parameter '${name}' is listed in the metadata but has no tensor`);
  }
  const step = Number(metadata.step ?? '0');
  if (!Number.isSafeInteger(step) || step < 0) throw new RangeError(`${what}: step ${JSON.stringify(metadata.step)} is not a non-negative integer`);
  const learningRate = metadata.learning_rate === undefined ? null : Number(JSON.parse(metadata.learning_rate));
  const extra = Object.fromEntries(Object.entries(metadata).filter(([key]) => !OWN_KEYS.has(key)));
  return { tensors, trainable, frozen, step, learningRate, extra };
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
  for (const name of state.trainable) momentNames(name).forEach(add);
  /** @type {Record<string, string>} */
  const metadata = {
    ...state.extra,
    format: STATE_FORMAT,
    trainable: JSON.stringify(state.trainable),
    frozen: JSON.stringify(state.frozen),
    step: String(state.step),
  };
  if (state.learningRate !== null && Number.isFinite(state.learningRate)) metadata.learning_rate = JSON.stringify(state.learningRate);
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
  return value;
}
