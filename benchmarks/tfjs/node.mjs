#!/usr/bin/env node
// TensorFlow.js in Node on the pure-JavaScript `cpu` backend or `wasm` (@tensorflow/tfjs-backend-wasm):
//   node node.mjs PLAN.json STEPS cpu|wasm
// prints one JSON line: the losses, the loop's seconds, the backend and TensorFlow.js's version.
// (@tensorflow/tfjs-node, the native backend, downloads libtensorflow from storage.googleapis.com
// at install; benchmarks/web_tfjs.py says why it is not used here.)
import { readFile } from 'node:fs/promises';

import * as tf from '@tensorflow/tfjs';
import '@tensorflow/tfjs-backend-wasm';

import { train } from './train.mjs';

const [planPath, stepsText, backend] = process.argv.slice(2);
if (!planPath || !stepsText || !['cpu', 'wasm'].includes(backend)) {
  throw new TypeError('usage: node node.mjs PLAN.json STEPS cpu|wasm');
}
const plan = JSON.parse(await readFile(planPath, 'utf8'));
if (!(await tf.setBackend(backend))) throw new Error(`TensorFlow.js could not start its ${backend} backend`);
await tf.ready();
const report = await train(tf, plan, Number(stepsText));
console.log(JSON.stringify({ ...report, threads: backend === 'wasm' ? 'wasm default' : 1 }));
