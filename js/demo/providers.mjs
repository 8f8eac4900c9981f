// What the demo and LoRA pages share about the runtime: the provider and bundle picked by runtime.js,
// the WASM thread count, the provider selector and the line that shows them.

import { describePlacement, ort } from '../src/browser.mjs';

/** @typedef {{ep: string, bundle: string, providers: string[]}} Runtime */

/** The choice runtime.js made from `?ep=` and `&bundle=` (WASM when the page is opened without it). */
export const runtime = /** @type {Runtime} */ (/** @type {any} */ (window).onnxblocksRuntime ?? { ep: 'wasm', bundle: 'wasm', providers: ['wasm'] });

/**
 * Below this many bytes of weights the pages run WASM on one thread: a small model's ops are shorter than handing
 * them to another thread costs (the demo MLP and the CNN: one thread was faster than two; docs/web.md, "WASM speed").
 */
export const ONE_THREAD_BELOW = 16 * 2 ** 20;

/**
 * The bytes of weights of the artifacts at `base`: the Content-Length of each of `files` (HEAD requests). Name only
 * files the site serves: a browser logs every 404 as a console error, so a page never probes for an optional file.
 * @param {string} base  the artifacts' folder URL (ends with `/`)
 * @param {string[]} files  the weight files the page's artifacts have (`params.safetensors`, `base_weights.bin`)
 * @returns {Promise<number>}
 */
export async function weightBytes(base, files) {
  const sizes = await Promise.all(files.map(async (name) => {
    const response = await fetch(new URL(name, new URL(base, location.href)), { method: 'HEAD' });
    return response.ok ? Number(response.headers.get('content-length')) || 0 : 0;
  }));
  return sizes.reduce((a, b) => a + b, 0);
}

/**
 * The WASM thread count a page uses unless `?threads=N` says: one for weights under `ONE_THREAD_BELOW` bytes, else
 * every core.
 * @param {number} cores
 * @param {number} bytes  the model's weights (`weightBytes`)
 * @returns {number}
 */
export function defaultThreads(cores, bytes) {
  return bytes < ONE_THREAD_BELOW ? 1 : Math.max(1, cores);
}

/**
 * Set up onnxruntime-web's WASM: when the page is cross-origin isolated (the server's COOP and COEP headers give it
 * SharedArrayBuffer), `defaultThreads` (every core for a large model, one for a small one), else one thread;
 * `?threads=N` sets it.
 * @param {URLSearchParams} query
 * @param {number} [bytes]  the model's weights (`weightBytes`); unknown: every core
 * @returns {number} the thread count
 */
export function configureWasm(query, bytes = Number.POSITIVE_INFINITY) {
  const asked = Number(query.get('threads'));
  const fallback = defaultThreads(navigator.hardwareConcurrency || 1, bytes);
  const threads = crossOriginIsolated ? (Number.isInteger(asked) && asked > 0 ? asked : fallback) : 1;
  ort.env.wasm.numThreads = threads;
  ort.env.wasm.simd = true;
  ort.env.wasm.wasmPaths = new URL('../ort/', location.href).href;
  return threads;
}

/**
 * The status line's head: `onnxruntime-web 1.30.0 (webgpu)`.
 * @returns {string}
 */
export function runtimeName() {
  return `onnxruntime-web ${ort.env.versions?.web} (${runtime.ep})`;
}

/**
 * Point the provider selector at the page's choice; picking another reloads the page with it.
 * @param {HTMLSelectElement} select  options `wasm`, `webgpu`, `webgpu/webgpu` (provider/bundle)
 */
export function providerSelector(select) {
  select.value = runtime.bundle === 'webgpu' ? 'webgpu/webgpu' : runtime.ep;
  select.onchange = () => {
    const next = new URLSearchParams(location.search);
    const [ep, bundle] = select.value.split('/');
    next.set('ep', ep);
    if (bundle) next.set('bundle', bundle);
    else next.delete('bundle');
    location.search = next.toString();
  };
}

/**
 * The runtime line under the status: isolation, threads, bundle and where the step model's nodes run.
 * @param {number} threads
 * @param {import('../src/placement.mjs').Placement | null} placement
 * @returns {string}
 */
export function runtimeLine(threads, placement) {
  const head = `crossOriginIsolated ${crossOriginIsolated}   WASM threads ${threads}   bundle ${runtime.bundle}`;
  return placement ? [head, ...describePlacement(placement)].join('\n') : head;
}
