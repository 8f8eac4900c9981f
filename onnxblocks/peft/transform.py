"""apply_lora: add LoRA adapter branches to the target Linear layers of an exported model.

Each target ``y = x @ W^T`` (a MatMul or Gemm, found by :mod:`onnxblocks.peft.targets`) becomes::

    y' = y + ((dropout(x) @ A^T) @ B^T) * (lora_alpha / r)

as PEFT's ``lora.Linear.forward`` computes it: ``A`` (``<module>.lora_A.weight``, ``[r, in]``) and
``B`` (``<module>.lora_B.weight``, ``[out, r]``) are new float32 initializers, the only ones meant
to
train; the base weight is untouched. ``dropout`` is a ``Dropout`` in training mode when
``lora_dropout > 0`` (the artifacts' eval model switches it off) and absent otherwise.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import onnx

from onnxblocks._core import limits as _limits
from onnxblocks._core.contracts import LORA_METADATA
from onnxblocks._core.errors import InvalidTypeError, InvalidValueError
from onnxblocks.peft.config import LoraConfig
from onnxblocks.peft.info import LoraInfo, LoraTarget

if TYPE_CHECKING:
    import onnx_ir as ir

    from onnxblocks.ir.writer import Writer
    from onnxblocks.peft.targets import LinearSite

__all__ = ["adapter_names", "apply_lora", "initial_adapters"]

#: The opset from which Dropout takes its ratio and training flag as inputs.
_DROPOUT_INPUTS_SINCE = 12


def adapter_names(module: str) -> tuple[str, str]:
    """The names of a module's adapters, as PEFT names them: ``<module>.lora_A.weight``,
    ``<module>.lora_B.weight``.
    """
    return f"{module}.lora_A.weight", f"{module}.lora_B.weight"


def initial_adapters(
    config: LoraConfig, in_features: int, out_features: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """``(A, B)`` initialised as PEFT's ``reset_lora_parameters`` does (float32, drawn from
    ``rng``).

    ``init_lora_weights=True``: A from ``kaiming_uniform_(a=sqrt(5))`` over ``[r, in]``, i.e.
    ``U(-1/sqrt(in), 1/sqrt(in))``, and B zero; ``"gaussian"``: A normal with std ``1 / r``, B zero;
    ``False``: both as a fresh ``nn.Linear`` (``U(-1/sqrt(fan_in), 1/sqrt(fan_in))``).
    """
    r = config.r
    if config.init_lora_weights == "gaussian":
        a = rng.normal(0.0, 1.0 / r, (r, in_features))
    else:
        bound = 1.0 / math.sqrt(in_features)
        a = rng.uniform(-bound, bound, (r, in_features))
    if config.init_lora_weights is False:
        bound_b = 1.0 / math.sqrt(r)
        b = rng.uniform(-bound_b, bound_b, (out_features, r))
    else:
        b = np.zeros((out_features, r))
    return a.astype(np.float32), b.astype(np.float32)


def apply_lora(model: onnx.ModelProto, config: LoraConfig, *, seed: int = 0) -> onnx.ModelProto:
    """A copy of ``model`` with LoRA adapters on the modules ``config.target_modules`` names.

    The model is not changed. Its base weights stay as they are (external data keeps its
    locations; no weight is read). The new model records the adapters in its metadata
    ``onnxblocks.lora`` (:func:`~onnxblocks.peft.lora_info`).

    Example:
        >>> lora_model = apply_lora(onnx.load("llama.onnx"), LoraConfig(r=8, lora_alpha=16,
        ...                         target_modules=["q_proj", "v_proj"]))
        >>> lora_info(lora_model).adapter_names[:2]
        ('model.layers.0.self_attn.q_proj.lora_A.weight',
        'model.layers.0.self_attn.q_proj.lora_B.weight')

    Args:
        model: A float32 model exported from torch (either exporter; see docs/lora.md), or a
            quantized hub file (MatMulNBits, MatMulInteger, QDQ): its quantized layers become
            standard-op dequantizations (:mod:`onnxblocks.peft.dequantize`, opset 21).
        config: The LoRA config.
        seed: Seed of the initial ``lora_A`` (and ``lora_B`` with ``init_lora_weights=False``)
        values.

    Returns:
        The model with the adapter branches.

    Raises:
        InvalidTypeError: ``model`` is not a ModelProto, ``config`` not a LoraConfig, ``seed`` not
        an int.
        InvalidValueError: the model already has adapters; ``target_modules`` matches nothing or a
        module
            that is not a float32 Linear layer; an adapter name is taken; dropout below opset 12.
    """
    if not isinstance(model, onnx.ModelProto):
        raise InvalidTypeError(f"apply_lora takes an onnx.ModelProto, got {type(model).__name__}")
    if not isinstance(config, LoraConfig):
        raise InvalidTypeError(
            "apply_lora's config must be an onnxblocks.peft.LoraConfig, got "
            f"{type(config).__name__}"
        )
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise InvalidTypeError(f"apply_lora's seed must be an int, got {type(seed).__name__}")
    if any(p.key == LORA_METADATA for p in model.metadata_props):
        raise InvalidValueError(
            f"the model already carries LoRA adapters (metadata {LORA_METADATA!r}): apply LoRA "
            "to the base model"
        )
    # the IR is loaded on first use: `import onnxblocks.peft` stays light for the runtime
    from onnxblocks.ir import serde
    from onnxblocks.ir.names import graph_names
    from onnxblocks.ir.writer import Writer
    from onnxblocks.peft.dequantize import rewrite_quantized, to_quant_opset
    from onnxblocks.peft.targets import find_targets, resolve_all_linear

    model = to_quant_opset(model)  # a quantized hub file: opset 21 for its dequantization
    working = serde.from_proto(model)
    graph = working.graph
    known = rewrite_quantized(graph)  # quantized layers: a dequantized weight, a float MatMul
    # the record names the modules, as PEFT's saved config does
    config = resolve_all_linear(graph, config, known)
    sites = find_targets(graph, config, known)
    opset = _limits.onnx_opset(model) or _limits.DEFAULT_ONNX_OPSET
    if config.lora_dropout > 0 and opset < _DROPOUT_INPUTS_SINCE:
        raise InvalidValueError(
            f"lora_dropout > 0 needs opset {_DROPOUT_INPUTS_SINCE} or later (Dropout with a "
            "training flag); "
            f"the model has opset {opset}: export it at a later opset or use lora_dropout=0"
        )
    names = graph_names(graph)
    for site in sites:
        for name in adapter_names(site.module):
            if names.is_used(name):
                raise InvalidValueError(
                    f"the model already has a value named {name!r}: LoRA cannot name the adapter "
                    f"of {site.module!r}"
                )
    rng = np.random.default_rng(seed)
    targets: dict[str, LoraTarget] = {}
    for site in sites:
        if not site.node.name:  # the record names the node: give an unnamed one a name
            site.node.name = names.fresh(site.node.op_type)
        writer = Writer(names, opset, f"{site.module}.lora")
        targets[site.module] = _add_branch(graph, writer, site, config, rng)
    info = LoraInfo(config=config, targets=targets)
    working.metadata_props[LORA_METADATA] = info.to_json()
    return serde.to_proto(working)


def _add_branch(
    graph: ir.Graph, w: Writer, site: LinearSite, config: LoraConfig, rng: np.random.Generator
) -> LoraTarget:
    from onnxblocks.ir.edit import add_initializer, splice_after

    name_a, name_b = adapter_names(site.module)
    a0, b0 = initial_adapters(config, site.in_features, site.out_features, rng)
    a = add_initializer(graph, name_a, a0)
    b = add_initializer(graph, name_b, b0)
    x = site.node.inputs[0]  # now, not when found: an earlier target's branch may have replaced it
    assert x is not None
    if config.lora_dropout > 0:
        x = w.op(
            "Dropout",
            [x, w.scalar(config.lora_dropout), w.const(np.array(True), suffix="training")],
        )
    hidden = w.op("MatMul", [x, w.op("Transpose", [a], perm=[1, 0])])
    delta = w.op("MatMul", [hidden, w.op("Transpose", [b], perm=[1, 0])])
    scaled = w.op("Mul", [delta, w.scalar(config.scaling)])
    y = site.node.outputs[0]
    out = w.op("Add", [y, scaled])
    if y.type is not None:
        out.type, out.shape = y.type, y.shape
    splice_after(y, w.nodes, out, w.names)
    return LoraTarget(
        module=site.module,
        weight=site.weight.name or "",
        weight_layout=site.layout,
        node=site.node.name or "",
        in_features=site.in_features,
        out_features=site.out_features,
        lora_A=name_a,
        lora_B=name_b,
        scale_value=config.scaling,
    )
