// Train any portable artifacts on a plan file in the browser and time each step: what `onnxblocks-train --plan`
// does in Node (src/plan.mjs reads the same file), for benchmarks and for models without a page of their own.
//
//   plan.html?artifacts=../cnn/&plan=../cnn_plan.safetensors[&steps=N][&lr=X][&threads=N][&flat=0][&ep=webgpu[&bundle=webgpu]]
//
// `artifacts` is the folder of step_model.onnx and params.safetensors (and base_weights.bin); `plan` holds
// `train/<i>/<input>` batches (steps cycle through them) and may hold `learning_rates` (else ?lr=). Only the
// step model is opened (on WASM the flat step model when served; &flat=0: step_model.onnx). `window.onnxblocksDemo` reports the losses and each step's seconds (the first steps
// run while the browser is still compiling onnxruntime-web's WASM to optimized code: read both ends).

import { fetchBytes, loadTrainer, ort, parseSafetensors } from '../src/browser.mjs';
import { planBatches, planRates } from '../src/plan.mjs';
import { configureWasm, runtime, runtimeLine, runtimeName, weightBytes } from './providers.mjs';

const query = new URLSearchParams(location.search);
const $ = (/** @type {string} */ id) => /** @type {HTMLElement} */ (document.getElementById(id));

/**
 * What the page reports (read by js/tools/browser-run.mjs through `window.onnxblocksDemo`).
 * @type {{status: string, steps: number, losses: number[], stepSeconds: number[], seconds: number,
 *   stepsPerSecond: number | null, error: string | null, onnxruntime: string | undefined, ep: string, bundle: string,
 *   crossOriginIsolated: boolean, threads: number, loadSeconds: number, stepModel: string}}
 */
const report = {
  status: 'loading',
  steps: 0,
  losses: [],
  stepSeconds: [],
  seconds: 0,
  stepsPerSecond: null,
  error: null,
  onnxruntime: ort.env.versions?.web,
  ep: runtime.ep,
  bundle: runtime.bundle,
  crossOriginIsolated,
  threads: 1,
  loadSeconds: 0,
  stepModel: '',
};
Object.assign(window, { onnxblocksDemo: report });

async function main() {
  const artifacts = query.get('artifacts');
  const planUrl = query.get('plan');
  if (!artifacts || !planUrl) throw new TypeError('plan.html needs ?artifacts=FOLDER/&plan=FILE.safetensors');
  report.threads = configureWasm(query, await weightBytes(artifacts.endsWith('/') ? artifacts : `${artifacts}/`, ['params.safetensors', 'base_weights.bin']));
  const started = performance.now();
  const [plan, { trainer }] = await Promise.all([
    fetchBytes(planUrl).then((bytes) => parseSafetensors(bytes, planUrl)),
    loadTrainer(artifacts.endsWith('/') ? artifacts : `${artifacts}/`, { evaluate: false, executionProviders: runtime.providers, sessionOptions: { logSeverityLevel: 3 }, flat: query.get('flat') !== '0' }),
  ]);
  report.loadSeconds = (performance.now() - started) / 1000;
  report.stepModel = trainer.flatLayout ? 'flat_step_model.onnx' : 'step_model.onnx';
  $('runtime').textContent = runtimeLine(report.threads, null);
  const batches = planBatches(plan.tensors, 'train');
  if (!batches.length) throw new RangeError(`plan '${planUrl}' has no train/<i>/<input> tensors`);
  const rates = planRates(plan.metadata);
  const lr = query.has('lr') ? Number(query.get('lr')) : null;
  if (!rates && (lr === null || !Number.isFinite(lr))) throw new TypeError('give ?lr=X, or learning_rates in the plan metadata');
  const steps = query.has('steps') ? Number(query.get('steps')) : rates ? rates.length : batches.length;
  if (rates && rates.length < steps) throw new RangeError(`the plan has ${rates.length} learning rates for ${steps} steps`);
  report.status = 'training';
  let lastShown = 0;
  for (let i = 0; i < steps; i++) {
    const before = performance.now();
    const { loss } = await trainer.trainStep(batches[i % batches.length], rates ? rates[i] : /** @type {number} */ (lr));
    const after = performance.now();
    report.stepSeconds.push((after - before) / 1000);
    report.seconds += (after - before) / 1000;
    report.losses.push(loss);
    report.steps = i + 1;
    if (after - lastShown > 250 || i === steps - 1) {
      report.stepsPerSecond = report.steps / report.seconds;
      $('status').textContent = `${runtimeName()}  step ${report.steps}/${steps}  loss ${loss.toFixed(4)}  ${(1000 / report.stepsPerSecond).toFixed(2)} ms/step`;
      await new Promise((resolve) => setTimeout(resolve, 0)); // let the page paint
      lastShown = performance.now();
    }
  }
  await trainer.release();
  report.status = 'done';
}

main().catch((error) => {
  report.status = 'error';
  report.error = error instanceof Error ? `${error.message}\n${error.stack ?? ''}` : String(error);
  $('error').textContent = report.error;
  $('status').textContent = 'failed';
});
