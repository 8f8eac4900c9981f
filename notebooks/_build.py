"""Write the example notebooks with nbformat and execute them with nbclient.

The notebooks are committed with their outputs, so they read well on GitHub and
in exported HTML. Run this script after changing a notebook's cells or the
library::

    .venv/bin/python notebooks/_build.py            # all notebooks
    .venv/bin/python notebooks/_build.py 03          # the ones whose name contains "03"
    .venv/bin/python notebooks/_build.py --no-execute

Each notebook writes its artifacts into a temporary directory and needs no
network. tests/project/test_notebooks.py executes the committed notebooks again.
"""

from __future__ import annotations

import sys
import textwrap
import time
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent
KERNEL = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}


def md(text: str) -> nbformat.NotebookNode:
    """A markdown cell (the text is dedented)."""
    return new_markdown_cell(textwrap.dedent(text).strip())


def code(*parts: str) -> nbformat.NotebookNode:
    """A code cell made of ``parts``, each dedented, separated by blank lines."""
    return new_code_cell("\n\n".join(textwrap.dedent(p).strip() for p in parts))


# A small MLP written with onnx.helper; its names follow torch.onnx.export's (/fc1/MatMul, fc1.weight ...).
MLP = '''
def make_mlp(sizes, seed=0, output="output"):
    """x[batch, sizes[0]] -> Linear -> ReLU -> ... -> Linear -> output[batch, sizes[-1]]."""
    rng = np.random.default_rng(seed)
    nodes, inits, h = [], [], "x"
    layers = list(zip(sizes[:-1], sizes[1:]))
    for k, (n_in, n_out) in enumerate(layers, start=1):
        w = (rng.standard_normal((n_in, n_out)) * np.sqrt(2.0 / n_in)).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"fc{k}.weight"),
                  numpy_helper.from_array(np.zeros(n_out, np.float32), f"fc{k}.bias")]
        last = k == len(layers)
        nodes += [
            helper.make_node("MatMul", [h, f"fc{k}.weight"], [f"/fc{k}/MatMul_output_0"], name=f"/fc{k}/MatMul"),
            helper.make_node("Add", [f"/fc{k}/MatMul_output_0", f"fc{k}.bias"],
                             [output if last else f"/fc{k}/Add_output_0"], name=f"/fc{k}/Add"),
        ]
        if not last:
            nodes.append(helper.make_node("Relu", [f"/fc{k}/Add_output_0"], [f"/act{k}/Relu_output_0"],
                                          name=f"/act{k}/Relu"))
            h = f"/act{k}/Relu_output_0"
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", sizes[0]])],
        [helper.make_tensor_value_info(output, TensorProto.FLOAT, ["batch", sizes[-1]])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
'''

IMPORTS = '''
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import onnxblocks
from onnxblocks import display, losses
'''


def quickstart() -> list[nbformat.NotebookNode]:
    return [
        md("""
        # Quickstart: a custom weighted loss and training artifacts

        This notebook takes a small ONNX model, adds a **custom loss** made of two library losses
        (`0.7 * MSE + 0.3 * L1`), and writes the **training artifacts** that ONNX Runtime's training API
        runs: `training_model.onnx`, `eval_model.onnx`, `checkpoint` and `optimizer_model.onnx`.
        Along the way, Jupyter shows each object as a summary and a picture of its graph.
        """),
        code(IMPORTS, "from onnxblocks import OptimType, generate_artifacts"),
        md("""
        ## 1. The base model

        Any `onnx.ModelProto` works: one exported from PyTorch (see notebook 04) or, as here, a two-layer
        MLP written with `onnx.helper`. `display.show(model)` summarises its inputs, outputs and parameters
        (with sizes in bytes) and draws its graph. Parameters have a `?` status because a plain model does
        not say which of them will train.
        """),
        code(MLP, "model = make_mlp([4, 16, 2])\ndisplay.show(model)"),
        md("""
        ## 2. A custom loss is a Block

        A loss is a `Block`: its `build` method receives value names and adds nodes. The losses of
        `onnxblocks.losses` return `Value`s, and Python arithmetic on Values adds graph nodes, so the
        weighted sum reads like the maths. `MSELoss` creates the graph input `target` (shaped like
        `output`) the first time; `L1Loss` reuses it.
        """),
        code('''
        class WeightedLoss(onnxblocks.Block):
            """alpha * MSE(output, target) + (1 - alpha) * L1(output, target)."""

            def __init__(self, alpha=0.7):
                super().__init__()
                self.alpha = alpha
                self.mse = losses.MSELoss()
                self.l1 = losses.L1Loss()

            def build(self, output, target="target"):
                return self.alpha * self.mse(output, target) + (1.0 - self.alpha) * self.l1(output, target)
        '''),
        md("""
        Build it once on its own to look at it: inside `onnxblocks.base(model)` the block adds its nodes
        to a working copy of the model (the caller's model is never changed). Displaying the block lists
        the nodes it added and draws them, with the model's nodes around them faded.
        """),
        code('''
        weighted = WeightedLoss(alpha=0.7)
        with onnxblocks.base(model):
            loss = weighted("output")
        print("loss value:", loss)
        weighted
        '''),
        md("""
        ## 3. Generate the training artifacts

        `generate_artifacts` builds the loss on the model's output, asks ONNX Runtime's gradient builder for
        the gradients of the parameters named in `requires_grad`, adds gradient accumulation, and writes the
        files. The returned `Artifacts` shows the training model's summary, its gradient names, and its
        graph, with the eval and optimizer models one click away.
        """),
        code('''
        work = Path(tempfile.mkdtemp(prefix="onnxblocks-quickstart-"))
        artifacts = generate_artifacts(
            model,
            requires_grad=["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"],
            loss=WeightedLoss(alpha=0.7),
            optimizer=OptimType.AdamW,
            artifact_directory=work / "artifacts",
        )
        artifacts
        '''),
        code('''
        for path in sorted(artifacts.directory.iterdir()):
            print(f"{path.name:22} {path.stat().st_size:7,} bytes")
        '''),
        md("""
        ## 4. Check one training step against numpy

        `onnxblocks.runtime.TrainingSession` opens the artifacts with ONNX Runtime. One `train_step`
        returns the loss; computing the same loss with numpy from the checkpoint's parameters must agree.
        """),
        code('''
        from onnxblocks.runtime import TrainingSession

        session = TrainingSession(artifacts.directory)
        rng = np.random.default_rng(1)
        x = rng.standard_normal((8, 4)).astype(np.float32)
        target = rng.standard_normal((8, 2)).astype(np.float32)

        (loss_value,) = session.train_step(x, target)
        p = session.parameters()
        output = np.maximum(x @ p["fc1.weight"] + p["fc1.bias"], 0) @ p["fc2.weight"] + p["fc2.bias"]
        expected = 0.7 * np.mean((output - target) ** 2) + 0.3 * np.mean(np.abs(output - target))
        print(f"ONNX Runtime: {float(loss_value):.6f}   numpy: {expected:.6f}")
        np.testing.assert_allclose(loss_value, expected, rtol=1e-5)
        print("gradients:", {name: g.shape for name, g in session.gradients().items()})
        '''),
        md("""
        Next: **02** looks inside the training graph (forward and backward parts, gradient names, frozen
        parameters), **03** trains with `onnxblocks.runtime.fit` and plots the curves, **04** starts from a
        PyTorch model and a loss written in onnxscript.
        """),
    ]


def exploring() -> list[nbformat.NotebookNode]:
    return [
        md("""
        # Exploring training graphs

        A `TrainingBlock` builds a **training model** (forward + loss + backward + gradient accumulation)
        and an **eval model** (forward + loss). This notebook looks at both: which nodes are forward and
        which are backward, how gradients and accumulation buffers are named, and what changes when
        parameters are frozen. Box colours in the pictures: blue forward, purple loss, orange gradient,
        green accumulation; yellow boxes are trainable parameters, dashed grey ones frozen.
        """),
        code(IMPORTS, """
        from onnxblocks import TrainingBlock
        from onnxblocks.gradient import LAZY_RESET_GRAD, accumulated_name, buffer_name, gradient_name
        """),
        code(MLP, '''

        model = make_mlp([4, 16, 3], output="logits")


        class Classifier(TrainingBlock):
            def __init__(self):
                super().__init__()
                self.loss = losses.CrossEntropyLoss()

            def build(self, logits):
                return self.loss(logits, "labels")  # creates the int64 graph input "labels"


        PARAMETERS = ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
        block = Classifier()
        for name in PARAMETERS:
            block.requires_grad(name)
        with onnxblocks.base(model):
            loss = block("logits")
        block
        '''),
        md("""
        ## Forward and backward

        `display.show(obj, view=...)` focuses the picture: `"forward"` is the model and the loss,
        `"loss"` only the loss, `"backward"` the nodes ONNX Runtime's gradient builder added (they are
        named `<forward node>_Grad/...` and produce `*_grad` values) plus gradient accumulation.
        """),
        code('display.show(block, view="forward")'),
        code('display.show(block, view="backward")'),
        md("""
        ## Gradient and accumulation names

        For every trainable parameter `p` the training model computes `p_grad` and adds it to the buffer
        `p_grad.accumulation.buffer` (a graph input that ONNX Runtime keeps between steps) with an
        `InPlaceAccumulatorV2` node whose output `p_grad.accumulation.out` is a graph output. The graph
        input `lazy_reset_grad` tells the accumulators to start over after an optimizer step.
        """),
        code('''
        training = block.graphs.training
        produced = {o for node in training.graph.node for o in node.output}
        inputs = {i.name for i in training.graph.input}
        outputs = [o.name for o in training.graph.output]
        print(f"{'parameter':12} {'gradient':17} {'buffer (input)':38} accumulated (output)")
        for name in PARAMETERS:
            assert gradient_name(name) in produced and buffer_name(name) in inputs
            print(f"{name:12} {gradient_name(name):17} {buffer_name(name):38} {accumulated_name(name)}")
        print("reset flag input:", LAZY_RESET_GRAD, LAZY_RESET_GRAD in inputs)
        print("training outputs:", outputs)
        print("eval outputs:    ", [o.name for o in block.graphs.eval.graph.output])
        '''),
        md("""
        The neighbourhood of one parameter shows where it is used in the forward pass and where its
        gradient comes from (`around=` takes a node or value name, `depth=` the number of hops):
        """),
        code('display.show(block, around="fc2.weight", depth=2)'),
        md("""
        ## Freezing parameters

        `requires_grad(name, False)` freezes a parameter: it is still an input of the training and eval
        models (fed from the checkpoint), but it gets no gradient. Freezing the first layer removes its
        gradient nodes and accumulators, and the gradient builder no longer propagates past the ReLU.
        """),
        code('''
        frozen_block = Classifier()
        frozen_block.requires_grad("fc2.weight")
        frozen_block.requires_grad("fc2.bias")
        frozen_block.requires_grad("fc1.weight", False)
        frozen_block.requires_grad("fc1.bias", False)
        with onnxblocks.base(model):
            frozen_block("logits")


        def parts(b):
            index = display.GraphIndex(b.graphs.training, trainable=b.graphs.partition.trainable,
                                       frozen=b.graphs.partition.frozen, loss_nodes=b.nodes)
            return index.part_counts()


        frozen_training = frozen_block.graphs.training
        print("nodes per part, all trainable:", parts(block))
        print("nodes per part, fc1 frozen:   ", parts(frozen_block))
        print("outputs, fc1 frozen:", [o.name for o in frozen_training.graph.output])
        print("trainable:", frozen_block.graphs.partition.trainable, " frozen:", frozen_block.graphs.partition.frozen)
        '''),
        code('display.show(frozen_block, view="backward")'),
        md("""
        ## Large graphs

        Pictures stay readable and fast for big models: beyond `max_nodes` boxes (300 by default), nodes
        are grouped by the scope in their names (`/layers.3/attn/...`), repeated blocks with the same ops
        become one box with a count, and what still does not fit is cut with a note. Here is a synthetic
        10,000-node model with 48 identical layers:
        """),
        code('''
        def layered_model(layers=48, per_block=104):
            nodes, inits, prev = [], [], "x"
            for k in range(layers):
                for part in ("attn", "mlp"):
                    h = prev
                    for j in range(per_block):
                        name = f"/layers.{k}/{part}/{'MatMul' if j % 2 == 0 else 'Add'}_{j}"
                        if j % 2 == 0:
                            w = f"layers.{k}.{part}.w{j}"
                            inits.append(numpy_helper.from_array(np.zeros((8, 8), np.float32), w))
                            nodes.append(helper.make_node("MatMul", [h, w], [name + "_output_0"], name=name))
                        else:
                            nodes.append(helper.make_node("Add", [h, prev], [name + "_output_0"], name=name))
                        h = name + "_output_0"
                    prev = h
            graph = helper.make_graph(
                nodes, "layers", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
                [helper.make_tensor_value_info(prev, TensorProto.FLOAT, ["batch", 8])], inits)
            return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


        big = layered_model()
        print(len(big.graph.node), "nodes,", len(big.graph.initializer), "initializers")
        display.show(big)
        '''),
        code('display.show(big, around="layers.7.attn.w4", depth=2)'),
    ]


def training_loop() -> list[nbformat.NotebookNode]:
    return [
        md("""
        # A training loop with `onnxblocks.runtime`

        Train a small classifier on synthetic data with ONNX Runtime's training engine, driven by
        `onnxblocks.runtime.fit`, and plot the loss and accuracy curves with matplotlib. No PyTorch is
        involved.
        """),
        code(IMPORTS, '''
        import matplotlib.pyplot as plt

        from onnxblocks import LossType, OptimType, generate_artifacts, runtime
        '''),
        md("## Data: three Gaussian blobs in the plane"),
        code('''
        rng = np.random.default_rng(0)
        CENTERS = np.array([[0.0, 2.0], [-1.8, -1.0], [1.8, -1.0]])


        def blobs(n):
            labels = rng.integers(0, 3, n)
            x = CENTERS[labels] + rng.standard_normal((n, 2)) * 0.9
            return x.astype(np.float32), labels.astype(np.int64)


        x_train, y_train = blobs(1200)
        x_val, y_val = blobs(400)
        fig, ax = plt.subplots(figsize=(4, 4))
        ax.scatter(x_train[:, 0], x_train[:, 1], c=y_train, s=6, cmap="viridis")
        ax.set_title("training data")
        plt.show()
        '''),
        md("""
        ## Model and artifacts

        A 2-32-3 MLP with a cross-entropy loss and AdamW. `additional_output_names=["logits"]` makes the
        training and eval models also return the logits, which the `Accuracy` callback reads.
        """),
        code(MLP, '''

        model = make_mlp([2, 32, 3], output="logits")
        work = Path(tempfile.mkdtemp(prefix="onnxblocks-training-"))
        artifacts = generate_artifacts(
            model,
            requires_grad=[init.name for init in model.graph.initializer],
            loss=LossType.CrossEntropyLoss,
            optimizer=OptimType.AdamW,
            artifact_directory=work,
            additional_output_names=["logits"],
        )
        display.show(artifacts, view="forward")
        '''),
        md("""
        ## Train

        `fit` runs `train_step` on each batch, an optimizer step after each batch (or every
        `accumulation_steps` batches), and an eval pass per epoch. It returns a `History`.
        """),
        code('''
        session = runtime.TrainingSession(artifacts.directory)
        session.learning_rate = 0.01
        history = runtime.fit(
            session,
            runtime.ArrayBatches((x_train, y_train), batch_size=32, seed=0),
            epochs=15,
            eval_data=runtime.ArrayBatches((x_val, y_val), batch_size=200, shuffle=False),
            callbacks=[runtime.Accuracy(output=1)],
            progress=False,
        )
        print(f"{history.steps} optimizer steps, {history.samples:,} samples")
        for logs in history.epochs[::3] + history.epochs[-1:]:
            print({k: round(v, 4) for k, v in logs.items()})
        assert history.epochs[-1]["accuracy"] > 0.9
        '''),
        md("## Curves"),
        code('''
        fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 3.5))
        steps = np.arange(1, len(history.losses) + 1)
        ax_loss.plot(steps, history.losses, lw=0.8, alpha=0.6, label="train loss (per batch)")
        ax_loss.plot(history.epoch_ends, history.metric("loss"), "o-", label="train loss (epoch mean)")
        ax_loss.plot(history.epoch_ends, history.metric("eval_loss"), "s-", label="eval loss")
        ax_loss.set_xlabel("train step")
        ax_loss.set_yscale("log")
        ax_loss.legend()
        epochs = [int(e["epoch"]) for e in history.epochs]
        ax_acc.plot(epochs, history.metric("accuracy"), "o-", color="tab:green")
        ax_acc.set_xlabel("epoch")
        ax_acc.set_ylabel("eval accuracy")
        ax_acc.set_ylim(0.5, 1.0)
        plt.tight_layout()
        plt.show()
        '''),
        md("""
        ## Decision regions

        `eval_step` runs the eval model (training-mode ops off). Its inputs are the training inputs, so it
        also takes labels; their values do not change the logits.
        """),
        code('''
        grid = np.stack(np.meshgrid(np.linspace(-5, 5, 120), np.linspace(-5, 5, 120)), -1).reshape(-1, 2)
        grid = grid.astype(np.float32)
        _, logits = session.eval_step(grid, np.zeros(len(grid), np.int64))
        fig, ax = plt.subplots(figsize=(4, 4))
        ax.contourf(grid[:, 0].reshape(120, 120), grid[:, 1].reshape(120, 120),
                    logits.argmax(-1).reshape(120, 120), alpha=0.3, cmap="viridis")
        ax.scatter(x_val[:, 0], x_val[:, 1], c=y_val, s=6, cmap="viridis")
        ax.set_title("eval data and decision regions")
        plt.show()
        '''),
    ]


def from_pytorch() -> list[nbformat.NotebookNode]:
    return [
        md("""
        # From PyTorch and onnxscript

        Export a PyTorch model to ONNX, write a loss as an **onnxscript function**, turn it into a block
        with `ScriptBlock`, generate the training artifacts, and check the first training steps against
        PyTorch's autograd and `torch.optim.AdamW`. PyTorch is only used to export the model and to check
        the numbers; onnxblocks itself never imports it.
        """),
        code(IMPORTS, '''
        import warnings

        import torch
        from onnxscript import opset17 as op
        from onnxscript import script

        from onnxblocks import ScriptBlock, generate_artifacts, optim, runtime
        from onnxblocks.blocks import InputLike
        '''),
        md("""
        ## Export the model

        `dynamo=False` selects the TorchScript exporter, which names parameters like the module
        (`fc1.weight`) and nodes by scope (`/fc1/Gemm`); `do_constant_folding=False` keeps the parameters
        as initializers that can train.
        """),
        code('''
        torch.manual_seed(0)


        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.fc1 = torch.nn.Linear(3, 16)
                self.act = torch.nn.Tanh()
                self.fc2 = torch.nn.Linear(16, 1)

            def forward(self, x):
                return self.fc2(self.act(self.fc1(x)))


        net = Net()
        work = Path(tempfile.mkdtemp(prefix="onnxblocks-torch-"))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # dynamo=False is the legacy exporter, on purpose
            torch.onnx.export(
                net, (torch.randn(4, 3),), work / "net.onnx", input_names=["x"], output_names=["prediction"],
                dynamic_axes={"x": {0: "batch"}, "prediction": {0: "batch"}}, opset_version=17,
                dynamo=False, do_constant_folding=False,
            )
        model = onnx.load(work / "net.onnx")
        display.show(model)
        '''),
        md("""
        ## A loss in onnxscript

        The pseudo-Huber loss `mean(delta^2 * (sqrt(1 + ((p - t) / delta)^2) - 1))` behaves like MSE near
        zero and like L1 far from it. Written with onnxscript it reads like the formula; `delta` is an
        attribute with a default. `ScriptBlock` inlines the function's nodes into the model being built,
        with fresh names, so ONNX Runtime can differentiate them.
        """),
        code('''
        @script(default_opset=op)
        def pseudo_huber(prediction, target, delta: float = 1.0):
            d = (prediction - target) / delta
            return op.ReduceMean(delta * delta * (op.Sqrt(1.0 + d * d) - 1.0), keepdims=0)


        class PseudoHuberLoss(onnxblocks.Block):
            def __init__(self, delta=1.0):
                super().__init__()
                self.huber = ScriptBlock(pseudo_huber, delta=delta)

            def build(self, prediction):
                target = InputLike(prediction)("target")  # a graph input shaped like the prediction
                return self.huber(prediction, target)


        loss_block = PseudoHuberLoss(delta=0.5)
        with onnxblocks.base(model):
            loss_block("prediction")
        loss_block.huber
        '''),
        md("## Artifacts"),
        code('''
        artifacts = generate_artifacts(
            model,
            requires_grad=[init.name for init in model.graph.initializer],
            loss=PseudoHuberLoss(delta=0.5),
            optimizer=optim.AdamW(),
            artifact_directory=work / "artifacts",
        )
        artifacts
        '''),
        md("""
        ## Check against PyTorch

        The same loss in PyTorch, on the same weights: the first step's loss and gradients, then the
        parameters after 20 AdamW steps (both sides use `torch.optim.AdamW`'s defaults with `lr=0.01`).
        """),
        code('''
        def torch_pseudo_huber(prediction, target, delta=0.5):
            d = (prediction - target) / delta
            return (delta**2 * (torch.sqrt(1 + d * d) - 1)).mean()


        def batch(rng, n=32):
            x = rng.standard_normal((n, 3)).astype(np.float32)
            return x, np.sin(x.sum(1, keepdims=True)).astype(np.float32)


        session = runtime.TrainingSession(artifacts.directory)
        session.learning_rate = 0.01
        torch_optimizer = torch.optim.AdamW(net.parameters(), lr=0.01)
        rng = np.random.default_rng(0)

        x, y = batch(rng)
        (loss_ort,) = session.train_step(x, y)
        torch_optimizer.zero_grad()
        loss_torch = torch_pseudo_huber(net(torch.from_numpy(x)), torch.from_numpy(y))
        loss_torch.backward()
        print(f"loss: ONNX Runtime {float(loss_ort):.7f}, torch {loss_torch.item():.7f}")
        gradients = session.gradients()
        for name, p in net.named_parameters():
            print(f"  {name:10} gradient max |diff| = {np.abs(gradients[name] - p.grad.numpy()).max():.1e}")
            np.testing.assert_allclose(gradients[name], p.grad.numpy(), rtol=1e-4, atol=1e-6)
        session.optimizer_step()
        torch_optimizer.step()

        for _ in range(19):
            x, y = batch(rng)
            session.train_step(x, y)
            session.optimizer_step()
            torch_optimizer.zero_grad()
            torch_pseudo_huber(net(torch.from_numpy(x)), torch.from_numpy(y)).backward()
            torch_optimizer.step()
        params = session.parameters()
        for name, p in net.named_parameters():
            diff = np.abs(params[name] - p.detach().numpy()).max()
            print(f"  {name:10} after 20 steps max |diff| = {diff:.1e}")
            np.testing.assert_allclose(params[name], p.detach().numpy(), rtol=1e-4, atol=1e-5)
        '''),
    ]


def torch_module() -> list[nbformat.NotebookNode]:
    return [
        md("""
        # A torch module trained through ONNX Runtime

        `onnxblocks.torch.OrtModule` wraps a `torch.nn.Module`: on the first call it exports the module
        with torch's exporter, builds the forward and backward graphs with onnxblocks, and from then on
        runs both in ONNX Runtime. The parameters and buffers stay the module's own, so a
        `torch.optim` optimizer, `state_dict()` and `train()` / `eval()` work as usual.
        (`pip install "onnxblocks[torch]"`; see `docs/torch.md`.)
        """),
        code('''
        import copy

        import numpy as np
        import torch

        from onnxblocks import datasets, display
        from onnxblocks.torch import OrtModule

        torch.manual_seed(0)
        features, labels = datasets.spirals(points_per_class=200, classes=3, seed=0)
        x, y = torch.from_numpy(features), torch.from_numpy(labels)


        class Net(torch.nn.Module):
            def __init__(self, hidden=64):
                super().__init__()
                self.fc1 = torch.nn.Linear(2, hidden)
                self.bn = torch.nn.BatchNorm1d(hidden)
                self.drop = torch.nn.Dropout(0.1)
                self.fc2 = torch.nn.Linear(hidden, hidden)
                self.head = torch.nn.Linear(hidden, 3)

            def forward(self, x):
                h = self.drop(torch.relu(self.bn(self.fc1(x))))
                return self.head(torch.relu(self.fc2(h)))


        net = Net()
        model = OrtModule(net)  # exports on the first call (dynamo), per mode and input signature
        print(list(model.state_dict())[:4], "...")  # the module's own names
        '''),
        md("""
        ## Train

        A plain torch training loop. Only the forward and backward run in ONNX Runtime; the loss and
        AdamW are torch's. BatchNorm's running statistics are updated as torch updates them.
        """),
        code('''
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.02)
        model.train()
        for step in range(1, 151):
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            if step % 50 == 0:
                print(f"step {step:3d}  loss {loss.item():.4f}")
        print("BatchNorm batches tracked:", int(net.bn.num_batches_tracked))

        model.eval()
        with torch.no_grad():
            accuracy = (model(x).argmax(1) == y).float().mean().item()
        print(f"training accuracy (eval mode): {accuracy:.1%}")
        '''),
        md("""
        ## Same numbers as torch

        In eval mode (no Dropout mask to draw) the wrapped module and the module itself give the same
        outputs and gradients.
        """),
        code('''
        reference = copy.deepcopy(net).eval()
        for m in (model, reference):
            m.zero_grad()
            torch.nn.functional.cross_entropy(m(x), y).backward()
        for (name, p), q in zip(net.named_parameters(), reference.parameters()):
            np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-4, atol=1e-5)
        print("gradients equal torch's for", [name for name, _ in net.named_parameters()])
        '''),
        md("""
        ## The graphs

        The exported model (eval mode, the latest export), with its trainable parameters marked, and the
        backward half that ONNX Runtime runs: it reads the values the forward half saved, not a second
        forward pass.
        """),
        code('''
        display.show(model.onnx_model, trainable=[name for name, _ in net.named_parameters()])
        '''),
        code('''
        graphs = model.gradient_graphs
        print(f"saved by the forward for the backward: {len(graphs.saved)} values")
        display.show(graphs.backward)
        '''),
    ]


def lora() -> list[nbformat.NotebookNode]:
    return [
        md("""
        # LoRA adapters on an exported transformer

        `onnxblocks.peft` adds LoRA adapters (Hugging Face PEFT's names and numbers) to an exported model:
        each target projection `y = x @ W^T` gets `x @ A^T @ B^T * (lora_alpha / r)` added, only `A` and `B`
        train, and the base stays a frozen constant. This notebook pre-trains a small LLaMA briefly in torch
        on a synthetic language (sequences counting up by one), adds adapters to its attention, fine-tunes
        them with onnxblocks on counting by two, and generates from the merged model. (torch and transformers
        build the base; see `docs/lora.md`.)
        """),
        code('''
        import tempfile
        import warnings
        from pathlib import Path

        import numpy as np
        import onnx
        import torch

        warnings.filterwarnings("ignore", message="IProgress not found")  # transformers' tqdm, without ipywidgets

        from onnxblocks import display
        from onnxblocks.artifacts import OptimType, generate_artifacts
        from onnxblocks.losses import CrossEntropyLoss
        from onnxblocks.peft import LoraConfig, apply_lora, lora_info
        from onnxblocks.runtime import TrainingSession
        from onnxblocks.torch import lora_demo as demo  # the helpers of `onnxblocks demo --lora`

        torch.manual_seed(0)
        work = Path(tempfile.mkdtemp())
        lm = demo.build_llama(seed=0)  # transformers.LlamaConfig: 2 layers, hidden 32, 4 heads, vocabulary 16
        losses = demo.pretrain(lm, steps=50)
        print(f"pre-trained on counting by one: loss {losses[0]:.3f} -> {losses[-1]:.4f}")
        base = onnx.load(demo.export_lm(lm, work / "base.onnx", batch=16))  # TorchScript export, input_ids -> logits
        '''),
        md("""
        ## One attention block, before and after

        The first layer's query, key and value projections and their neighbours in the exported graph, then
        the same after `apply_lora`: the adapter branches of `q_proj` and `v_proj` (two MatMuls with the
        transposed adapters, the scale, and the Add that joins the layer's output) appear beside the frozen
        projections.
        """),
        code('''
        projections = [f"/model/layers.0/self_attn/{p}/MatMul" for p in ("q_proj", "k_proj", "v_proj")]
        display.show(base, around=projections, depth=2)
        '''),
        code('''
        config = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"])
        lora_model = apply_lora(base, config, seed=0)
        info = lora_info(lora_model)
        layer0 = [n for t in info.targets.values() if ".layers.0." in t.lora_A for n in (t.lora_A, t.lora_B)]
        display.show(lora_model, around=projections + layer0, depth=2, trainable=list(info.adapter_names))
        '''),
        md("""
        ## Frozen and trainable parameters

        The adapters are the model's only trainable tensors; every base weight is frozen. `lora_A` is
        `[r, in_features]`, `lora_B` `[out_features, r]` (zero at first), as PEFT stores them.
        """),
        code('''
        shapes = {t.name: list(t.dims) for t in lora_model.graph.initializer}
        trainable = set(info.adapter_names)
        print(f"{'parameter':<52} {'shape':>9} {'':>9}")
        for name in sorted(shapes, key=lambda n: (n not in trainable, n)):
            if name in trainable or np.prod(shapes[name]) > 100:
                print(f"{name:<52} {str(shapes[name]):>9} {'trainable' if name in trainable else 'frozen':>9}")
        n_train = sum(int(np.prod(shapes[n])) for n in trainable)
        n_frozen = sum(int(np.prod(s)) for n, s in shapes.items() if n not in trainable)
        print(f"trainable {n_train:,} ({n_train / (n_train + n_frozen):.1%}), frozen {n_frozen:,}")
        '''),
        md("""
        ## Train the adapters

        `generate_artifacts(..., lora=config)` applies the same transform and trains only the adapters (the
        checkpoint holds them and their AdamW moments, nothing of the base). The task shifts to counting by two.
        """),
        code('''
        generate_artifacts(
            str(work / "base.onnx"), loss=CrossEntropyLoss(class_axis=-1), optimizer=OptimType.AdamW,
            artifact_directory=work / "artifacts", additional_output_names=["logits"], lora=config,
        )
        session = TrainingSession(work / "artifacts")
        print("checkpoint holds only the adapters:", set(session.parameter_names()) == trainable)
        rng = np.random.default_rng(1)
        held_out = demo.counting(rng, 16, stride=2)
        before = float(session.eval_step(held_out[:, :-1], held_out[:, 1:])[0])
        session.learning_rate = 3e-2
        for step in range(1, 61):
            batch = demo.counting(rng, 16, stride=2)
            loss = session.train_and_update(batch[:, :-1], batch[:, 1:])[0]
            if step % 20 == 0:
                print(f"step {step}: loss {float(loss):.4f}")
        after = float(session.eval_step(held_out[:, :-1], held_out[:, 1:])[0])
        print(f"held-out loss on counting by two: {before:.3f} -> {after:.3f}")
        '''),
        md("""
        ## Merge, save, generate

        `export_inference_model(..., merge_adapters=True)` folds `W + scale * B @ A` into each base weight and
        removes the branches: the merged model has the base model's nodes. `save_adapters` writes the PEFT
        directory that `peft.PeftModel.from_pretrained(base_model, directory)` loads. Greedy generation with
        onnxruntime: the base model still counts by one, the merged model by two.
        """),
        code('''
        merged = session.export_inference_model(work / "merged.onnx", ["logits"], merge_adapters=True)
        adapters = session.save_adapters(work / "adapters")
        print("merged model:", len(onnx.load(merged).graph.node), "nodes; base:", len(base.graph.node))
        print("PEFT directory:", sorted(p.name for p in adapters.iterdir()))

        prompts = np.array([[1, 3, 5], [4, 6, 8], [10, 12, 14]] + [[0, 2, 4]] * 13)
        for name, path in (("base", work / "base.onnx"), ("merged", merged)):
            for prompt, cont in zip(prompts[:3], demo.greedy(path, prompts, 7)):
                print(f"{name:>6}: {' '.join(map(str, prompt))} | {' '.join(map(str, cont))}")
        '''),
    ]


def federated() -> list[nbformat.NotebookNode]:
    return [
        md("""
        # Federated learning on Flower

        Four clients each hold part of the demo's spiral data, most of it from one class, and never share it.
        Every round a Flower server sends the global parameters of one set of training artifacts to the
        clients, each trains a few local epochs with `onnxblocks.runtime.fit`, and the server averages the
        updates with Flower's FedAvg. `onnxblocks.federated.simulate` runs this on Flower's simulation
        runtime with Flower's own commands (`flower-superlink --simulation`, `flwr run`).
        (`pip install "onnxblocks[flower]"`; see `docs/federated.md`.)
        """),
        code('''
        import tempfile
        from pathlib import Path

        import matplotlib.pyplot as plt
        import numpy as np

        from onnxblocks import artifacts, federated, optim
        from onnxblocks.datasets import spirals, train_val_split
        from onnxblocks.demo import build_classifier
        from onnxblocks.losses import CrossEntropyLoss
        '''),
        md("""
        ## Data: non-IID clients

        The training points go to four clients; client *k* gets 80% of its points from class *k* mod 3. The
        server keeps a held-out set to measure the global model after each round.
        """),
        code('''
        work = Path(tempfile.mkdtemp(prefix="onnxblocks-federated-"))
        x, y = spirals(points_per_class=400, seed=0)
        (x_train, y_train), (x_val, y_val) = train_val_split(x, y, 0.2)
        rng = np.random.default_rng(0)
        owner = np.array([
            rng.choice([k for k in range(4) if k % 3 == c]) if rng.random() < 0.8
            else rng.choice([k for k in range(4) if k % 3 != c])
            for c in y_train
        ])
        files = []
        for k in range(4):
            files.append(work / f"client{k}.npz")
            np.savez(files[-1], features=x_train[owner == k], labels=y_train[owner == k])
            print(f"client {k}: {np.bincount(y_train[owner == k], minlength=3)} points per class")
        np.savez(work / "held_out.npz", features=x_val, labels=y_val)

        fig, axes = plt.subplots(1, 4, figsize=(12, 3), sharex=True, sharey=True)
        for k, ax in enumerate(axes):
            ax.scatter(x_train[owner == k, 0], x_train[owner == k, 1], c=y_train[owner == k], s=4,
                       cmap="viridis", vmin=0, vmax=2)
            ax.set_title(f"client {k}")
        plt.show()
        '''),
        md("""
        ## Artifacts

        The demo's 2-64-64-3 classifier with cross entropy and AdamW. Every client trains these artifacts;
        only their trainable parameters travel (here all of them).
        """),
        code('''
        model = build_classifier(seed=0)
        written = artifacts.generate_artifacts(
            model,
            requires_grad=[init.name for init in model.graph.initializer],
            loss=CrossEntropyLoss(),
            optimizer=optim.AdamW(weight_decay=0.0),
            artifact_directory=work / "artifacts",
            additional_output_names=["logits"],
        )
        print([f.name for f in written.files])
        '''),
        md("""
        ## Ten rounds of FedAvg

        Each round every client trains two local epochs (batches of 32, learning rate 0.01, a fresh optimizer
        state) from the global parameters, then evaluates the new global model on its own data; the server
        evaluates it on the held-out set. After the last round the server writes a checkpoint in the
        artifacts' format and an inference model.
        """),
        code('''
        history = federated.simulate(
            work / "artifacts",
            files,
            workdir=work / "flower",
            rounds=10,
            strategy="fedavg",
            local_epochs=2,
            lr=0.01,
            batch_size=32,
            eval_data=str(work / "held_out.npz"),
            save=str(work / "global.ckpt"),
            export=str(work / "global.onnx"),
        )
        for (r, loss), (_, acc) in zip(history.metric("train-loss"), history.metric("accuracy", "server")[1:]):
            print(f"round {r:2d}: clients' train loss {loss:.3f}, held-out accuracy {acc:.3f}")
        print("dropped replies:", history.dropped)
        assert history.metric("accuracy", "server")[-1][1] >= 0.9
        '''),
        md("""
        ## Per-client and global metrics per round

        The history keeps the strategy's aggregates, every client's reply and the server's evaluations.
        `history.plot(path)` writes the same curves as SVG; here they are drawn with matplotlib.
        """),
        code('''
        fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 3.8))
        for client, points in history.client_metric("train-loss").items():
            ax_loss.plot(*zip(*points), "-", lw=1, alpha=0.6, label=f"client {client}")
        ax_loss.plot(*zip(*history.metric("train-loss")), "o-", color="black", label="global (weighted)")
        ax_loss.set_xlabel("round")
        ax_loss.set_ylabel("local training loss")
        ax_loss.legend()
        for client, points in history.client_metric("accuracy", phase="evaluate").items():
            ax_acc.plot(*zip(*points), "-", lw=1, alpha=0.6, label=f"client {client} (own data)")
        ax_acc.plot(*zip(*history.metric("accuracy", "server")), "s-", color="black", label="server (held out)")
        ax_acc.set_xlabel("round")
        ax_acc.set_ylabel("accuracy of the global model")
        ax_acc.legend()
        plt.tight_layout()
        plt.show()
        '''),
        md("""
        ## The global model

        The exported inference model runs on any onnxruntime.
        """),
        code('''
        import onnxruntime

        logits = onnxruntime.InferenceSession(str(work / "global.onnx")).run(None, {"features": x_val})[0]
        print(f"global model accuracy on the held-out set: {np.mean(logits.argmax(1) == y_val):.3f}")
        grid = np.stack(np.meshgrid(np.linspace(-1.2, 1.2, 150), np.linspace(-1.2, 1.2, 150)), -1)
        regions = onnxruntime.InferenceSession(str(work / "global.onnx")).run(
            None, {"features": grid.reshape(-1, 2).astype(np.float32)})[0].argmax(1)
        fig, ax = plt.subplots(figsize=(4, 4))
        ax.contourf(grid[..., 0], grid[..., 1], regions.reshape(150, 150), alpha=0.3, cmap="viridis")
        ax.scatter(x_val[:, 0], x_val[:, 1], c=y_val, s=5, cmap="viridis")
        ax.set_title("held-out data and the global model's regions")
        plt.show()
        '''),
    ]


NOTEBOOKS = {
    "01_quickstart": quickstart,
    "02_exploring_training_graphs": exploring,
    "03_training_loop": training_loop,
    "04_from_pytorch_and_onnxscript": from_pytorch,
    "05_torch_module": torch_module,
    "06_lora": lora,
    "07_federated": federated,
}


def make(name: str) -> nbformat.NotebookNode:
    """The notebook ``name`` without outputs."""
    nb = new_notebook(cells=NOTEBOOKS[name]())
    nb.metadata["kernelspec"] = KERNEL
    nb.metadata["language_info"] = {"name": "python"}
    return nb


def execute(nb: nbformat.NotebookNode, timeout: int = 300) -> nbformat.NotebookNode:
    """Run every cell of ``nb`` in a fresh python3 kernel (this interpreter), in the notebooks directory."""
    from nbclient import NotebookClient

    NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(HERE)}}).execute()
    return nb


def main(argv: list[str]) -> int:
    run = "--no-execute" not in argv
    wanted = [a for a in argv if not a.startswith("--")]
    for name in NOTEBOOKS:
        if wanted and not any(w in name for w in wanted):
            continue
        nb = make(name)
        start = time.perf_counter()
        if run:
            execute(nb)
        path = HERE / f"{name}.ipynb"
        nbformat.validate(nb)
        nbformat.write(nb, path)
        print(f"{path.name}: {len(nb.cells)} cells, {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
