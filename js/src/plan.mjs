// A training plan: the batches and learning rates of a run, in one safetensors file, read the same way by
// `onnxblocks-train --plan` (Node) and the browser's plan page (demo/plan.html).
//
//   tensors   `train/<i>/<input>` (batch i of the step model's user inputs), `eval/<i>/<input>` likewise
//   metadata  `learning_rates`: a JSON list, one rate per step (optional: the caller's rate otherwise)

/** @typedef {import('./safetensors.mjs').NamedTensor} NamedTensor */

/**
 * Group a plan's tensors `<split>/<i>/<input>` into batches, each `{input: tensor}`.
 * @param {Map<string, NamedTensor>} tensors
 * @param {string} split  `train` or `eval`
 * @returns {Record<string, NamedTensor>[]}
 * @throws {RangeError} for an index that is not a number, or a batch missing between others
 */
export function planBatches(tensors, split) {
  /** @type {Record<string, NamedTensor>[]} */
  const out = [];
  for (const [key, tensor] of tensors) {
    const [head, index, ...rest] = key.split('/');
    if (head !== split || rest.length === 0) continue;
    const i = Number(index);
    if (!Number.isSafeInteger(i) || i < 0) throw new RangeError(`plan tensor '${key}': '${index}' is not a batch index`);
    (out[i] ??= {})[rest.join('/')] = tensor;
  }
  for (let i = 0; i < out.length; i++) if (!out[i]) throw new RangeError(`plan: ${split} batch ${i} is missing`);
  return out;
}

/**
 * The plan's learning rates (metadata `learning_rates`), or null when it has none.
 * @param {Record<string, string>} metadata
 * @returns {number[] | null}
 * @throws {TypeError} when `learning_rates` is not a JSON list of finite numbers
 */
export function planRates(metadata) {
  if (!metadata.learning_rates) return null;
  const rates = JSON.parse(metadata.learning_rates);
  if (!Array.isArray(rates) || rates.some((r) => typeof r !== 'number' || !Number.isFinite(r))) {
    throw new TypeError('plan metadata learning_rates must be a JSON list of finite numbers, one per step');
  }
  return rates;
}
