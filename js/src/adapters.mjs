// LoRA adapters as a Hugging Face PEFT directory: `adapter_model.safetensors` + `adapter_config.json`.
//
// Artifacts generated with `generate_artifacts(..., lora=LoraConfig(...))` (onnxblocks docs/lora.md)
// train only the adapters: the state file holds them and their moments, the frozen base stays in
// the models. Their step and eval models carry the model metadata `onnxblocks.lora`, JSON
// `{"config": <adapter_config.json>, "targets": {<module>: {"lora_A": <name>, "lora_B": <name>,
// "in_features": n, "out_features": m, ...}}}`. From it and the trained tensors this module writes
// what `peft.PeftModel.from_pretrained(base_model, directory)` and onnxblocks'
// `TrainingSession.load_adapters(directory)` read: the tensors under PEFT's keys
// `base_model.model.<module>.lora_A.weight` ([r, in_features]) and `...lora_B.weight` ([out_features, r]).
// This module imports only the safetensors writer and the protobuf reader: browser and Node alike.

import { modelMetadata } from './onnx_proto.mjs';
import { serializeSafetensors } from './safetensors.mjs';

/** @typedef {import('./safetensors.mjs').NamedTensor} NamedTensor */

/** Model metadata key of the LoRA record (onnxblocks `_core/contracts.py`: LORA_METADATA). */
export const LORA_METADATA = 'onnxblocks.lora';
/** The files of a PEFT adapter directory. */
export const ADAPTER_FILES = Object.freeze({ weights: 'adapter_model.safetensors', config: 'adapter_config.json' });

/**
 * One adapted layer of the LoRA record.
 * @typedef {object} LoraTarget
 * @property {string} lora_A  the `[r, in_features]` adapter's parameter name
 * @property {string} lora_B  the `[out_features, r]` adapter's parameter name
 * @property {number} in_features
 * @property {number} out_features
 */

/**
 * The LoRA record of a model (`onnxblocks.lora`).
 * @typedef {object} LoraRecord
 * @property {Record<string, unknown> & {r: number}} config  the PEFT config (`adapter_config.json`)
 * @property {Record<string, LoraTarget>} targets  the adapted layers by torch module path
 */

/**
 * The LoRA record of a model's bytes, or null when it has none.
 * @param {Uint8Array} modelBytes
 * @param {string} [what]  how to name the model in errors
 * @returns {LoraRecord | null}
 * @throws {TypeError} on a malformed record
 */
export function loraRecord(modelBytes, what = 'model') {
  const text = modelMetadata(modelBytes)[LORA_METADATA];
  if (text === undefined) return null;
  let record;
  try {
    record = JSON.parse(text);
  } catch {
    throw new TypeError(`${what}: metadata '${LORA_METADATA}' is not JSON`);
  }
  const config = record?.config;
  const targets = record?.targets;
  if (typeof config !== 'object' || config === null || !Number.isSafeInteger(config.r) || config.r < 1) {
    throw new TypeError(`${what}: metadata '${LORA_METADATA}' has no config with a positive integer r`);
  }
  if (typeof targets !== 'object' || targets === null || Array.isArray(targets)) {
    throw new TypeError(`${what}: metadata '${LORA_METADATA}' has no targets object`);
  }
  for (const [module, target] of Object.entries(targets)) {
    const ok =
      typeof target?.lora_A === 'string' &&
      typeof target?.lora_B === 'string' &&
      Number.isSafeInteger(target?.in_features) &&
      Number.isSafeInteger(target?.out_features);
    if (!ok) throw new TypeError(`${what}: metadata '${LORA_METADATA}', target '${module}' lacks lora_A, lora_B, in_features or out_features`);
  }
  return { config, targets };
}

/**
 * The two files of a PEFT adapter directory, from a LoRA record and the trained tensors.
 * @param {LoraRecord} lora
 * @param {Map<string, NamedTensor>} tensors  the parameters by name (e.g. `(await trainer.state()).tensors`)
 * @returns {{weights: Uint8Array, config: string}}  `adapter_model.safetensors` and `adapter_config.json`
 * @throws {RangeError} when an adapter is missing or misshapen
 */
export function peftAdapterFiles(lora, tensors) {
  const r = lora.config.r;
  /** @type {NamedTensor[]} */
  const out = [];
  for (const [module, target] of Object.entries(lora.targets)) {
    for (const [which, name, shape] of /** @type {const} */ ([
      ['A', target.lora_A, [r, target.in_features]],
      ['B', target.lora_B, [target.out_features, r]],
    ])) {
      const tensor = tensors.get(name);
      if (!tensor) throw new RangeError(`adapters: no tensor '${name}' (lora_${which} of '${module}') in the state`);
      if (tensor.dtype !== 'float32' || tensor.shape.join(',') !== shape.join(',')) {
        throw new RangeError(`adapters: '${name}' is ${tensor.dtype} [${tensor.shape}], expected float32 [${shape}]`);
      }
      out.push({ ...tensor, name: `base_model.model.${module}.lora_${which}.weight` });
    }
  }
  return { weights: serializeSafetensors(out, { format: 'pt' }), config: `${JSON.stringify(lora.config, null, 2)}\n` };
}
