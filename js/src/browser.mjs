// Browser entry point: the Trainer on onnxruntime-web (WASM), loading artifacts with fetch.
//
// `onnxruntime-web/wasm` is a bare specifier: map it with an import map (the demo page maps it to the
// served `ort.wasm.min.mjs`) or let a bundler resolve it. Set `ort.env.wasm.wasmPaths` to where the
// `ort-wasm-simd-threaded.{mjs,wasm}` files are served before the first session is created.

import * as ort from 'onnxruntime-web/wasm';

import { Trainer, flatLayout, frozenBaseOptions } from './trainer.mjs';
import { parseState, serializeState } from './state.mjs';
import { fillInferenceModel, parseLayout } from './inference.mjs';
import { ADAPTER_FILES, loraRecord, peftAdapterFiles } from './adapters.mjs';
import { externalDataFiles, modelMetadata } from './onnx_proto.mjs';
import { parsePlacement } from './placement.mjs';

export { Trainer, LEARNING_RATE, STEP, FLAT_STATE, flatLayout, frozenBaseOptions } from './trainer.mjs';
export { parseState, serializeState, momentNames, stateNames, STATE_FORMAT } from './state.mjs';
export { parseSafetensors, serializeSafetensors } from './safetensors.mjs';
export { fillInferenceModel, parseLayout, TEMPLATE_FORMAT } from './inference.mjs';
export { ADAPTER_FILES, LORA_METADATA, loraRecord, peftAdapterFiles } from './adapters.mjs';
export { externalDataFiles, modelMetadata } from './onnx_proto.mjs';
export { parsePlacement, describePlacement } from './placement.mjs';
export { ort };

/** @typedef {import('./inference.mjs').TemplateLayout} TemplateLayout */

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
 * A URL's bytes, or null when the server has no such file (HTTP 404).
 * @param {string | URL} url
 * @returns {Promise<Uint8Array | null>}
 */
async function fetchIfServed(url) {
  const response = await fetch(url);
  if (response.status === 404) return null;
  if (!response.ok) throw new Error(`GET ${url}: HTTP ${response.status}`);
  return new Uint8Array(await response.arrayBuffer());
}

/** The flat step model's file (onnxblocks.web.write_flat_step), used on the CPU provider when served. */
export const FLAT_STEP_MODEL = 'flat_step_model.onnx';

/**
 * A Trainer over portable artifacts served at `base` (`step_model.onnx`, `eval_model.onnx`, `params.safetensors`).
 * @param {string | URL} base  the directory URL (ends with `/`)
 * @param {object} [options]
 * @param {boolean} [options.evaluate]  open the eval model (default: true)
 * @param {import('onnxruntime-common').InferenceSession.SessionOptions} [options.sessionOptions]
 * @param {string} [options.baseWeights]  the frozen base the models share (default `base_weights.bin`), fetched when they
 *   name it; every external data file the models name is fetched once (read from their initializers)
 * @param {string[]} [options.executionProviders]  providers in order of preference, e.g. `['webgpu', 'wasm']` (overrides
 *   `sessionOptions.executionProviders`; default `['wasm']`); `webgpu` needs a bundle with it (the import map)
 * @param {boolean} [options.flat]  on WASM alone, train the flat step model `flat_step_model.onnx` when it is served
 *   (default: true; one state tensor each way instead of one per parameter and moment, same numbers)
 * @returns {Promise<{trainer: Trainer, state: TrainingState}>}  the trainer and the state it started from
 */
export async function loadTrainer(base, { evaluate = true, sessionOptions = { executionProviders: ['wasm'] }, baseWeights = 'base_weights.bin', executionProviders, flat = true } = {}) {
  if (executionProviders !== undefined && (!Array.isArray(executionProviders) || !executionProviders.length || executionProviders.some((p) => typeof p !== 'string'))) {
    throw new TypeError(`executionProviders must be a non-empty list of provider names such as ['webgpu', 'wasm'], got ${JSON.stringify(executionProviders)}`);
  }
  hookConsole(); // before onnxruntime-web's WASM starts: it keeps the console functions it finds
  const at = (/** @type {string} */ name) => new URL(name, new URL(base, globalThis.location?.href)).href;
  const chosen = executionProviders ? { ...sessionOptions, executionProviders } : sessionOptions;
  const providers = (chosen.executionProviders ?? ['wasm']).map((p) => (typeof p === 'string' ? p : p.name));
  const flatFirst = flat && providers.every((p) => p === 'wasm' || p === 'cpu');
  const [stepModel, evalModel, stateBytes] = await Promise.all([
    (flatFirst ? fetchIfServed(at(FLAT_STEP_MODEL)) : Promise.resolve(null)).then((bytes) => bytes ?? fetchBytes(at('step_model.onnx'))),
    evaluate ? fetchBytes(at('eval_model.onnx')) : Promise.resolve(undefined),
    fetchBytes(at('params.safetensors')),
  ]);
  const state = parseState(stateBytes, at('params.safetensors'));
  // the external data files the models name, each fetched once: the frozen base they share (`baseWeights`) and
  // a model's own `<model>.data` where its writer put a constant over 1 KiB; none for models that hold all inline
  const names = [...new Set([...externalDataFiles(stepModel), ...(evalModel ? externalDataFiles(evalModel) : [])])];
  names.sort((a, b) => Number(b === baseWeights) - Number(a === baseWeights));
  const datas = await Promise.all(names.map((name) => fetchBytes(at(name))));
  const externalData = names.length ? names.map((path, i) => ({ path, data: datas[i] })) : undefined;
  const options = names.includes(baseWeights) ? frozenBaseOptions(chosen) : { ...chosen };
  const layout = flatLayout(modelMetadata(stepModel)) ?? undefined;
  const trainer = await Trainer.create(/** @type {any} */ (ort), { stepModel, evalModel, state, sessionOptions: options, externalData, flatLayout: layout });
  trainer.lora = loraRecord(stepModel, at('step_model.onnx'));
  trainer.executionProviders = providers;
  trainer.placementProbe = () => logPlacement(stepModel, externalData ? { ...options, externalData } : options);
  return { trainer, state };
}

/** @type {string[] | null}  ONNX Runtime's log lines while a placement probe runs */
let captured = null;
let hooked = false;

/**
 * Route the console through a hook that can collect ONNX Runtime's log: onnxruntime-web's WASM prints it through the
 * console functions it found when it started, so the hook goes in before the first session.
 */
function hookConsole() {
  if (hooked) return;
  hooked = true;
  for (const level of /** @type {const} */ (['log', 'info', 'warn', 'error', 'debug'])) {
    const original = console[level];
    console[level] = (...args) => {
      const text = args.map(String).join(' ');
      if (captured && text.includes('onnxruntime')) captured.push(text);
      else original.apply(console, args);
    };
  }
}

/**
 * The step model's placement, from ONNX Runtime's log of a throwaway session opened with `logSeverityLevel: 0`.
 * @param {Uint8Array} model
 * @param {import('onnxruntime-common').InferenceSession.SessionOptions} options
 * @returns {Promise<import('./placement.mjs').Placement>}
 */
async function logPlacement(model, options) {
  captured = [];
  const lines = captured;
  try {
    const session = await ort.InferenceSession.create(model, { ...options, logSeverityLevel: 0, logVerbosityLevel: 0 });
    await session.release();
  } finally {
    captured = null;
  }
  return parsePlacement(lines.flatMap((line) => line.split('\n')));
}

/**
 * The trainer's LoRA adapters as the two files of a PEFT directory, offered as downloads
 * (`adapter_model.safetensors` and `adapter_config.json`: put both in one folder for
 * `peft.PeftModel.from_pretrained(base, folder)` or onnxblocks' `TrainingSession.load_adapters(folder)`).
 * @param {Trainer} trainer  a trainer of adapter artifacts (from `loadTrainer`)
 * @param {object} [options]
 * @param {boolean} [options.download]  offer the files as downloads (default: true)
 * @returns {Promise<{weights: Uint8Array, config: string}>}  the files' contents
 */
export async function downloadAdapters(trainer, { download = true } = {}) {
  if (!trainer.lora) {
    throw new TypeError("downloadAdapters: the trainer's artifacts have no LoRA adapters (no 'onnxblocks.lora' metadata in the step model)");
  }
  const files = peftAdapterFiles(trainer.lora, (await trainer.state()).tensors);
  if (download) {
    downloadBytes(files.weights, ADAPTER_FILES.weights);
    downloadBytes(new TextEncoder().encode(files.config), ADAPTER_FILES.config);
  }
  return files;
}

/**
 * Offer bytes to the user as a file download.
 * @param {Uint8Array} bytes
 * @param {string} filename
 */
export function downloadBytes(bytes, filename) {
  const url = URL.createObjectURL(new Blob([/** @type {Uint8Array<ArrayBuffer>} */ (bytes)], { type: 'application/octet-stream' }));
  const link = Object.assign(document.createElement('a'), { href: url, download: filename });
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}

/**
 * Offer a state to the user as a file download (`params.safetensors`).
 * @param {TrainingState} state
 * @param {string} [filename]
 */
export function downloadState(state, filename = 'params.safetensors') {
  downloadBytes(serializeState(state), filename);
}

/**
 * The inference-model template of the artifacts served at `base` (`inference_model.onnx` and its `.json` layout),
 * written by Python's `onnxblocks.web.write_inference_template`.
 * @param {string | URL} base  the directory URL (ends with `/`)
 * @param {string} [name]  the template's file name
 * @returns {Promise<{template: Uint8Array, layout: TemplateLayout}>}
 */
export async function fetchInferenceTemplate(base, name = 'inference_model.onnx') {
  const at = (/** @type {string} */ file) => new URL(file, new URL(base, globalThis.location?.href)).href;
  const [template, layoutBytes] = await Promise.all([fetchBytes(at(name)), fetchBytes(at(`${name}.json`))]);
  return { template, layout: parseLayout(JSON.parse(new TextDecoder().decode(layoutBytes)), template.length) };
}
