// Greedy generation by Transformers.js in headless Chromium from a hub folder served on 127.0.0.1.
// Usage: node tjs_browser.mjs REQUEST_JSON TJS_NODE_MODULES PLAYWRIGHT_NODE_MODULES CHROMIUM
// REQUEST_JSON is {"root", "model", "dtype", "prompt", "steps"} as for tjs_generate.mjs. The page
// imports Transformers.js's web build with an import map (onnxruntime-web, onnxruntime-common from
// the same node_modules), loads the model from /models/ only (no remote models, no browser cache)
// and onnxruntime-web's wasm from /ort/; every request off the page's origin is aborted.
// Prints one JSON line: {"tokens": [...]} or {"error": "..."}.
import { createReadStream, statSync } from "node:fs";
import { createServer } from "node:http";
import { mkdtemp, rm } from "node:fs/promises";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import path from "node:path";

const [requestText, tjsModules, pwModules, chromiumPath] = process.argv.slice(2);
const request = JSON.parse(requestText);
const { chromium } = createRequire(path.join(pwModules, "x.js"))("playwright-core");

const mounts = {
  "/models/": request.root,
  "/tjs/": path.join(tjsModules, "@huggingface", "transformers", "dist"),
  "/ort/": path.join(tjsModules, "onnxruntime-web", "dist"),
  "/common/": path.join(tjsModules, "onnxruntime-common", "dist", "esm"),
};
const types = { ".js": "text/javascript", ".mjs": "text/javascript", ".wasm": "application/wasm",
  ".json": "application/json", ".html": "text/html" };

const page = `<!doctype html><html><head><script type="importmap">${JSON.stringify({
  imports: {
    "onnxruntime-web/webgpu": "/ort/ort.webgpu.bundle.min.mjs",
    "onnxruntime-common": "/common/index.js",
  },
})}</script></head><body><script type="module">
import { env, AutoModelForCausalLM, Tensor } from "/tjs/transformers.web.js";
const request = ${JSON.stringify(request)};
try {
  env.allowRemoteModels = false;
  env.allowLocalModels = true;
  env.localModelPath = "/models/";
  env.useBrowserCache = false;
  env.backends.onnx.wasm.wasmPaths = "/ort/";
  env.backends.onnx.wasm.numThreads = 1;
  const model = await AutoModelForCausalLM.from_pretrained(request.model,
    { dtype: request.dtype, device: "wasm" });
  const n = request.prompt.length;
  const ids = new Tensor("int64", BigInt64Array.from(request.prompt.map(BigInt)), [1, n]);
  const mask = new Tensor("int64", new BigInt64Array(n).fill(1n), [1, n]);
  const out = await model.generate({ input_ids: ids, attention_mask: mask,
    max_new_tokens: request.steps, do_sample: false, eos_token_id: null });
  window.result = { tokens: Array.from(out.data, (v) => Number(v)).slice(n) };
} catch (error) {
  window.result = { error: String(error && error.stack || error) };
}
</script></body></html>`;

const server = createServer((req, res) => {
  const url = new URL(req.url, "http://127.0.0.1");
  if (url.pathname === "/") {
    res.writeHead(200, { "content-type": "text/html" });
    return res.end(page);
  }
  for (const [prefix, folder] of Object.entries(mounts)) {
    if (!url.pathname.startsWith(prefix)) continue;
    const file = path.join(folder, decodeURIComponent(url.pathname.slice(prefix.length)));
    if (!file.startsWith(folder)) break;
    try {
      const size = statSync(file).size;
      res.writeHead(200, { "content-type": types[path.extname(file)] ?? "application/octet-stream",
        "content-length": size });
      return createReadStream(file).pipe(res);
    } catch {
      break;
    }
  }
  res.writeHead(404);
  res.end();
});
await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
const origin = `http://127.0.0.1:${server.address().port}`;
const profile = await mkdtemp(path.join(tmpdir(), "onnxblocks-tjs-chromium-"));
const offOrigin = [];
const messages = [];
const context = await chromium.launchPersistentContext(profile, {
  executablePath: chromiumPath, headless: true,
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
let result;
try {
  await context.route("**/*", (route) => {
    const target = new URL(route.request().url());
    if (target.origin === origin || ["blob:", "data:"].includes(target.protocol)) return route.continue();
    offOrigin.push(target.href);
    return route.abort();
  });
  const tab = context.pages()[0] ?? (await context.newPage());
  tab.on("console", (m) => { if (m.type() === "error") messages.push(m.text()); });
  tab.on("pageerror", (e) => messages.push(`pageerror: ${e.message}`));
  await tab.goto(`${origin}/`);
  await tab.waitForFunction(() => window.result !== undefined, undefined, { timeout: 300000 });
  result = await tab.evaluate(() => window.result);
} finally {
  await context.close();
  server.close();
  await rm(profile, { recursive: true, force: true });
}
console.log(JSON.stringify({ ...result, offOrigin, console: messages }));
