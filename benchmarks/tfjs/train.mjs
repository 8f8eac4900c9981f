// The TensorFlow.js peer of onnxblocks' training (benchmarks/bench_web.py --peers tfjs): the demo
// classifier's MLP (2-64-64-3, Gemm + Relu) or the CNN of benchmarks/web_cnn.py (`model: "cnn"`,
// cross entropy alone), the same initial weights, batches and learning rates
// (the plan benchmarks/web_tfjs.py writes), the same loss (cross entropy with label smoothing 0.05
// plus 1e-4 times the sum of the squared weights) and the same optimizer (AdamW with weight decay 0,
// which is Adam: betas 0.9/0.999, eps 1e-8 outside the square root, as torch and onnxblocks).
// Used by node.mjs (Node) and index.html (the browser); `tf` is the caller's TensorFlow.js.

/**
 * @typedef {{
 *   model: 'mlp' | 'cnn', params: Record<string, {shape: number[], values: number[]}>,
 *   features: number[][], featureShape: number[], labels: number[][], learningRates: number[],
 *   classes: number, l2: number, l2Weights: string[], labelSmoothing: number,
 *   betas: number[], eps: number, bnEps: number,
 * }} Plan
 */

/** The logits of the demo's MLP: `fc1 .. fcN` (Gemm), Relu between. */
function mlp(/** @type {any} */ tf, /** @type {Record<string, any>} */ p, /** @type {any} */ x) {
  const layers = Object.keys(p).filter((name) => name.endsWith('.weight')).length;
  let h = x;
  for (let i = 1; i <= layers; i++) {
    h = tf.add(tf.matMul(h, p[`fc${i}.weight`]), p[`fc${i}.bias`]);
    if (i < layers) h = tf.relu(h);
  }
  return h;
}

/** The logits of benchmarks/web_cnn.py's CNN in NHWC: conv, batch-statistics BatchNorm, Relu, pool, Gemm. */
function cnn(/** @type {any} */ tf, /** @type {Record<string, any>} */ p, /** @type {any} */ x, /** @type {number} */ bnEps) {
  const c = tf.add(tf.conv2d(x, p['conv.weight'], 1, 'same'), p['conv.bias']);
  const { mean, variance } = tf.moments(c, [0, 1, 2]);
  const n = tf.batchNorm(c, mean, variance, p['bn.bias'], p['bn.scale'], bnEps);
  const pooled = tf.maxPool(tf.relu(n), 2, 2, 'valid');
  return tf.add(tf.matMul(tf.reshape(pooled, [pooled.shape[0], -1]), p['fc.weight']), p['fc.bias']);
}

/**
 * Train `steps` steps of `plan` on the current backend; the losses and the training loop's time.
 * @param {any} tf
 * @param {Plan} plan
 * @param {number} steps
 */
export async function train(tf, plan, steps) {
  /** @type {Record<string, any>} */
  const params = {};
  for (const [name, { shape, values }] of Object.entries(plan.params)) {
    params[name] = tf.variable(tf.tensor(values, shape), true, name);
  }
  const variables = Object.values(params);
  const optimizer = tf.train.adam(plan.learningRates[0], plan.betas[0], plan.betas[1], plan.eps);
  const batches = [];
  for (let step = 0; step < steps; step++) {
    const y = plan.labels[step];
    batches.push([
      tf.tensor(plan.features[step], [y.length, ...plan.featureShape]),
      tf.oneHot(tf.tensor1d(y, 'int32'), plan.classes),
    ]);
  }
  const loss = (/** @type {any} */ x, /** @type {any} */ onehot) => {
    const logits = plan.model === 'cnn' ? cnn(tf, params, x, plan.bnEps) : mlp(tf, params, x);
    const ce = tf.losses.softmaxCrossEntropy(onehot, logits, undefined, plan.labelSmoothing);
    if (!plan.l2Weights.length) return ce;
    const squares = plan.l2Weights.map((name) => tf.sum(tf.square(params[name])));
    return tf.add(ce, tf.mul(plan.l2, tf.addN(squares)));
  };
  // the first step's kernel compilation is timed, as onnxblocks' rows time their first step
  const losses = [];
  const started = performance.now();
  for (let step = 0; step < steps; step++) {
    optimizer.learningRate = plan.learningRates[step];
    const [x, onehot] = batches[step];
    const value = optimizer.minimize(() => loss(x, onehot), true, variables);
    losses.push((await value.data())[0]);
    value.dispose();
  }
  const seconds = (performance.now() - started) / 1000;
  for (const [x, onehot] of batches) tf.dispose([x, onehot]);
  tf.dispose(variables);
  optimizer.dispose();
  return { losses, seconds, steps, model: plan.model, backend: tf.getBackend(), version: tf.version.tfjs };
}
