// Node entry point: the Trainer on onnxruntime-node, with file helpers.

import { execFile } from 'node:child_process';
import { access, mkdir, readFile, writeFile, rename } from 'node:fs/promises';
import { join } from 'node:path';
import ort from 'onnxruntime-node';

import { Trainer, flatLayout, frozenBaseOptions } from './trainer.mjs';
import { externalDataFiles, modelMetadata } from './onnx_proto.mjs';
import { parseState, serializeState } from './state.mjs';
import { fillInferenceModel, parseLayout } from './inference.mjs';
import { ADAPTER_FILES, loraRecord, peftAdapterFiles } from './adapters.mjs';
import { parsePlacement } from './placement.mjs';

export { Trainer, LEARNING_RATE, STEP, FLAT_STATE, flatLayout, frozenBaseOptions } from './trainer.mjs';
export { parseState, serializeState, momentNames, stateNames, STATE_FORMAT } from './state.mjs';
export { parseSafetensors, serializeSafetensors } from './safetensors.mjs';
export { fillInferenceModel, parseLayout, TEMPLATE_FORMAT } from './inference.mjs';
export { ADAPTER_FILES, LORA_METADATA, loraRecord, peftAdapterFiles } from './adapters.mjs';
export { externalDataFiles, modelMetadata } from './onnx_proto.mjs';
export { parsePlacement, describePlacement } from './placement.mjs';
export { ort };

/** @typedef {import('./state.mjs').TrainingState} TrainingState */

/** File names inside a portable artifact directory (onnxblocks `ArtifactNames`, docs/web.md). */
export const FILES = Object.freeze({
  stepModel: 'step_model.onnx',
  flatStepModel: 'flat_step_model.onnx',
  evalModel: 'eval_model.onnx',
  state: 'params.safetensors',
  inferenceModel: 'inference_model.onnx',
  baseWeights: 'base_weights.bin',
});

/**
 * Read a state file (`params.safetensors`).
 * @param {string} path
 * @returns {Promise<TrainingState>}
 */
export async function readState(path) {
  return parseState(await readFile(path), path);
}

/**
 * Write a state file, replacing `path` atomically.
 * @param {string} path
 * @param {TrainingState} state
 * @returns {Promise<string>} the path
 */
export async function writeState(path, state) {
  const temp = `${path}.${process.pid}.tmp`;
  await writeFile(temp, serializeState(state));
  await rename(temp, path);
  return path;
}

/**
 * A Trainer over a portable artifact directory.
 * @param {string} directory  holds `step_model.onnx`, `eval_model.onnx` (optional) and `params.safetensors`
 * @param {object} [options]
 * @param {string} [options.state]  another state file (default `<directory>/params.safetensors`)
 * @param {boolean} [options.evaluate]  open the eval model (default: true)
 * @param {import('onnxruntime-common').InferenceSession.SessionOptions} [options.sessionOptions]
 * @param {string[]} [options.executionProviders]  onnxruntime-node's providers in order of preference, e.g.
 *   `['webgpu', 'cpu']` (overrides `sessionOptions.executionProviders`; default `['cpu']`)
 * @param {boolean} [options.flat]  on the CPU provider alone, train the flat step model `flat_step_model.onnx` when
 *   the directory has it (default: true; one state tensor each way instead of one per parameter and moment)
 * @returns {Promise<Trainer>}
 */
export async function loadTrainer(directory, { state, evaluate = true, sessionOptions, executionProviders, flat = true } = {}) {
  if (executionProviders !== undefined) checkProviders(executionProviders, ort.listSupportedBackends?.().map((b) => b.name));
  const stepModel = join(directory, FILES.stepModel);
  try {
    await access(stepModel);
  } catch {
    throw new Error(`no ${FILES.stepModel} in '${directory}': the JavaScript client trains portable artifacts with a fused step; generate them with generate_artifacts(..., portable=True) (fused_step=True, the default)`);
  }
  const statePath = state ?? join(directory, FILES.state);
  let loaded;
  try {
    loaded = await readState(statePath);
  } catch (error) {
    if (/** @type {NodeJS.ErrnoException} */ (error).code === 'ENOENT') {
      throw new Error(`no state file '${statePath}': write it from the checkpoint with onnxblocks.web.write_state('${directory}') in Python`);
    }
    throw error;
  }
  const chosen = executionProviders ? { ...sessionOptions, executionProviders } : sessionOptions;
  const flatModel = join(directory, FILES.flatStepModel);
  const cpuOnly = providerNames(chosen?.executionProviders ?? ['cpu']).every((p) => p === 'cpu');
  const useFlat = flat && cpuOnly && (await access(flatModel).then(() => true, () => false));
  const model = useFlat ? flatModel : stepModel;
  const stepBytes = await readFile(model);
  const frozenBase = externalDataFiles(stepBytes).includes(FILES.baseWeights);
  const options = frozenBase ? frozenBaseOptions(chosen) : { ...chosen };
  const trainer = await Trainer.create(/** @type {any} */ (ort), {
    stepModel: model,
    flatLayout: flatLayout(modelMetadata(stepBytes)) ?? undefined,
    evalModel: evaluate ? join(directory, FILES.evalModel) : undefined,
    state: loaded,
    sessionOptions: options,
  }).catch((error) => {
    if (!/WebGPU adapter/.test(error.message)) throw error;
    throw new Error(`onnxruntime-node's webgpu provider found no GPU adapter. It needs a Vulkan driver: without a GPU, Debian's chromium package ships SwiftShader (LD_LIBRARY_PATH=/usr/lib/chromium VK_ICD_FILENAMES=/usr/lib/chromium/vk_swiftshader_icd.json), or install mesa-vulkan-drivers and libvulkan1. (${error.message})`);
  });
  trainer.lora = loraRecord(stepBytes, model);
  trainer.executionProviders = providerNames(options.executionProviders ?? ['cpu']);
  trainer.placementProbe = () => logPlacement(model, options);
  return trainer;
}

/**
 * @param {unknown} providers
 * @param {string[] | undefined} known  the providers this onnxruntime-node has
 */
function checkProviders(providers, known) {
  if (!Array.isArray(providers) || !providers.length || providers.some((p) => typeof p !== 'string')) {
    throw new TypeError(`executionProviders must be a non-empty list of provider names such as ['webgpu', 'cpu'], got ${JSON.stringify(providers)}`);
  }
  const unknown = known ? providers.filter((p) => !known.includes(p)) : [];
  if (unknown.length) throw new RangeError(`execution provider(s) ${unknown.join(', ')} are not in this onnxruntime-node (${known?.join(', ')})`);
}

/**
 * @param {readonly (string | {name: string})[]} providers
 * @returns {string[]}
 */
function providerNames(providers) {
  return providers.map((p) => (typeof p === 'string' ? p : p.name));
}

/**
 * The step model's placement, from ONNX Runtime's log of a session opened in a child Node process (the native log
 * goes to the process's own stdout, out of reach of this one); the child inherits the environment (e.g. the Vulkan
 * driver of the webgpu provider).
 * @param {string} model
 * @param {import('onnxruntime-common').InferenceSession.SessionOptions} options
 * @returns {Promise<import('./placement.mjs').Placement>}
 */
async function logPlacement(model, options) {
  const code = 'const [url, model, options] = process.argv.slice(1); const ort = (await import(url)).default;'
    + ' await ort.InferenceSession.create(model, { ...JSON.parse(options), logSeverityLevel: 0, logVerbosityLevel: 0 });';
  const args = ['--input-type=module', '-e', code, import.meta.resolve('onnxruntime-node'), model, JSON.stringify(options)];
  const output = await new Promise((resolve, reject) => {
    execFile(process.execPath, args, { maxBuffer: 1 << 30 }, (error, stdout, stderr) => {
      if (error) reject(new Error(`the placement probe of '${model}' failed: ${String(stderr).slice(-2000)}`));
      else resolve(`${stdout}\n${stderr}`);
    });
  });
  return parsePlacement(/** @type {string} */ (output).split('\n'));
}

/**
 * Write the trainer's LoRA adapters as a PEFT directory (`adapter_model.safetensors` + `adapter_config.json`),
 * which `peft.PeftModel.from_pretrained(base, directory)` and onnxblocks' `TrainingSession.load_adapters` read.
 * Each file is written beside its destination and renamed into place.
 * @param {Trainer} trainer  a trainer of adapter artifacts (from `loadTrainer`)
 * @param {string} directory  created if missing
 * @returns {Promise<string>} the directory
 */
export async function saveAdapters(trainer, directory) {
  if (!trainer.lora) {
    throw new TypeError("saveAdapters: the trainer's artifacts have no LoRA adapters (no 'onnxblocks.lora' metadata in the step model); generate them with generate_artifacts(..., lora=LoraConfig(...))");
  }
  const { weights, config } = peftAdapterFiles(trainer.lora, (await trainer.state()).tensors);
  await mkdir(directory, { recursive: true });
  for (const [name, bytes] of /** @type {const} */ ([[ADAPTER_FILES.weights, weights], [ADAPTER_FILES.config, config]])) {
    const path = join(directory, name);
    const temp = `${path}.${process.pid}.tmp`;
    await writeFile(temp, bytes);
    await rename(temp, path);
  }
  return directory;
}

/**
 * Write the trained inference model: the artifacts' `inference_model.onnx` template filled with the trainer's
 * parameters (the template and its `.json` layout come from Python's `onnxblocks.web.write_inference_template`).
 * @param {string} directory  the artifact directory holding the template
 * @param {Trainer} trainer
 * @param {string} path  the `.onnx` file to write (replaced atomically)
 * @returns {Promise<string>} the path
 */
export async function exportInferenceModel(directory, trainer, path) {
  const templatePath = join(directory, FILES.inferenceModel);
  let template;
  let layoutText;
  try {
    [template, layoutText] = await Promise.all([readFile(templatePath), readFile(`${templatePath}.json`, 'utf8')]);
  } catch (error) {
    if (/** @type {NodeJS.ErrnoException} */ (error).code === 'ENOENT') {
      throw new Error(`no inference model template '${templatePath}' (+ .json): write it in Python with onnxblocks.web.write_inference_template('${directory}', ['<output>'])`);
    }
    throw error;
  }
  const bytes = new Uint8Array(template.buffer, template.byteOffset, template.byteLength);
  const layout = parseLayout(JSON.parse(layoutText), bytes.length);
  const filled = fillInferenceModel(bytes, layout, (await trainer.state()).tensors);
  const temp = `${path}.${process.pid}.tmp`;
  await writeFile(temp, filled);
  await rename(temp, path);
  return path;
}
