#!/usr/bin/env node
// Train portable artifacts in Node on the batches of a plan file; print a JSON report.
//
//   onnxblocks-train ARTIFACTS --plan plan.safetensors [--steps N] [--lr 0.01] [--state FILE]
//                    [--save trained.safetensors] [--eval-outputs eval.safetensors] [--threads 1]
//                    [--save-adapters DIR] [--ep webgpu] [--placement] [--no-flat]
//
// The plan is a safetensors file: tensors `train/<i>/<input>` (batch i of the step model's
// user inputs) and optionally `eval/<i>/<input>` (eval batches, run after training); its
// __metadata__ may hold `learning_rates`, a JSON list with one rate per step (else --lr).
// Steps cycle through the training batches. The report (one JSON line on stdout):
// {"losses": [...], "evalLosses": [...], "step": n, "seconds": s, "stepSeconds": [each step's s], "onnxruntime": version}.
// --save-adapters writes the LoRA adapters of adapter artifacts as a PEFT directory (docs/lora.md).
// --ep picks onnxruntime-node's execution provider (cpu, the default, or webgpu; the CPU takes what the
// provider lacks); the report then holds "executionProviders", and with --placement "placement": how many
// nodes of the step model run on each provider, and which op types (docs/web.md, "On the GPU").
// On the CPU the flat step model `flat_step_model.onnx` is trained when the artifacts have it (one state
// tensor each way, same numbers; docs/web.md, "WASM speed"); --no-flat trains step_model.onnx. The report's
// "stepModel" names the file trained.
//
//   onnxblocks-train --federate URL --data local.npz [--threads 1]
//
// joins a Flower federation through an onnxblocks bridge (docs/federated.md): URL is a relay slot
// (http://127.0.0.1:P/slots/K) or the relay (a free node slot is claimed); the artifacts come from the
// relay; each round trains on the .npz's arrays (by input name, or arr_0, arr_1, ...). One JSON line per
// round, then {"rounds": n, "slot": url} when the federation ends.

import { readFile, writeFile } from 'node:fs/promises';
import { parseArgs } from 'node:util';
import { inflateRawSync } from 'node:zlib';

import { loadTrainer, ort, parseSafetensors, saveAdapters, serializeSafetensors, writeState } from '../src/node.mjs';
import { federate } from '../src/federate.mjs';
import { parseNpz } from '../src/npz.mjs';
import { planBatches, planRates } from '../src/plan.mjs';

const USAGE = 'usage: onnxblocks-train ARTIFACTS --plan FILE [--steps N] [--lr X] [--state FILE] [--save FILE] [--eval-outputs FILE] [--threads N] [--save-adapters DIR] [--ep cpu|webgpu] [--placement] [--no-flat]\n       onnxblocks-train --federate URL --data FILE.npz [--threads N]';

/** @typedef {import('../src/safetensors.mjs').NamedTensor} NamedTensor */

async function main() {
  const { values, positionals } = parseArgs({
    allowPositionals: true,
    options: {
      plan: { type: 'string' },
      steps: { type: 'string' },
      lr: { type: 'string' },
      state: { type: 'string' },
      save: { type: 'string' },
      'save-adapters': { type: 'string' },
      'eval-outputs': { type: 'string' },
      threads: { type: 'string', default: '1' },
      ep: { type: 'string', default: 'cpu' },
      placement: { type: 'boolean' },
      'no-flat': { type: 'boolean' },
      federate: { type: 'string' },
      data: { type: 'string' },
      help: { type: 'boolean', short: 'h' },
    },
  });
  if (values.help) {
    console.log(USAGE);
    return 0;
  }
  if (values.federate !== undefined) return joinFederation(values.federate, values.data, Number(values.threads));
  if (positionals.length !== 1 || !values.plan) throw new TypeError(USAGE);
  const plan = parseSafetensors(await readFile(values.plan), values.plan);
  const train = planBatches(plan.tensors, 'train');
  const evaluation = planBatches(plan.tensors, 'eval');
  const rates = planRates(plan.metadata);
  const steps = values.steps !== undefined ? Number(values.steps) : rates ? rates.length : train.length;
  if (!Number.isSafeInteger(steps) || steps < 0) throw new RangeError(`--steps must be a non-negative integer, got ${values.steps}`);
  if (steps > 0 && !train.length) throw new RangeError(`plan '${values.plan}' has no train/<i>/<input> tensors`);
  const lr = values.lr !== undefined ? Number(values.lr) : null;
  if (lr !== null && !Number.isFinite(lr)) throw new TypeError(`--lr must be a finite number, got ${values.lr}`);
  if (!rates && lr === null) throw new TypeError('give --lr, or learning_rates in the plan metadata');
  if (rates && rates.length < steps) throw new RangeError(`the plan has ${rates.length} learning rates for ${steps} steps`);
  const threads = Number(values.threads);

  const trainer = await loadTrainer(positionals[0], {
    state: values.state,
    evaluate: evaluation.length > 0,
    sessionOptions: { intraOpNumThreads: threads, interOpNumThreads: 1 },
    executionProviders: values.ep === 'cpu' ? ['cpu'] : [values.ep, 'cpu'],
    flat: !values['no-flat'],
  });
  const placement = values.placement ? await trainer.placement() : undefined;
  const started = performance.now();
  const losses = [];
  const stepSeconds = [];
  for (let i = 0; i < steps; i++) {
    const before = performance.now();
    const { loss } = await trainer.trainStep(train[i % train.length], rates ? rates[i] : /** @type {number} */ (lr));
    stepSeconds.push((performance.now() - before) / 1000);
    losses.push(loss);
  }
  const seconds = (performance.now() - started) / 1000;
  const evalLosses = [];
  /** @type {NamedTensor[]} */
  const evalOutputs = [];
  for (const [i, batch] of evaluation.entries()) {
    const { loss, outputs } = await trainer.evalStep(batch);
    evalLosses.push(loss);
    for (const [name, tensor] of Object.entries(outputs)) {
      const data = /** @type {any} */ (await tensor.getData());
      evalOutputs.push({ name: `eval/${i}/${name}`, dtype: /** @type {any} */ (tensor.type), shape: [...tensor.dims], data });
    }
  }
  if (values.save) await writeState(values.save, await trainer.state());
  if (values['save-adapters']) await saveAdapters(trainer, values['save-adapters']);
  if (values['eval-outputs']) await writeFile(values['eval-outputs'], serializeSafetensors(evalOutputs));
  await trainer.release();
  const onnxruntime = ort.env.versions?.node ?? null;
  console.log(JSON.stringify({ losses, evalLosses, step: trainer.step, seconds, stepSeconds, onnxruntime, executionProviders: trainer.executionProviders, placement, stepModel: trainer.flatLayout ? 'flat_step_model.onnx' : 'step_model.onnx' }));
  return 0;
}

/**
 * Train the rounds of a federation through a bridge (src/federate.mjs), on the local .npz.
 * @param {string} url
 * @param {string | undefined} data
 * @param {number} threads
 */
async function joinFederation(url, data, threads) {
  if (!data) throw new TypeError(`--federate needs --data FILE.npz (the local training data)\n${USAGE}`);
  const arrays = await parseNpz(await readFile(data), { what: data, inflate: (b) => inflateRawSync(b) });
  const { rounds, slot } = await federate({
    ort: /** @type {any} */ (ort),
    url,
    data: arrays,
    kind: 'node',
    runtime: `onnxruntime-node ${ort.env.versions?.node ?? ''}`.trim(),
    sessionOptions: { executionProviders: ['cpu'], intraOpNumThreads: threads, interOpNumThreads: 1 },
    onRound: (report) => console.log(JSON.stringify(report)),
  });
  console.log(JSON.stringify({ rounds, slot }));
  return 0;
}

main().then(
  (code) => (process.exitCode = code),
  (error) => {
    console.error(`onnxblocks-train: ${error instanceof Error ? error.message : String(error)}`);
    process.exitCode = 1;
  },
);
