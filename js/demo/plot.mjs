// Canvas drawings of the demo page (the loss curve, the decision regions) and the numbers it shows. No dependencies.

/** Class colours (RGB). */
export const COLORS = /** @type {const} */ ([
  [31, 119, 180],
  [255, 127, 14],
  [44, 160, 44],
  [214, 39, 40],
  [148, 103, 189],
]);

/**
 * Draw the per-step loss and its moving average.
 * @param {HTMLCanvasElement} canvas
 * @param {number[]} losses
 * @param {number} totalSteps  x-axis extent
 */
export function drawLoss(canvas, losses, totalSteps) {
  const ctx = /** @type {CanvasRenderingContext2D} */ (canvas.getContext('2d'));
  const { width, height } = canvas;
  const pad = { left: 48, right: 12, top: 12, bottom: 28 };
  ctx.clearRect(0, 0, width, height);
  const max = Math.max(1e-6, ...losses.slice(0, 50), ...losses.slice(-1));
  const tick = niceStep(max / 4);
  const top = Math.ceil(max / tick) * tick;
  const x = (/** @type {number} */ i) => pad.left + (i / Math.max(1, totalSteps - 1)) * (width - pad.left - pad.right);
  const y = (/** @type {number} */ v) => pad.top + (1 - Math.min(v, top) / top) * (height - pad.top - pad.bottom);
  ctx.strokeStyle = '#d0d7de';
  ctx.fillStyle = '#57606a';
  ctx.font = '11px system-ui, sans-serif';
  ctx.lineWidth = 1;
  for (let k = 0; k * tick <= top + tick / 2; k++) {
    const v = k * tick;
    ctx.beginPath();
    ctx.moveTo(pad.left, y(v));
    ctx.lineTo(width - pad.right, y(v));
    ctx.stroke();
    ctx.fillText(String(Number(v.toPrecision(3))), 6, y(v) + 4);
  }
  ctx.fillText('0', pad.left, height - 8);
  ctx.fillText(`${totalSteps} steps`, width - pad.right - 60, height - 8);
  if (!losses.length) return;
  ctx.strokeStyle = 'rgba(31, 119, 180, 0.35)';
  trace(ctx, losses, x, y);
  const smooth = movingAverage(losses, 20);
  ctx.strokeStyle = 'rgb(31, 119, 180)';
  ctx.lineWidth = 2;
  trace(ctx, smooth, x, y);
}

/**
 * Paint the class probabilities of a grid, then the points on top.
 * @param {HTMLCanvasElement} canvas
 * @param {{probabilities: Float32Array, size: number, classes: number} | null} grid  row-major `[size*size, classes]`, row 0 at the top
 * @param {{features: Float32Array, labels: BigInt64Array | Int32Array, extent: number}} points  `features` is `[n, 2]`
 */
export function drawRegions(canvas, grid, points) {
  const ctx = /** @type {CanvasRenderingContext2D} */ (canvas.getContext('2d'));
  const { width, height } = canvas;
  ctx.clearRect(0, 0, width, height);
  if (grid) {
    const image = ctx.createImageData(grid.size, grid.size);
    for (let cell = 0; cell < grid.size * grid.size; cell++) {
      let best = 0;
      for (let c = 1; c < grid.classes; c++) if (grid.probabilities[cell * grid.classes + c] > grid.probabilities[cell * grid.classes + best]) best = c;
      const confidence = grid.probabilities[cell * grid.classes + best];
      const [r, g, b] = COLORS[best % COLORS.length];
      const mix = 0.15 + 0.35 * confidence; // paler where the model is unsure
      image.data.set([255 - mix * (255 - r), 255 - mix * (255 - g), 255 - mix * (255 - b), 255], cell * 4);
    }
    const tile = document.createElement('canvas');
    tile.width = tile.height = grid.size;
    /** @type {CanvasRenderingContext2D} */ (tile.getContext('2d')).putImageData(image, 0, 0);
    ctx.imageSmoothingEnabled = true;
    ctx.drawImage(tile, 0, 0, width, height);
  }
  const { features, labels, extent } = points;
  for (let i = 0; i < labels.length; i++) {
    const [r, g, b] = COLORS[Number(labels[i]) % COLORS.length];
    const px = ((features[2 * i] + extent) / (2 * extent)) * width;
    const py = (1 - (features[2 * i + 1] + extent) / (2 * extent)) * height;
    ctx.fillStyle = `rgb(${r}, ${g}, ${b})`;
    ctx.strokeStyle = 'rgba(255, 255, 255, 0.8)';
    ctx.beginPath();
    ctx.arc(px, py, 2.6, 0, 2 * Math.PI);
    ctx.fill();
    ctx.stroke();
  }
}

/**
 * The grid's points, row 0 at the top (largest y), as a `[size*size, 2]` Float32Array.
 * @param {number} size
 * @param {number} extent  the square is [-extent, extent]^2
 * @returns {Float32Array}
 */
export function gridPoints(size, extent) {
  const out = new Float32Array(size * size * 2);
  for (let row = 0; row < size; row++) {
    for (let col = 0; col < size; col++) {
      const cell = row * size + col;
      out[2 * cell] = -extent + ((col + 0.5) / size) * 2 * extent;
      out[2 * cell + 1] = extent - ((row + 0.5) / size) * 2 * extent;
    }
  }
  return out;
}

/**
 * Softmax of each row of `[rows, classes]` logits.
 * @param {Float32Array} logits
 * @param {number} classes
 * @returns {Float32Array}
 */
export function softmaxRows(logits, classes) {
  const out = new Float32Array(logits.length);
  for (let at = 0; at < logits.length; at += classes) {
    let max = -Infinity;
    for (let c = 0; c < classes; c++) max = Math.max(max, logits[at + c]);
    let sum = 0;
    for (let c = 0; c < classes; c++) sum += out[at + c] = Math.exp(logits[at + c] - max);
    for (let c = 0; c < classes; c++) out[at + c] /= sum;
  }
  return out;
}

/**
 * @param {CanvasRenderingContext2D} ctx
 * @param {number[]} values
 * @param {(i: number) => number} x
 * @param {(v: number) => number} y
 */
function trace(ctx, values, x, y) {
  ctx.beginPath();
  values.forEach((v, i) => (i ? ctx.lineTo(x(i), y(v)) : ctx.moveTo(x(i), y(v))));
  ctx.stroke();
}

/**
 * @param {number[]} values
 * @param {number} window
 * @returns {number[]}
 */
function movingAverage(values, window) {
  let sum = 0;
  return values.map((v, i) => {
    sum += v - (i >= window ? values[i - window] : 0);
    return sum / Math.min(i + 1, window);
  });
}

/**
 * The smallest of 1, 2, 2.5, 5 (times a power of ten) at least `value`: a round tick spacing.
 * @param {number} value
 * @returns {number}
 */
function niceStep(value) {
  const magnitude = 10 ** Math.floor(Math.log10(value));
  for (const step of [1, 2, 2.5, 5]) if (value <= step * magnitude) return step * magnitude;
  return 10 * magnitude;
}

/**
 * Steps per second, or null while it cannot be told (no time measured yet: a paused or coarse clock).
 * @param {number} steps
 * @param {number} ms
 * @returns {number | null}
 */
export function stepsPerSecond(steps, ms) {
  const rate = steps / (ms / 1000);
  return ms > 0 && Number.isFinite(rate) ? rate : null;
}

/**
 * The learning rate of each of `steps` steps: the plan's schedule stretched to them and scaled by `scale`
 * (the plan's own rates when `steps` and `scale` are the plan's).
 * @param {Float64Array} plan
 * @param {number} steps
 * @param {number} scale
 * @returns {Float64Array}
 */
export function schedule(plan, steps, scale) {
  if (steps === plan.length && scale === 1) return plan;
  const out = new Float64Array(steps);
  for (let i = 0; i < steps; i++) out[i] = plan[Math.min(plan.length - 1, Math.floor((i * plan.length) / steps))] * scale;
  return out;
}
