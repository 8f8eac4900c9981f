// The TensorFlow.js peer of the demo classifier's training (benchmarks/bench_web.py --peers tfjs):
// the same MLP (2-64-64-3, Gemm + Relu), the same initial weights, batches and learning rates
// (the plan benchmarks/web_tfjs.py writes), the same loss (cross entropy with label smoothing 0.05
// plus 1e-4 times the sum of the squared weights) and the same optimizer (AdamW with weight decay 0,
// which is Adam: betas 0.9/0.999, eps 1e-8 outside the square root, as torch and onnxblocks).
// Used by node.mjs (Node) and index.html (the browser); `tf` is the caller's TensorFlow.js.

/**
 * @typedef {{
 *   layers: {weight: number[], bias: number[], in: number, out: number}[],
 *   features: number[][], labels: number[][], learningRates: number[],
 *   classes: number, l2: number, labelSmoothing: number, betas: number[], eps: number,
 * }} Plan
 */

/**
 * Train `steps` steps of `plan` on the current backend; the losses and the training loop's time.
 * @param {any} tf
 * @param {Plan} plan
 * @param {number} steps
 */
export async function train(tf, plan, steps) {
  const params = plan.layers.map((layer, i) => ({
    weight: tf.variable(tf.tensor2d(layer.weight, [layer.in, layer.out]), true, `fc${i + 1}.weight`),
    bias: tf.variable(tf.tensor1d(layer.bias), true, `fc${i + 1}.bias`),
  }));
  const variables = params.flatMap((p) => [p.weight, p.bias]);
  const optimizer = tf.train.adam(plan.learningRates[0], plan.betas[0], plan.betas[1], plan.eps);
  const batches = [];
  for (let step = 0; step < steps; step++) {
    const x = plan.features[step];
    const y = plan.labels[step];
    batches.push([tf.tensor2d(x, [y.length, x.length / y.length]), tf.oneHot(tf.tensor1d(y, 'int32'), plan.classes)]);
  }
  const loss = (/** @type {any} */ x, /** @type {any} */ onehot) => {
    let h = x;
    params.forEach((p, i) => {
      h = tf.add(tf.matMul(h, p.weight), p.bias);
      if (i < params.length - 1) h = tf.relu(h);
    });
    const ce = tf.losses.softmaxCrossEntropy(onehot, h, undefined, plan.labelSmoothing);
    const squares = params.map((p) => tf.sum(tf.square(p.weight)));
    return tf.add(ce, tf.mul(plan.l2, tf.addN(squares)));
  };
  // one step outside the timing would change the run; the first step's kernel compilation is
  // timed, as onnxblocks' rows time theirs
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
  return { losses, seconds, steps, backend: tf.getBackend(), version: tf.version.tfjs };
}
