// Greedy generation by Transformers.js in Node from a local hub folder (no download).
// Usage: node tjs_generate.mjs '{"root", "model", "dtype", "prompt": [ids], "steps"}'
// Prints one JSON line: {"tokens": [the generated ids]}.
// Run from the folder whose node_modules holds @huggingface/transformers (ESM resolves from there).
import { createRequire } from "node:module";
import path from "node:path";
import { pathToFileURL } from "node:url";

const request = JSON.parse(process.argv[2]);
const require = createRequire(path.join(process.cwd(), "package.json"));
const entry = require.resolve("@huggingface/transformers");
const { env, AutoModelForCausalLM, Tensor } = await import(pathToFileURL(entry).href);

env.allowRemoteModels = false;
env.allowLocalModels = true;
env.localModelPath = request.root;

const model = await AutoModelForCausalLM.from_pretrained(request.model, { dtype: request.dtype });
const n = request.prompt.length;
const ids = new Tensor("int64", BigInt64Array.from(request.prompt.map(BigInt)), [1, n]);
const mask = new Tensor("int64", new BigInt64Array(n).fill(1n), [1, n]);
const out = await model.generate({
  input_ids: ids,
  attention_mask: mask,
  max_new_tokens: request.steps,
  do_sample: false,
  eos_token_id: null, // no stop at end-of-sequence: always `steps` tokens, as the reference
});
const all = Array.from(out.data, (v) => Number(v));
console.log(JSON.stringify({ tokens: all.slice(n) }));
