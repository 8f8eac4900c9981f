// What the demo and LoRA pages share about the runtime: the provider and bundle picked by runtime.js,
// the WASM thread count, the provider selector and the line that shows them.

import { describePlacement, ort } from '../src/browser.mjs';

/** @typedef {{ep: string, bundle: string, providers: string[]}} Runtime */

/** The choice runtime.js made from `?ep=` and `&bundle=` (WASM when the page is opened without it). */
export const runtime = /** @type {Runtime} */ (/** @type {any} */ (window).onnxblocksRuntime ?? { ep: 'wasm', bundle: 'wasm', providers: ['wasm'] });

/**
 * Set up onnxruntime-web's WASM: every core when the page is cross-origin isolated (the server's COOP and COEP
 * headers give it SharedArrayBuffer), else one thread; `?threads=N` sets it.
 * @param {URLSearchParams} query
 * @returns {number} the thread count
 */
export function configureWasm(query) {
  const asked = Number(query.get('threads'));
  const threads = crossOriginIsolated ? (Number.isInteger(asked) && asked > 0 ? asked : navigator.hardwareConcurrency || 1) : 1;
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
