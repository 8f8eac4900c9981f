// Which onnxruntime-web bundle the page imports, chosen from the query before any module loads
// (an import map must be in place before the first module script):
//
//   ?ep=wasm (default)          ort.wasm.min.mjs    WASM only
//   ?ep=webgpu                  ort.min.mjs         the default bundle: WebGPU (JavaScript kernels) + WASM
//   ?ep=webgpu&bundle=webgpu    ort.webgpu.min.mjs  onnxruntime-web/webgpu: the native WebGPU provider + WASM
//
// `onnxruntime-web/wasm` is the specifier src/browser.mjs imports; the map points it at the chosen
// file. The page's modules read the choice from `window.onnxblocksRuntime`.
(() => {
  const query = new URLSearchParams(location.search);
  const ep = query.get('ep') === 'webgpu' ? 'webgpu' : 'wasm';
  const bundles = { wasm: 'ort.wasm.min.mjs', default: 'ort.min.mjs', webgpu: 'ort.webgpu.min.mjs' };
  const asked = query.get('bundle');
  const bundle = asked && asked in bundles ? asked : ep === 'webgpu' ? 'default' : 'wasm';
  const map = document.createElement('script');
  map.type = 'importmap';
  map.textContent = JSON.stringify({ imports: { 'onnxruntime-web/wasm': `../ort/${bundles[bundle]}` } });
  document.currentScript.after(map);
  window.onnxblocksRuntime = { ep, bundle, providers: ep === 'webgpu' ? ['webgpu', 'wasm'] : ['wasm'] };
})();
