// Training on portable artifacts with any ONNX Runtime JavaScript package (onnxruntime-web, onnxruntime-node).
//
// The fused step model (onnxblocks docs/portable.md) does forward, backward and the
// optimizer update in one run:
//
//   inputs:  user inputs, learning_rate (float [1]), step (int64 [1], the step being taken, 1 first),
//            for each trainable p: p, p.exp_avg, p.exp_avg_sq (AdamW; p alone for SGD), frozen parameters
//   outputs: loss, additional outputs, for each trainable p: p.out, p.exp_avg.out, p.exp_avg_sq.out
//
// The Trainer keeps the parameters and moments as ORT tensors and feeds each step's
// outputs to the next step. This module imports nothing: the ORT package is passed in.
//
// The flat step model (`flat_step_model.onnx`, onnxblocks `web/flat_step.py`) takes the trainable parameters and
// their state as one float32 input `onnxblocks.flat_state` and returns them as `onnxblocks.flat_state.out`, its
// layout in the metadata: ONNX Runtime's JS APIs copy each tensor of a run on its own, so two tensors cost less
// than dozens. The Trainer then feeds one tensor and cuts the named tensors from it only when they are read.

import { elementCount, zeros } from './safetensors.mjs';
import { stateNames, MAX_STATES } from './state.mjs';

/** @typedef {typeof import('onnxruntime-common')} Ort  the module of onnxruntime-web or onnxruntime-node */
/** @typedef {import('onnxruntime-common').Tensor} Tensor */
/** @typedef {import('onnxruntime-common').InferenceSession} Session */
/** @typedef {import('onnxruntime-common').InferenceSession.SessionOptions} SessionOptions */
/** @typedef {import('./safetensors.mjs').NamedTensor} NamedTensor */
/** @typedef {import('./state.mjs').TrainingState} TrainingState */
/** @typedef {string | Uint8Array | ArrayBuffer} ModelSource  a path (Node), a URL (browser) or the model's bytes */
/** @typedef {{path: string, data: Uint8Array | ArrayBuffer | string}[]} ExternalData  external data files by the name the models reference */
/** @typedef {Tensor | Omit<NamedTensor, 'name'> & {name?: string}} InputValue  an ORT tensor, or a plain `{dtype, shape, data}` */
/** @typedef {InputValue[] | Record<string, InputValue>} Inputs  in the model's input order, or by name */

/**
 * What one training or eval step returns.
 * @typedef {object} StepResult
 * @property {number} loss  the first output, as a number
 * @property {Record<string, Tensor>} outputs  the additional outputs (e.g. logits) by name
 */

/** Input and output names of the contract (onnxblocks `_core/contracts.py`). */
export const LEARNING_RATE = 'learning_rate';
export const STEP = 'step';
export const UPDATED_SUFFIX = '.out';
/** The flat step model's state input, and the metadata key of its layout (`[[name, offset, shape], ...]`). */
export const FLAT_STATE = 'onnxblocks.flat_state';

/** @typedef {[string, number, number[]][]} FlatLayout  each carried tensor's name, offset and shape */

/**
 * Session options for models that read a frozen base (`base_weights.bin`), as onnxblocks' Python runtime sets them:
 * no constant folding (it writes a float32 copy of every base weight a node transforms, per session), no
 * pre-packed copy of the constant MatMul weights, and no memory pattern (planned per input shape: GiBs more with
 * a dynamic sequence). What `options` sets itself wins.
 *
 * @param {SessionOptions} [options]
 * @returns {SessionOptions}
 */
export function frozenBaseOptions(options = {}) {
  const extra = /** @type {Record<string, any>} */ (options.extra ?? {});
  return {
    enableMemPattern: false,
    ...options,
    extra: {
      ...extra,
      session: { disable_prepacking: '1', ...(extra.session ?? {}) },
      optimization: { disable_specified_optimizers: 'ConstantFolding', ...(extra.optimization ?? {}) },
    },
  };
}

export class Trainer {
  /**
   * Open the step model (and the eval model) and take the parameters from a state.
   *
   * @param {Ort} ort  `import * as ort from 'onnxruntime-web'` or `onnxruntime-node`'s default export
   * @param {object} options
   * @param {ModelSource} options.stepModel  `step_model.onnx` of portable artifacts
   * @param {ModelSource} [options.evalModel]  `eval_model.onnx` (for evalStep)
   * @param {TrainingState} options.state  parameters (and moments), e.g. from `params.safetensors`
   * @param {SessionOptions} [options.sessionOptions]  passed to `InferenceSession.create`
   * @param {ExternalData} [options.externalData]  the external data files the models reference, for models given
   *   as bytes: the frozen base `base_weights.bin` the artifacts share (`[{path: 'base_weights.bin', data}]`), loaded
   *   once and handed to both sessions (a model given as a path finds it beside itself)
   * @param {FlatLayout} [options.flatLayout]  the layout of a flat step model (its metadata `onnxblocks.flat_state`,
   *   see `flatLayout()`); required for one, ignored for the step model
   * @returns {Promise<Trainer>}
   * @throws {TypeError | RangeError} when the models and the state do not fit each other
   */
  static async create(ort, { stepModel, evalModel, state, sessionOptions = {}, externalData, flatLayout }) {
    const options = externalData?.length ? { ...sessionOptions, externalData } : sessionOptions;
    const step = await openSession(ort, stepModel, 'step model', options);
    const evaluation = evalModel === undefined ? null : await openSession(ort, evalModel, 'eval model', options);
    return new Trainer(ort, step, evaluation, state, flatLayout);
  }

  /**
   * Use `Trainer.create`; this checks the sessions against the state.
   * @param {Ort} ort
   * @param {Session} stepSession
   * @param {Session | null} evalSession
   * @param {TrainingState} state
   * @param {FlatLayout} [flatLayout]  for a flat step model
   */
  constructor(ort, stepSession, evalSession, state, flatLayout) {
    this.ort = ort;
    this.stepSession = stepSession;
    this.evalSession = evalSession;
    /** Optimizer steps taken. */
    this.step = state.step;
    /** The last learning rate used (or the state's). */
    this.learningRate = state.learningRate;
    this.extra = { ...state.extra };
    this.trainable = [...state.trainable];
    this.frozen = [...state.frozen];
    /**
     * The LoRA record of the step model (metadata `onnxblocks.lora`), set by `loadTrainer` for adapter artifacts;
     * `saveAdapters` / `downloadAdapters` write the trained adapters with it as a PEFT directory.
     * @type {import('./adapters.mjs').LoraRecord | null}
     */
    this.lora = null;
    /**
     * Where ONNX Runtime runs the step model's nodes, found by the entry point (`loadTrainer`, which sets it):
     * read `placement()`.
     * @type {(() => Promise<import('./placement.mjs').Placement>) | null}
     */
    this.placementProbe = null;
    /** The execution providers asked for, in order (set by `loadTrainer`). @type {string[]} */
    this.executionProviders = [];

    const inputs = new Set(stepSession.inputNames);
    const outputs = new Set(stepSession.outputNames);
    /** The flat step model's layout, or null for the step model. @type {FlatLayout | null} */
    this.flatLayout = null;
    if (inputs.has(FLAT_STATE)) {
      if (!flatLayout) throw new TypeError(`the step model takes '${FLAT_STATE}' (a flat step model): pass its layout, flatLayout(modelBytes), as flatLayout`);
      checkLayout(flatLayout);
      this.flatLayout = flatLayout;
      // the carried tensors count as the model's inputs and outputs for the checks below
      for (const [name] of flatLayout) {
        inputs.add(name);
        outputs.add(name + UPDATED_SUFFIX);
      }
    }
    for (const name of [LEARNING_RATE, STEP]) {
      if (!inputs.has(name)) throw new TypeError(`the step model has no '${name}' input; is it the step_model.onnx of portable artifacts (generate_artifacts(..., portable=True))?`);
    }
    const missing = this.trainable.filter((p) => !inputs.has(p) || !outputs.has(p + UPDATED_SUFFIX));
    if (missing.length) {
      throw new RangeError(`trainable parameter(s) ${missing.join(', ')} of the state are not inputs with a '.out' output of the step model; was the state written for other artifacts?`);
    }
    // the state tensors the optimizer declares: the step model takes the first k state names of each parameter
    const counts = this.trainable.map((p) => stateNames(p, MAX_STATES).findIndex((m) => !inputs.has(m))).map((i) => (i < 0 ? MAX_STATES : i));
    if (new Set(counts).size > 1) {
      throw new RangeError(`the step model takes ${Math.min(...counts)} to ${Math.max(...counts)} state tensors per trainable parameter; expected the same number for all`);
    }
    /** The optimizer's state tensors per trainable parameter (AdamW: 2, SGD: 0, SGD with momentum: 1, Adam with amsgrad: 3). */
    this.momentsPerParameter = counts.length ? counts[0] : 0;
    /** Names of the tensors the step model updates: each trainable parameter and its state tensors. */
    this.updated = this.trainable.flatMap((p) => [p, ...stateNames(p, this.momentsPerParameter)]);

    /** @type {Map<string, Tensor>} the current parameters and moments, as ORT tensors */
    this.values = new Map();
    const types = inputTypes(stepSession);
    for (const name of [...this.trainable, ...this.frozen]) {
      const tensor = state.tensors.get(name);
      if (!tensor) throw new RangeError(`the state has no tensor for parameter '${name}'`);
      checkType(name, tensor.dtype, types.get(name));
      this.values.set(name, toOrt(ort, tensor));
    }
    for (const param of this.momentsPerParameter ? this.trainable : []) {
      const source = /** @type {NamedTensor} */ (state.tensors.get(param));
      for (const name of stateNames(param, this.momentsPerParameter)) {
        const saved = state.tensors.get(name);
        if (saved && (saved.dtype !== source.dtype || String(saved.shape) !== String(source.shape))) {
          throw new RangeError(`moment '${name}' is ${saved.dtype} [${saved.shape}], its parameter ${source.dtype} [${source.shape}]`);
        }
        const value = saved ?? { name, dtype: source.dtype, shape: source.shape, data: zeros(source.dtype, elementCount(source.shape)) };
        this.values.set(name, toOrt(ort, value));
      }
    }
    const carried = new Set((this.flatLayout ?? []).map(([name]) => name));
    /** The held tensors the step model reads on their own (a frozen parameter only the eval model reads is held, not fed). */
    this.stepFeeds = [...this.values.keys()].filter((n) => inputs.has(n) && !carried.has(n));
    /** The flat state fed to the next step (a flat step model only). @type {Tensor | null} */
    this.flatState = this.flatLayout ? this.packState(this.flatLayout) : null;
    /** Whether `values` lags behind `flatState` (cut from it when read). */
    this.unpacked = true;
    const own = new Set([LEARNING_RATE, STEP, FLAT_STATE, ...this.values.keys()]);
    /** The step model's user inputs (data and labels), in order. */
    this.inputNames = stepSession.inputNames.filter((n) => !own.has(n));
    const updatedOutputs = new Set([...this.updated, FLAT_STATE].map((n) => n + UPDATED_SUFFIX));
    /** The step model's loss and additional outputs, in order. */
    this.outputNames = stepSession.outputNames.filter((n) => !updatedOutputs.has(n));
    /** The eval model's user inputs, in order (empty without an eval model). */
    this.evalInputNames = evalSession ? evalSession.inputNames.filter((n) => !this.values.has(n)) : [];
    /** The eval model's outputs (loss first). */
    this.evalOutputNames = evalSession ? [...evalSession.outputNames] : [];
  }

  /**
   * One training step: forward, backward and optimizer update, in one run of the step model.
   * @param {Inputs} inputs  the user inputs (see `inputNames`)
   * @param {number} learningRate
   * @returns {Promise<StepResult>}
   */
  async trainStep(inputs, learningRate) {
    if (typeof learningRate !== 'number' || !Number.isFinite(learningRate)) {
      throw new TypeError(`learningRate must be a finite number, got ${String(learningRate)}`);
    }
    const ort = this.ort;
    /** @type {Record<string, Tensor>} */
    const feeds = this.feeds(inputs, this.inputNames, 'trainStep');
    for (const name of this.stepFeeds) feeds[name] = /** @type {Tensor} */ (this.values.get(name));
    feeds[LEARNING_RATE] = new ort.Tensor('float32', Float32Array.of(learningRate), [1]);
    feeds[STEP] = new ort.Tensor('int64', BigInt64Array.of(BigInt(this.step + 1)), [1]);
    if (this.flatState) feeds[FLAT_STATE] = this.flatState;
    const results = await this.stepSession.run(feeds);
    if (this.flatState) {
      this.flatState = /** @type {Tensor} */ (results[FLAT_STATE + UPDATED_SUFFIX]);
      this.unpacked = false;
    } else {
      for (const name of this.updated) this.values.set(name, /** @type {Tensor} */ (results[name + UPDATED_SUFFIX]));
    }
    this.step += 1;
    this.learningRate = learningRate;
    return result(results, this.outputNames);
  }

  /**
   * One eval step on the current parameters (no update).
   * @param {Inputs} inputs  the eval model's user inputs (see `evalInputNames`)
   * @returns {Promise<StepResult>}
   */
  async evalStep(inputs) {
    if (!this.evalSession) throw new TypeError('this Trainer has no eval model; pass evalModel to Trainer.create');
    const feeds = this.feeds(inputs, this.evalInputNames, 'evalStep');
    this.unpack();
    for (const name of this.evalSession.inputNames) {
      const value = this.values.get(name);
      if (value) feeds[name] = value;
    }
    return result(await this.evalSession.run(feeds), this.evalOutputNames);
  }

  /**
   * The current parameters as ORT tensors (shared, do not modify).
   * @param {boolean} [trainableOnly]
   * @returns {Map<string, Tensor>}
   */
  parameters(trainableOnly = false) {
    const names = trainableOnly ? this.trainable : [...this.trainable, ...this.frozen];
    this.unpack();
    return new Map(names.filter((n) => this.values.has(n)).map((n) => [n, /** @type {Tensor} */ (this.values.get(n))]));
  }

  /**
   * A copy of the parameters and optimizer state, to save (`serializeState`) and load back in Python.
   * @returns {Promise<TrainingState>}
   */
  async state() {
    /** @type {Map<string, NamedTensor>} */
    const tensors = new Map();
    this.unpack();
    for (const name of [...this.trainable, ...this.frozen, ...this.updated]) {
      if (!tensors.has(name)) tensors.set(name, await fromOrt(name, /** @type {Tensor} */ (this.values.get(name))));
    }
    const states = this.momentsPerParameter || 2;
    return { tensors, trainable: [...this.trainable], frozen: [...this.frozen], step: this.step, learningRate: this.learningRate, extra: { ...this.extra }, states };
  }

  /** Release the ORT sessions. */
  /**
   * How many nodes of the step model (after ONNX Runtime's optimizations) run on each execution provider, and of
   * which op types: from ONNX Runtime's own log of a throwaway session of the step model (src/placement.mjs).
   * @returns {Promise<import('./placement.mjs').Placement>}
   * @throws {Error} for a Trainer made with `Trainer.create` directly (no entry point to open the probe session)
   */
  async placement() {
    if (!this.placementProbe) throw new Error('placement() needs a trainer from loadTrainer (browser or Node), which knows how to read ONNX Runtime\'s log');
    return this.placementProbe();
  }

  /**
   * The carried tensors joined into one flat float32 tensor, in the layout's order.
   * @param {FlatLayout} layout
   * @returns {Tensor}
   */
  packState(layout) {
    const sizes = layout.map(([, , shape]) => elementCount(shape));
    const flat = new Float32Array(sizes.reduce((a, b) => a + b, 0));
    layout.forEach(([name, offset, shape], i) => {
      const value = this.values.get(name);
      if (!value || value.type !== 'float32' || String(value.dims) !== String(shape)) {
        throw new RangeError(`the flat step model carries '${name}' as float32 [${shape}]; the state has ${value ? `${value.type} [${value.dims}]` : 'no such tensor'}`);
      }
      flat.set(/** @type {Float32Array} */ (value.data).subarray(0, sizes[i]), offset);
    });
    // @ts-ignore -- the (type, data, dims) constructor is overloaded per type
    return new this.ort.Tensor('float32', flat, [flat.length]);
  }

  /** Cut the named tensors from the flat state after steps (a copy each: the flat state is replaced next step). */
  unpack() {
    if (this.unpacked || !this.flatState || !this.flatLayout) return;
    const flat = /** @type {Float32Array} */ (this.flatState.data);
    for (const [name, offset, shape] of this.flatLayout) {
      // @ts-ignore -- the (type, data, dims) constructor is overloaded per type
      this.values.set(name, new this.ort.Tensor('float32', flat.slice(offset, offset + elementCount(shape)), shape));
    }
    this.unpacked = true;
  }

  async release() {
    await this.stepSession.release();
    if (this.evalSession) await this.evalSession.release();
  }

  /**
   * @param {Inputs} inputs
   * @param {string[]} names
   * @param {string} what
   * @returns {Record<string, Tensor>}
   */
  feeds(inputs, names, what) {
    /** @type {Record<string, Tensor>} */
    const feeds = {};
    if (Array.isArray(inputs)) {
      if (inputs.length !== names.length) throw new RangeError(`${what} takes ${names.length} inputs (${names.join(', ')}), got ${inputs.length}`);
      names.forEach((name, i) => (feeds[name] = asOrt(this.ort, inputs[i], name)));
      return feeds;
    }
    if (inputs === null || typeof inputs !== 'object') throw new TypeError(`${what} takes an array or an object of inputs (${names.join(', ')})`);
    for (const name of names) {
      if (!(name in inputs)) throw new RangeError(`${what}: missing input '${name}'; the model's inputs are ${names.join(', ')}`);
      feeds[name] = asOrt(this.ort, inputs[name], name);
    }
    const unknown = Object.keys(inputs).filter((n) => !names.includes(n));
    if (unknown.length) throw new RangeError(`${what}: unknown input(s) ${unknown.join(', ')}; the model's inputs are ${names.join(', ')}`);
    return feeds;
  }
}

/**
 * @param {Ort} ort
 * @param {ModelSource} source
 * @param {string} what
 * @param {SessionOptions} options
 * @returns {Promise<Session>}
 */
async function openSession(ort, source, what, options) {
  try {
    // @ts-ignore -- create() is overloaded on the source type
    return await ort.InferenceSession.create(source instanceof ArrayBuffer ? new Uint8Array(source) : source, options);
  } catch (error) {
    const shown = typeof source === 'string' ? ` '${source}'` : '';
    const message = /** @type {Error} */ (error).message;
    if (/external|base_weights/i.test(message)) {
      throw new TypeError(`ONNX Runtime cannot load the ${what}${shown}: ${message}. Its frozen base weights are in the artifacts' base_weights.bin: keep it beside the model (or pass it as externalData), complete, from the same generate_artifacts run.`);
    }
    throw new TypeError(`ONNX Runtime cannot load the ${what}${shown}: ${message}. Portable artifacts (generate_artifacts(..., portable=True)) use standard ops only.`);
  }
}

/**
 * The layout of a flat step model from its metadata value (`onnxblocks.flat_state`), or null for a step model.
 * @param {Record<string, string>} metadata  the model's metadata (`modelMetadata(bytes)`)
 * @returns {FlatLayout | null}
 * @throws {TypeError} for a layout that is not `[[name, offset, shape], ...]`
 */
export function flatLayout(metadata) {
  const text = metadata[FLAT_STATE];
  if (text === undefined) return null;
  const layout = JSON.parse(text);
  checkLayout(layout);
  return layout;
}

/**
 * @param {unknown} layout
 * @returns {asserts layout is FlatLayout}
 */
function checkLayout(layout) {
  const entry = (/** @type {any} */ e) => Array.isArray(e) && e.length === 3 && typeof e[0] === 'string' && Number.isSafeInteger(e[1]) && e[1] >= 0 && Array.isArray(e[2]) && e[2].every((d) => Number.isSafeInteger(d) && d >= 0);
  if (!Array.isArray(layout) || !layout.length || !layout.every(entry)) {
    throw new TypeError(`the flat step model's '${FLAT_STATE}' metadata must be a list of [name, offset, shape]; regenerate it with onnxblocks.web.write_flat_step`);
  }
  let end = 0;
  for (const [name, offset, shape] of layout) {
    if (offset !== end) throw new TypeError(`the flat step model's layout puts '${name}' at ${offset}, not ${end}; regenerate it with onnxblocks.web.write_flat_step`);
    end += elementCount(shape);
  }
}

/**
 * @param {Session} session
 * @returns {Map<string, string>}
 */
function inputTypes(session) {
  const types = new Map();
  for (const meta of session.inputMetadata ?? []) if (meta.isTensor) types.set(meta.name, meta.type);
  return types;
}

/**
 * @param {string} name
 * @param {string} have
 * @param {string | undefined} want
 */
function checkType(name, have, want) {
  if (want !== undefined && want !== have) throw new TypeError(`parameter '${name}' is ${have} in the state, ${want} in the step model`);
}

/**
 * @param {Ort} ort
 * @param {NamedTensor} tensor
 * @returns {Tensor}
 */
function toOrt(ort, tensor) {
  // @ts-ignore -- the (type, data, dims) constructor is overloaded per type
  return new ort.Tensor(tensor.dtype, tensor.data, tensor.shape);
}

/**
 * @param {Ort} ort
 * @param {InputValue} value
 * @param {string} name
 * @returns {Tensor}
 */
function asOrt(ort, value, name) {
  if (value instanceof ort.Tensor) return value;
  if (value && typeof value === 'object' && 'dtype' in value && 'data' in value && 'shape' in value) return toOrt(ort, { ...value, name });
  if (value && typeof value === 'object' && 'type' in value && 'dims' in value && 'data' in value) {
    // a tensor of another copy of onnxruntime-common (instanceof fails across copies)
    return toOrt(ort, { name, dtype: /** @type {any} */ (value.type), shape: [...value.dims], data: /** @type {any} */ (value.data) });
  }
  throw new TypeError(`input '${name}' must be an ort.Tensor or a {dtype, shape, data} object`);
}

/**
 * @param {string} name
 * @param {Tensor} tensor
 * @returns {Promise<NamedTensor>}
 */
async function fromOrt(name, tensor) {
  const data = /** @type {import('./safetensors.mjs').TypedArray} */ (await tensor.getData());
  return { name, dtype: /** @type {import('./safetensors.mjs').DType} */ (tensor.type), shape: [...tensor.dims], data: data.slice() };
}

/**
 * @param {Record<string, import('onnxruntime-common').OnnxValue>} results
 * @param {string[]} names  loss first
 * @returns {StepResult}
 */
function result(results, names) {
  const lossTensor = /** @type {Tensor} */ (results[names[0]]);
  /** @type {Record<string, Tensor>} */
  const outputs = {};
  for (const name of names.slice(1)) outputs[name] = /** @type {Tensor} */ (results[name]);
  return { loss: Number(lossTensor.data[0]), outputs };
}
