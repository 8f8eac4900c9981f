// Train several portable artifact directories in one Node process (the optimizer tests' batch runner).
//
//   node node_train_runs.mjs MANIFEST.json
//
// Copied next to the client's `src/` (tests/support/web_support.py `workspace`), so it imports the client
// as a user would. MANIFEST is a JSON list of runs {"name", "directory", "plan", "save"}: each run trains its
// artifacts on the plan's `train/<i>/<input>` batches with the plan's per-step `learning_rates` metadata
// (one rate per step, as onnxblocks-train reads it) and writes the trained state to `save`. It prints one JSON
// line {"<name>": {"losses": [...], "step": n}, ...}.

import { readFile } from 'node:fs/promises';

import { loadTrainer, parseSafetensors, writeState } from './src/node.mjs';

// The tests' one thread setting (tests/support/ort_threads.py): ONNXBLOCKS_ORT_THREADS, else 1.
const THREADS = Number(process.env.ONNXBLOCKS_ORT_THREADS || 1);

async function run({ directory, plan: planPath, save }) {
  const plan = parseSafetensors(await readFile(planPath), planPath);
  const rates = JSON.parse(plan.metadata.learning_rates ?? 'null');
  if (!Array.isArray(rates)) throw new TypeError(`plan '${planPath}' has no learning_rates metadata`);
  const batches = [];
  for (const [key, tensor] of plan.tensors) {
    const [split, index, ...rest] = key.split('/');
    if (split === 'train') (batches[Number(index)] ??= {})[rest.join('/')] = tensor;
  }
  const trainer = await loadTrainer(directory, {
    evaluate: false,
    sessionOptions: { executionProviders: ['cpu'], intraOpNumThreads: THREADS, interOpNumThreads: 1 },
  });
  const losses = [];
  for (const [i, rate] of rates.entries()) losses.push((await trainer.trainStep(batches[i % batches.length], rate)).loss);
  await writeState(save, await trainer.state());
  await trainer.release();
  return { losses, step: trainer.step };
}

async function main() {
  const manifest = JSON.parse(await readFile(process.argv[2], 'utf8'));
  const report = {};
  for (const entry of manifest) report[entry.name] = await run(entry);
  console.log(JSON.stringify(report));
}

main().catch((error) => {
  console.error(`node_train_runs: ${error instanceof Error ? error.stack : String(error)}`);
  process.exitCode = 1;
});
