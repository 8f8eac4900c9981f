// The LoRA browser demo: fine-tune the adapters of a small LLaMA with onnxruntime-web (WASM), download them
// as a PEFT directory.
//
// `onnxblocks demo --lora --web` writes the site:
//   demo/lora.html   this page;  src/  the training client;  ort/  onnxruntime-web's WASM runtime
//   lora/            portable LoRA artifacts: step_model.onnx, eval_model.onnx, params.safetensors (the adapters
//                    and their moments), base_weights.bin (the frozen base, when stored apart)
//   lora_plan.safetensors  train/<i>/<input> batches (counting by two), held_out/<input>, prompts ([rows, 3]);
//                    metadata learning_rate, steps
//
// Query parameters: ?steps=N stops after N steps; ?ep=webgpu (&bundle=webgpu) trains on WebGPU (runtime.js);
// ?threads=N sets the WASM threads; ?placement=1 shows where the step's nodes run. `window.onnxblocksDemo` reports progress to tests.

import { downloadAdapters, fetchBytes, loadTrainer, ort, parseSafetensors } from '../src/browser.mjs';
import { drawLoss } from './plot.mjs';
import { configureWasm, providerSelector, runtime, runtimeLine, runtimeName, weightBytes } from './providers.mjs';

const query = new URLSearchParams(location.search);
const $ = (/** @type {string} */ id) => /** @type {HTMLElement} */ (document.getElementById(id));

/**
 * What the page reports (read by the browser test through `window.onnxblocksDemo`).
 * @type {{status: string, steps: number, losses: number[], lossBefore: number | null, lossAfter: number | null,
 *   before: number[][], after: number[][], prompts: number[][], error: string | null, onnxruntime: string | undefined,
 *   ep: string, bundle: string, crossOriginIsolated: boolean, threads: number, stepSeconds: number[], runtimeShown: string,
 *   placement: import('../src/placement.mjs').Placement | null}}
 */
const report = {
  status: 'loading',
  steps: 0,
  losses: [],
  lossBefore: null,
  lossAfter: null,
  before: [],
  after: [],
  prompts: [],
  error: null,
  onnxruntime: ort.env.versions?.web,
  ep: runtime.ep,
  bundle: runtime.bundle,
  crossOriginIsolated,
  threads: 1,
  stepSeconds: [],
  runtimeShown: '',
  placement: null,
};
Object.assign(window, { onnxblocksDemo: report });

/** @param {unknown} error */
function fail(error) {
  report.status = 'error';
  report.error = error instanceof Error ? `${error.message}\n${error.stack ?? ''}` : String(error);
  $('error').textContent = report.error;
  $('status').textContent = 'failed';
}

async function main() {
  report.threads = configureWasm(query, await weightBytes('../lora/', ['params.safetensors', 'base_weights.bin']));
  providerSelector(/** @type {HTMLSelectElement} */ ($('ep')));
  const plan = parseSafetensors(await fetchBytes('../lora_plan.safetensors'), 'lora_plan.safetensors');
  const { trainer } = await loadTrainer('../lora/', { executionProviders: runtime.providers, sessionOptions: { logSeverityLevel: 3 } });
  report.runtimeShown = $('runtime').textContent = runtimeLine(report.threads, null);
  if (query.has('placement')) {
    // opt-in: a second session of the step model, as large as the first, opened and closed to read the log
    report.placement = await trainer.placement();
    report.runtimeShown = $('runtime').textContent = runtimeLine(report.threads, report.placement);
  }
  const [idsName, labelsName] = trainer.inputNames;
  const get = (/** @type {string} */ name) => {
    const tensor = plan.tensors.get(name);
    if (!tensor) throw new Error(`lora_plan.safetensors has no '${name}'`);
    return tensor;
  };
  /** @type {import('../src/safetensors.mjs').NamedTensor[][]} */
  const batches = [];
  for (let i = 0; plan.tensors.has(`train/${i}/${idsName}`); i++) batches.push([get(`train/${i}/${idsName}`), get(`train/${i}/${labelsName}`)]);
  const heldOut = [get(`held_out/${idsName}`), get(`held_out/${labelsName}`)];
  const [rows, seq] = heldOut[0].shape;
  const lr = Number(plan.metadata.learning_rate);
  const total = Math.min(Number(plan.metadata.steps), query.has('steps') ? Number(query.get('steps')) : Infinity);
  const promptTensor = get('prompts');
  /** @type {number[][]} */
  const prompts = [];
  for (let r = 0; r < promptTensor.shape[0]; r++) {
    prompts.push(Array.from(/** @type {BigInt64Array} */ (promptTensor.data).subarray(r * 3, r * 3 + 3), Number));
  }
  report.prompts = prompts;

  /** Greedy continuations of the prompts by the eval model (the current adapters): a fixed causal window. */
  const generate = async () => {
    const window_ = new BigInt64Array(rows * seq);
    prompts.forEach((p, r) => p.forEach((t, k) => (window_[r * seq + k] = BigInt(t))));
    const labels = new BigInt64Array(rows * seq);
    for (let t = 3; t < seq; t++) {
      const { outputs } = await trainer.evalStep([new ort.Tensor('int64', window_, [rows, seq]), new ort.Tensor('int64', labels, [rows, seq])]);
      const logits = /** @type {Float32Array} */ (Object.values(outputs)[0].data);
      const vocab = logits.length / (rows * seq);
      for (let r = 0; r < prompts.length; r++) {
        const at = (r * seq + t - 1) * vocab;
        let best = 0;
        for (let v = 1; v < vocab; v++) if (logits[at + v] > logits[at + best]) best = v;
        window_[r * seq + t] = BigInt(best);
      }
    }
    return prompts.map((_, r) => Array.from(window_.subarray(r * seq + 3, r * seq + seq), Number));
  };
  const show = () => {
    drawLoss(/** @type {HTMLCanvasElement} */ ($('loss')), report.losses, total);
    $('status').textContent = `${runtimeName()}  step ${report.steps}/${total}  loss ${report.losses.at(-1)?.toFixed(4) ?? '-'}  held-out loss ${report.lossBefore?.toFixed(3)} -> ${report.lossAfter?.toFixed(3) ?? '…'}`;
  };

  report.lossBefore = (await trainer.evalStep(heldOut)).loss;
  report.before = await generate();
  report.status = 'training';
  for (let step = 0; step < total; step++) {
    const before = performance.now();
    const { loss } = await trainer.trainStep(batches[step % batches.length], lr);
    report.stepSeconds.push((performance.now() - before) / 1000);
    report.losses.push(loss);
    report.steps = step + 1;
    if (step % 5 === 4 || step === total - 1) {
      show();
      await new Promise((resolve) => setTimeout(resolve, 0));
    }
  }
  report.lossAfter = (await trainer.evalStep(heldOut)).loss;
  report.after = await generate();
  show();
  $('generations').textContent = ['prompt | before | after', ...prompts.map((p, r) => `${p.join(' ')} | ${report.before[r].join(' ')} | ${report.after[r].join(' ')}`)].join('\n');
  const button = /** @type {HTMLButtonElement} */ ($('download-adapters'));
  button.disabled = false;
  button.onclick = () => downloadAdapters(trainer).catch(fail);
  report.status = 'done';
}

main().catch(fail);
