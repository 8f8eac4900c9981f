// Browser entry point: the Trainer on onnxruntime-web (WASM), loading artifacts with fetch.
//
// `onnxruntime-web/wasm` is a bare specifier: map it with an import map (the demo page maps it to the
// served `ort.wasm.min.mjs`) or let a bundler resolve it. Set `ort.env.wasm.wasmPaths` to where the
// `ort-wasm-simd-threaded.{mjs,wasm}` files are served before the first session is created.

import * as ort from 'onnxruntime-web/wasm';

import { Trainer } from './trainer.mjs';
import { parseState, serializeState } from './state.mjs';

export { Trainer, LEARNING_RATE, STEP } from './trainer.mjs';
export { parseState, serializeState, momentNames, stateNames, STATE_FORMAT } from './state.mjs';
export { parseSafetensors, serializeSafetensors } from './safetensors.mjs';
export { ort };

/** @typedef {import('./state.mjs').TrainingState} TrainingState */

/**
 * Fetch a URL's bytes.
 * @param {string | URL} url
 * @returns {Promise<Uint8Array>}
 */
export async function fetchBytes(url) {
  const response = await fetch(url);
  if (!response.ok) throw new Error(`GET ${url}: HTTP ${response.status}`);
  return new Uint8Array(await response.arrayBuffer());
}

/**
 * A Trainer over portable artifacts served at `base` (`step_model.onnx`, `eval_model.onnx`, `params.safetensors`).
 * @param {string | URL} base  the directory URL (ends with `/`)
 * @param {object} [options]
 * @param {boolean} [options.evaluate]  open the eval model (default: true)
 * @param {import('onnxruntime-common').InferenceSession.SessionOptions} [options.sessionOptions]
 * @returns {Promise<{trainer: Trainer, state: TrainingState}>}  the trainer and the state it started from
 */
export async function loadTrainer(base, { evaluate = true, sessionOptions = { executionProviders: ['wasm'] } } = {}) {
  const at = (/** @type {string} */ name) => new URL(name, new URL(base, globalThis.location?.href)).href;
  const [stepModel, evalModel, stateBytes] = await Promise.all([
    fetchBytes(at('step_model.onnx')),
    evaluate ? fetchBytes(at('eval_model.onnx')) : Promise.resolve(undefined),
    fetchBytes(at('params.safetensors')),
  ]);
  const state = parseState(stateBytes, at('params.safetensors'));
  const trainer = await Trainer.create(/** @type {any} */ (ort), { stepModel, evalModel, state, sessionOptions });
  return { trainer, state };
}

/**
 * Offer a state to the user as a file download (`params.safetensors`).
 * @param {TrainingState} state
 * @param {string} [filename]
 */
export function downloadState(state, filename = 'params.safetensors') {
  const url = URL.createObjectURL(new Blob([/** @type {Uint8Array<ArrayBuffer>} */ (serializeState(state))], { type: 'application/octet-stream' }));
  const link = Object.assign(document.createElement('a'), { href: url, download: filename });
  link.click();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}
