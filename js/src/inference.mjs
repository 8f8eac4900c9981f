// The trained inference model as an `.onnx` file: a template written at generation time, filled with the weights.
//
// `onnxblocks.web.inference.write_inference_template` (Python) exports the inference model of
// the artifacts (the eval model cut to its forward outputs, the parameters as initializers) and
// a layout, `<model>.json`, that says where each parameter's bytes lie in the file. Filling it
// is copying those bytes: no protobuf code is needed, and the result is an ONNX model that
// onnxruntime (Python), onnxruntime-web and onnxruntime-node run as is. This module imports nothing.

/** @typedef {import('./safetensors.mjs').NamedTensor} NamedTensor */
/** @typedef {import('./safetensors.mjs').DType} DType */

/** The value of the layout's `format` this client reads. */
export const TEMPLATE_FORMAT = 'onnxblocks-inference-template/1';

/**
 * Where one parameter's bytes lie in the template.
 * @typedef {object} TemplateTensor
 * @property {string} name
 * @property {DType} dtype
 * @property {number[]} shape
 * @property {number} offset  byte offset of its little-endian data in the `.onnx` file
 * @property {number} length  its size in bytes
 */

/**
 * The layout of an inference-model template (`inference_model.onnx.json`).
 * @typedef {object} TemplateLayout
 * @property {string} format
 * @property {string} model  the template's file name
 * @property {string[]} inputs  the inference model's inputs
 * @property {string[]} outputs  its outputs
 * @property {TemplateTensor[]} tensors
 */

/**
 * Check a parsed layout and return it typed.
 * @param {unknown} json  `JSON.parse` of `inference_model.onnx.json`
 * @param {number} size  the template's size in bytes
 * @returns {TemplateLayout}
 * @throws {TypeError | RangeError} when it is not a layout of this format, or does not fit the template
 */
export function parseLayout(json, size) {
  const layout = /** @type {TemplateLayout} */ (json);
  if (!layout || typeof layout !== 'object' || layout.format !== TEMPLATE_FORMAT) {
    throw new TypeError(`inference model layout: format is ${JSON.stringify(layout?.format)}, expected '${TEMPLATE_FORMAT}'; write it with onnxblocks.web.inference.write_inference_template`);
  }
  if (!Array.isArray(layout.tensors)) throw new TypeError('inference model layout: "tensors" is not a list');
  for (const t of layout.tensors) {
    if (!Number.isSafeInteger(t.offset) || !Number.isSafeInteger(t.length) || t.offset < 0 || t.length <= 0 || t.offset + t.length > size) {
      throw new RangeError(`inference model layout: tensor '${t.name}' lies at bytes [${t.offset}, ${t.offset + t.length}) outside the ${size}-byte model`);
    }
  }
  return layout;
}

/**
 * A copy of the template with each parameter's bytes replaced by the trained values.
 * @param {Uint8Array} template  the `.onnx` template's bytes (not modified)
 * @param {TemplateLayout} layout  its layout (`parseLayout`)
 * @param {Map<string, NamedTensor>} parameters  e.g. `(await trainer.state()).tensors`
 * @returns {Uint8Array}  a self-contained `.onnx` model
 * @throws {RangeError} when a parameter is missing or its dtype or shape differs from the template's
 */
export function fillInferenceModel(template, layout, parameters) {
  const checked = parseLayout(layout, template.length);
  const out = template.slice();
  for (const entry of checked.tensors) {
    const tensor = parameters.get(entry.name);
    if (!tensor) throw new RangeError(`fillInferenceModel: no value for parameter '${entry.name}'`);
    if (tensor.dtype !== entry.dtype || String(tensor.shape) !== String(entry.shape)) {
      throw new RangeError(`fillInferenceModel: parameter '${entry.name}' is ${tensor.dtype} [${tensor.shape}], the model's ${entry.dtype} [${entry.shape}]`);
    }
    const bytes = new Uint8Array(tensor.data.buffer, tensor.data.byteOffset, tensor.data.byteLength);
    if (bytes.length !== entry.length) throw new RangeError(`fillInferenceModel: parameter '${entry.name}' has ${bytes.length} bytes, the model ${entry.length}`);
    out.set(bytes, entry.offset);
  }
  return out;
}
