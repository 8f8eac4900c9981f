// A browser tab as a client of a Flower federation (docs/federated.md): claims a slot of the relay that served
// this page, draws its own non-IID spiral points (or reads a local .npz), and trains each round it is asked.
//
// Query parameters: ?points=N points drawn (default 240); ?major=F the share of the tab's main class (0.8);
// ?seed=N; ?file=1 waits for a local .npz to be chosen instead of drawing points; ?hold=R never sends round R's
// result (report.holding turns true: the tests close such a tab mid-round). `window.onnxblocksFederate` reports progress to tests.

import { ort } from '../src/browser.mjs';
import { federate } from '../src/federate.mjs';
import { parseNpz } from '../src/npz.mjs';

/** @typedef {import('../src/safetensors.mjs').NamedTensor} NamedTensor */

const query = new URLSearchParams(location.search);
const $ = (/** @type {string} */ id) => /** @type {HTMLElement} */ (document.getElementById(id));
/** @type {{status: string, slot: string | null, rounds: object[], error: string | null, holding: boolean}} */
const report = { status: 'claiming', slot: null, rounds: [], error: null, holding: false };
const hold = query.has('hold') ? Number(query.get('hold')) : null;
/** @type {any} */ (window).onnxblocksFederate = report;

ort.env.wasm.numThreads = 1;
ort.env.wasm.wasmPaths = new URL('../ort/', location.href).href;

/**
 * Spiral arms as onnxblocks.datasets.spirals draws them, `major` of the points from class `main`.
 * @param {number} count @param {number} main @param {number} major @param {number} seed
 */
function spiralPoints(count, main, major, seed) {
  let a = seed >>> 0;
  const random = () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = Math.imul(a ^ (a >>> 15), a | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  const normal = () => Math.sqrt(-2 * Math.log(1 - random())) * Math.cos(2 * Math.PI * random());
  const x = new Float32Array(2 * count);
  const y = new BigInt64Array(count);
  for (let i = 0; i < count; i++) {
    const k = random() < major ? main : (main + 1 + Math.floor(random() * 2)) % 3;
    const t = 0.05 + 0.95 * random();
    const angle = 2 * Math.PI * (k / 3 + 0.8 * t);
    x[2 * i] = t * Math.cos(angle) + 0.08 * normal();
    x[2 * i + 1] = t * Math.sin(angle) + 0.08 * normal();
    y[i] = BigInt(k);
  }
  return new Map([
    ['arr_0', { name: 'arr_0', dtype: /** @type {const} */ ('float32'), shape: [count, 2], data: x }],
    ['arr_1', { name: 'arr_1', dtype: /** @type {const} */ ('int64'), shape: [count], data: y }],
  ]);
}

/** @param {Uint8Array} bytes */
async function inflate(bytes) {
  const stream = new Blob([/** @type {BlobPart} */ (/** @type {unknown} */ (bytes))]).stream().pipeThrough(new DecompressionStream('deflate-raw'));
  return new Uint8Array(await new Response(stream).arrayBuffer());
}

/** @param {string} text */
function status(text) {
  report.status = text;
  $('status').textContent = text;
}

async function main() {
  const claimed = await fetch(`${location.origin}/claim`, { method: 'POST', body: JSON.stringify({ kind: 'browser' }) });
  const answer = await claimed.json();
  if (!claimed.ok) throw new Error(answer.reason ?? `claim: HTTP ${claimed.status}`);
  const slot = `${location.origin}/slots/${answer.slot}`;
  report.slot = slot;
  const file = /** @type {HTMLInputElement} */ ($('file'));
  /** @type {Map<string, NamedTensor>} */
  let data = spiralPoints(Number(query.get('points') ?? 240), answer.slot % 3, Number(query.get('major') ?? 0.8), Number(query.get('seed') ?? answer.slot));
  if (query.get('file') === '1') {
    status(`slot ${answer.slot}: choose a local .npz to train on`);
    const chosen = await new Promise((resolve) => file.addEventListener('change', () => resolve(file.files?.[0]), { once: true }));
    data = await parseNpz(await /** @type {File} */ (chosen).arrayBuffer(), { what: /** @type {File} */ (chosen).name, inflate });
  }
  status(`slot ${answer.slot}: ${data.get('arr_0')?.shape[0] ?? '?'} local points (mostly class ${answer.slot % 3}); waiting for rounds`);
  /** @type {Map<number, HTMLTableRowElement>} */
  const rows = new Map();
  const { rounds } = await federate({
    ort: /** @type {any} */ (ort),
    url: slot,
    data,
    kind: 'browser',
    runtime: `onnxruntime-web ${ort.env.versions?.web ?? ''}`.trim(),
    sessionOptions: { executionProviders: ['wasm'] },
    beforeSend: async (task) => {
      if (task.phase !== 'train' || task.round !== hold) return;
      report.holding = true;
      status(`slot ${answer.slot}: holding round ${task.round}'s result (?hold)`);
      await new Promise(() => {});
    },
    onRound: (r) => {
      report.rounds.push(r);
      let row = rows.get(r.round);
      if (!row) {
        row = document.createElement('tr');
        row.innerHTML = `<td>${r.round}</td><td></td><td></td><td></td><td></td><td></td>`;
        rows.set(r.round, row);
        $('rounds').append(row);
      }
      const cells = row.querySelectorAll('td');
      const fmt = (/** @type {number | undefined} */ v) => (v === undefined ? '' : Number(v).toPrecision(4));
      if (r.phase === 'train') {
        cells[1].textContent = fmt(r.metrics['train-loss']);
        cells[2].textContent = fmt(r.metrics.steps);
        cells[5].textContent = r.accepted ? 'yes' : `dropped: ${r.reason}`;
      } else {
        cells[3].textContent = fmt(r.metrics['eval-loss']);
        cells[4].textContent = fmt(r.metrics.accuracy);
      }
      status(`slot ${answer.slot}: round ${r.round} ${r.phase} ${r.accepted ? 'sent' : `failed: ${r.reason}`}`);
    },
  });
  status(`the federation ended after ${rounds} training round(s) of this tab`);
  report.status = 'done';
}

main().catch((error) => {
  report.error = error instanceof Error ? error.message : String(error);
  report.status = 'error';
  $('error').textContent = report.error;
});
