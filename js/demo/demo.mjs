// The browser demo: train the spiral classifier of `onnxblocks demo` with onnxruntime-web (WASM).
//
// The page is static. `onnxblocks demo --web` writes the site as the repository lays it out:
//   demo/        this page;  src/  the training client;  ort/  onnxruntime-web's WASM runtime
//   artifacts/   step_model.onnx, eval_model.onnx, params.safetensors  (portable artifacts)
//   spirals.safetensors  the plan: features, labels, val_features, val_labels, order ([epochs, n]
//                        row order of each epoch) and learning_rates (one per step): the batches
//                        and the schedule of the Python demo, so Python can replay them exactly
//
//   artifacts/inference_model.onnx (+ .json)  the inference model with the initial weights and where they lie:
//                        "Download model" fills it with the trained weights (src/inference.mjs)
//
// Query parameters: ?steps=N stops after N steps (the parity test uses it); ?grid=N sets the
// decision-region resolution; ?epochs=N and ?lr=X (the form) train N epochs with the plan's
// schedule stretched to them and scaled to peak X (the defaults replay the plan exactly);
// ?ep=webgpu (&bundle=webgpu) trains on WebGPU (runtime.js), ?threads=N sets the WASM threads.
// `window.onnxblocksDemo` reports progress to tests.

import { downloadBytes, downloadState, fetchBytes, fetchInferenceTemplate, fillInferenceModel, loadTrainer, ort, parseSafetensors, serializeState } from '../src/browser.mjs';
import { drawLoss, drawRegions, gridPoints, schedule, softmaxRows, stepsPerSecond } from './plot.mjs';
import { configureWasm, providerSelector, runtime, runtimeLine, runtimeName, weightBytes } from './providers.mjs';

const query = new URLSearchParams(location.search);
const maxSteps = query.has('steps') ? Number(query.get('steps')) : Infinity;
const gridSize = Number(query.get('grid') ?? 72);
/** The file name the trained model downloads as. */
const MODEL_FILE = 'spiral_classifier.onnx';
const $ = (/** @type {string} */ id) => /** @type {HTMLElement} */ (document.getElementById(id));

/**
 * What the page reports (read by the browser test through `window.onnxblocksDemo`).
 * @type {{status: string, steps: number, losses: number[], valAccuracy: number[], error: string | null,
 *   onnxruntime: string | undefined, stepsPerSecond: number | null, epochs: number, peakLearningRate: number,
 *   shown: string[], exportState: () => Promise<string>, ep: string, bundle: string, crossOriginIsolated: boolean,
 *   threads: number, placement: import('../src/placement.mjs').Placement | null, runtimeShown: string}}
 */
const report = {
  status: 'loading',
  steps: 0,
  losses: [],
  valAccuracy: [],
  error: null,
  onnxruntime: ort.env.versions?.web,
  stepsPerSecond: null,
  epochs: 0,
  peakLearningRate: 0,
  shown: [],
  exportState: async () => '',
  ep: runtime.ep,
  bundle: runtime.bundle,
  crossOriginIsolated,
  threads: 1,
  placement: null,
  runtimeShown: '',
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
  report.threads = configureWasm(query, await weightBytes('../artifacts/', ['params.safetensors']));
  providerSelector(/** @type {HTMLSelectElement} */ ($('ep')));

  const plan = parseSafetensors(await fetchBytes('../spirals.safetensors'), 'spirals.safetensors');
  const get = (/** @type {string} */ name) => {
    const tensor = plan.tensors.get(name);
    if (!tensor) throw new Error(`spirals.safetensors has no '${name}'`);
    return tensor;
  };
  const features = /** @type {Float32Array} */ (get('features').data);
  const labels = /** @type {BigInt64Array} */ (get('labels').data);
  const valFeatures = get('val_features');
  const valLabels = get('val_labels');
  const order = /** @type {Int32Array} */ (get('order').data);
  const planRates = /** @type {Float64Array} */ (get('learning_rates').data);
  const rows = labels.length;
  const batchSize = Number(plan.metadata.batch_size);
  const classes = Number(plan.metadata.classes);
  const extent = Number(plan.metadata.extent);
  const perEpoch = Math.ceil(rows / batchSize);
  const planEpochs = Math.round(planRates.length / perEpoch);
  const planPeak = planRates.reduce((a, b) => Math.max(a, b), 0);
  const epochs = positive(query.get('epochs'), planEpochs, true);
  const peak = positive(query.get('lr'), planPeak, false);
  const rates = schedule(planRates, epochs * perEpoch, peak / planPeak);
  const totalSteps = Math.min(rates.length, maxSteps);
  Object.assign(report, { epochs, peakLearningRate: peak });
  const epochsInput = /** @type {HTMLInputElement} */ ($('epochs'));
  const lrInput = /** @type {HTMLInputElement} */ ($('lr'));
  epochsInput.value = String(epochs);
  lrInput.value = String(Number(peak.toPrecision(6)));
  $('settings').onsubmit = (event) => {
    event.preventDefault();
    const next = new URLSearchParams(location.search);
    next.set('epochs', epochsInput.value);
    next.set('lr', lrInput.value);
    next.delete('steps');
    location.search = next.toString();
  };

  const [{ trainer }, inference] = await Promise.all([
    // errors only: placement() shows what ONNX Runtime warns about (nodes it keeps on the CPU)
    loadTrainer('../artifacts/', { executionProviders: runtime.providers, sessionOptions: { logSeverityLevel: 3 } }),
    fetchInferenceTemplate('../artifacts/'),
  ]);
  report.runtimeShown = $('runtime').textContent = runtimeLine(report.threads, null);
  // the placement is shown, not needed: a log ONNX Runtime words differently leaves the page training
  report.placement = await trainer.placement().catch((error) => {
    console.warn(`no placement: ${error instanceof Error ? error.message : error}`);
    return null;
  });
  report.runtimeShown = $('runtime').textContent = runtimeLine(report.threads, report.placement);
  for (const element of document.querySelectorAll('#usage .input')) element.textContent = inference.layout.inputs[0];
  const [featureName, labelName] = trainer.inputNames;
  const grid = { features: gridPoints(gridSize, extent), labels: new BigInt64Array(gridSize * gridSize) };
  report.exportState = async () => base64(serializeState(await trainer.state()));

  /** @param {number} step */
  const batch = (step) => {
    const epoch = Math.floor(step / perEpoch) % planEpochs; // more epochs than the plan: its orders again
    const start = epoch * rows + (step % perEpoch) * batchSize;
    const picked = order.subarray(start, Math.min(start + batchSize, (epoch + 1) * rows));
    const x = new Float32Array(picked.length * 2);
    const y = new BigInt64Array(picked.length);
    picked.forEach((row, i) => {
      x[2 * i] = features[2 * row];
      x[2 * i + 1] = features[2 * row + 1];
      y[i] = labels[row];
    });
    return {
      [featureName]: new ort.Tensor('float32', x, [picked.length, 2]),
      [labelName]: new ort.Tensor('int64', y, [picked.length]),
    };
  };
  const logitsOf = (/** @type {Record<string, import('onnxruntime-common').Tensor>} */ outputs) => /** @type {Float32Array} */ (Object.values(outputs)[0].data);
  const evaluate = async () => {
    const { outputs } = await trainer.evalStep([valFeatures, valLabels]);
    const logits = logitsOf(outputs);
    let right = 0;
    for (let i = 0; i < valLabels.data.length; i++) {
      let best = 0;
      for (let c = 1; c < classes; c++) if (logits[i * classes + c] > logits[i * classes + best]) best = c;
      right += BigInt(best) === valLabels.data[i] ? 1 : 0;
    }
    report.valAccuracy.push(right / valLabels.data.length);
    const regions = await trainer.evalStep([
      new ort.Tensor('float32', grid.features, [gridSize * gridSize, 2]),
      new ort.Tensor('int64', grid.labels, [gridSize * gridSize]),
    ]);
    drawRegions(/** @type {HTMLCanvasElement} */ ($('regions')), { probabilities: softmaxRows(logitsOf(regions.outputs), classes), size: gridSize, classes }, { features, labels, extent });
  };
  const show = () => {
    drawLoss(/** @type {HTMLCanvasElement} */ ($('loss')), report.losses, Math.min(totalSteps, rates.length));
    const epoch = Math.floor(report.steps / perEpoch);
    const accuracy = report.valAccuracy.length ? report.valAccuracy[report.valAccuracy.length - 1].toFixed(3) : '—';
    const loss = report.losses.length ? report.losses[report.losses.length - 1].toFixed(4) : '—';
    const speed = report.stepsPerSecond === null ? '—' : report.stepsPerSecond.toFixed(0);
    const text = `${runtimeName()}   epoch ${epoch}/${Math.ceil(totalSteps / perEpoch)}   step ${report.steps}/${totalSteps}   loss ${loss}   validation accuracy ${accuracy}   ${speed} steps/s   ${report.status}`;
    $('status').textContent = text;
    report.shown.push(text);
    if (report.shown.length > 50) report.shown.splice(0, report.shown.length - 50);
  };

  let paused = false;
  const pause = /** @type {HTMLButtonElement} */ ($('pause'));
  pause.onclick = () => {
    paused = !paused;
    pause.textContent = paused ? 'Resume' : 'Pause';
  };
  /** @type {HTMLButtonElement} */ ($('restart')).onclick = () => location.reload();
  /** @type {HTMLButtonElement} */ ($('download')).onclick = async () => downloadState(await trainer.state());
  /** @type {HTMLButtonElement} */ ($('download-model')).onclick = async () => {
    downloadBytes(fillInferenceModel(inference.template, inference.layout, (await trainer.state()).tensors), MODEL_FILE);
  };
  for (const id of ['pause', 'restart', 'download', 'download-model']) /** @type {HTMLButtonElement} */ ($(id)).disabled = false;

  await evaluate();
  report.status = 'training';
  show();
  let trainingMs = 0; // time spent in training steps only: pauses, evaluation and painting do not count
  let lastFrame = performance.now();
  while (report.steps < totalSteps) {
    if (paused) {
      await new Promise((resolve) => setTimeout(resolve, 100));
      continue;
    }
    const before = performance.now();
    const { loss } = await trainer.trainStep(batch(report.steps), rates[report.steps]);
    trainingMs += performance.now() - before;
    report.losses.push(loss);
    report.steps += 1;
    report.stepsPerSecond = stepsPerSecond(report.steps, trainingMs);
    if (report.steps % perEpoch === 0 || report.steps === totalSteps) await evaluate();
    if (performance.now() - lastFrame > 50 || report.steps === totalSteps) {
      show();
      await new Promise((resolve) => setTimeout(resolve, 0)); // let the page paint
      lastFrame = performance.now();
    }
  }
  report.status = 'done';
  pause.disabled = true;
  show();
}

/**
 * A query parameter as a positive number, else the default.
 * @param {string | null} text
 * @param {number} fallback
 * @param {boolean} integer
 * @returns {number}
 */
function positive(text, fallback, integer) {
  const value = Number(text);
  if (text === null || !Number.isFinite(value) || value <= 0 || (integer && !Number.isInteger(value))) return fallback;
  return value;
}

/**
 * @param {Uint8Array} bytes
 * @returns {string}
 */
function base64(bytes) {
  let text = '';
  for (let i = 0; i < bytes.length; i += 0x8000) text += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(text);
}

main().catch(fail);
