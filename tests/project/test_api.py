"""The public API: each module's ``__all__`` is pinned here and written down in docs/api.md.

A change to a list below is a change to the public API: update docs/api.md with it.
"""

from __future__ import annotations

import importlib
import re
import warnings
from pathlib import Path

import pytest

import onnxblocks

DOCS = Path(__file__).resolve().parents[2] / "docs" / "api.md"

ERRORS = [
    "CheckpointFormatError",
    "CheckpointMismatchError",
    "CliError",
    "DataFileError",
    "FileAccessError",
    "FileConflictError",
    "FileMissingError",
    "GradientError",
    "InvalidIndexError",
    "InvalidTypeError",
    "InvalidValueError",
    "IsAFolderError",
    "LockTimeoutError",
    "MissingDependencyError",
    "NoActiveModelError",
    "NotAFolderError",
    "NotBuiltError",
    "NpmError",
    "OnnxBlocksError",
    "OrtRunError",
    "PortabilityError",
    "StateError",
    "TorchExportError",
    "TrainingBuildRequiredError",
    "UnknownNameError",
    "ValueOperandError",
]

PUBLIC: dict[str, list[str]] = {
    "onnxblocks": sorted(
        [
            "OnnxBlocksError",
            "Artifacts",
            "Block",
            "ForwardBlock",
            "LossType",
            "ModelAccessor",
            "OptimType",
            "ScriptBlock",
            "TrainingBlock",
            "TrainingSession",
            "Value",
            "__version__",
            "base",
            "blocks",
            "custom_op_library",
            "empty_base",
            "errors",
            "fit",
            "from_onnxscript",
            "generate_artifacts",
            "load_checkpoint",
            "load_checkpoint_to_model",
            "losses",
            "optim",
            "save_checkpoint",
            "save_model",
            "show",
            "value",
        ]
    ),
    "onnxblocks.errors": ERRORS,
    "onnxblocks.blocks": [
        "Abs",
        "Add",
        "Block",
        "Cast",
        "Clip",
        "Constant",
        "Div",
        "Exp",
        "ForwardBlock",
        "InputLike",
        "LabelEncoder",
        "Linear",
        "Log",
        "ModelAccessor",
        "Mul",
        "Neg",
        "Op",
        "PassThrough",
        "Pow",
        "ReduceAllL2",
        "ReduceMean",
        "ReduceSum",
        "ScriptBlock",
        "SequenceConstruct",
        "Sigmoid",
        "Sqrt",
        "Sub",
        "TrainingBlock",
        "Value",
        "active",
        "base",
        "current",
        "custom_op_libraries",
        "custom_op_library",
        "empty_base",
        "from_onnxscript",
        "value",
    ],
    "onnxblocks.losses": [
        "BCEWithLogitsLoss",
        "CrossEntropyLoss",
        "HuberLoss",
        "KLDivLoss",
        "L1Loss",
        "Loss",
        "MSELoss",
        "NLLLoss",
        "SmoothL1Loss",
    ],
    "onnxblocks.optim": [
        "Adagrad",
        "Adam",
        "AdamW",
        "ClipGradNorm",
        "Lamb",
        "NormBiasParams",
        "Optimizer",
        "RMSprop",
        "SGD",
        "StandardOptimizer",
        "no_decay_norm_bias",
    ],
    "onnxblocks.artifacts": ["Artifacts", "LossType", "OptimType", "generate_artifacts"],
    "onnxblocks.hub": [
        "HubRecord",
        "ShiftedCrossEntropyLoss",
        "TASKS",
        "TextBatches",
        "empty_past",
        "from_hub",
        "has_record",
        "load_tokenizer",
        "read_record",
        "write_record",
    ],
    "onnxblocks.peft": [
        "LoraConfig",
        "LoraInfo",
        "LoraTarget",
        "apply_lora",
        "lora_info",
        "merge_lora",
    ],
    "onnxblocks.gradient": [
        "LAZY_RESET_GRAD",
        "ParameterPartition",
        "SplitVjp",
        "TrainingGraphs",
        "VjpGraph",
        "accumulated_name",
        "add_gradient_accumulation",
        "buffer_name",
        "build_training_graphs",
        "build_vjp_graph",
        "check_training_model",
        "gradient_name",
        "normalize",
        "partition_parameters",
        "split_vjp_graph",
    ],
    "onnxblocks.portable": [
        "LOWERINGS",
        "PortableModels",
        "check_portable",
        "is_portable_op",
        "make_portable",
        "non_portable_ops",
    ],
    "onnxblocks.checkpoint": [
        "Checkpoint",
        "CheckpointFormatError",
        "CheckpointMismatchError",
        "OptimizerGroup",
        "OptimizerState",
        "check_checkpoint",
        "external_data_path",
        "is_checkpoint",
        "load_checkpoint",
        "load_checkpoint_to_model",
        "read_parameter_names",
        "save_checkpoint",
    ],
    "onnxblocks.io": ["load_model", "save_model"],
    "onnxblocks.runtime": [
        "Accuracy",
        "ArrayBatches",
        "ArtifactFiles",
        "Callback",
        "CosineAnnealingLR",
        "EarlyStopping",
        "ExponentialLR",
        "FitRun",
        "History",
        "InputSpec",
        "LambdaLR",
        "LinearLR",
        "MultiStepLR",
        "OneCycleLR",
        "ProgressBar",
        "ReduceLROnPlateau",
        "SaveCheckpoint",
        "Schedule",
        "SequentialLR",
        "StepLR",
        "TrainingSession",
        "WeightEMA",
        "evaluate",
        "fit",
        "load_npz",
        "make_schedule",
        "plot_history",
        "resume",
        "save_line_plot",
        "schedule_from_dict",
    ],
    "onnxblocks.runtime.schedules": [
        "CosineAnnealingLR",
        "ExponentialLR",
        "LambdaLR",
        "LinearLR",
        "MultiStepLR",
        "OneCycleLR",
        "ReduceLROnPlateau",
        "Schedule",
        "SequentialLR",
        "StepLR",
        "make_schedule",
        "schedule_from_dict",
    ],
    "onnxblocks.display": [
        "Display",
        "GraphIndex",
        "MAX_NODES",
        "ModelSummary",
        "NodeInfo",
        "Selection",
        "TensorInfo",
        "Totals",
        "VIEWS",
        "draw_svg",
        "format_bytes",
        "render",
        "render_artifacts_dir",
        "repr_html",
        "select",
        "show",
        "summarize",
        "summary_table",
    ],
    "onnxblocks.web": [
        "NpmError",
        "SpiralPlan",
        "WebState",
        "build_site",
        "install_js_dependencies",
        "load_state",
        "read_safetensors",
        "read_state",
        "serve",
        "serving",
        "spiral_artifacts",
        "spiral_plan",
        "state_to_checkpoint",
        "write_flat_step",
        "write_inference_template",
        "write_safetensors",
        "write_state",
    ],
    "onnxblocks.federated": [
        "ClientUpdate",
        "FederatedHistory",
        "LocalConfig",
        "ServerSettings",
        "ValidatingStrategy",
        "build_strategy",
        "check_arrays",
        "evaluate_client",
        "make_client_app",
        "make_server_app",
        "run_server",
        "simulate",
        "train_client",
    ],
    "onnxblocks.cli": [
        "CliError",
        "EXIT_FAILURE",
        "EXIT_INPUT",
        "EXIT_INTERRUPTED",
        "EXIT_OK",
        "EXIT_USAGE",
        "main",
    ],
    "onnxblocks.compat": [
        "AdamWOptimizer",
        "ReferenceAdamW",
        "ReferenceSGD",
        "SGDOptimizer",
        "artifacts",
        "onnxblock",
    ],
    "onnxblocks.compat.legacy": ["GradientGraphBuilder", "TrainingParameters", "TrainingSession"],
    "onnxblocks.torch": [
        "ExportError",
        "OnnxFunction",
        "OnnxModule",
        "OrtModule",
        "OrtRunError",
        "onnx_function",
    ],
    "onnxblocks.torch.distributed": ["DataParallel"],
}


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_public_names_are_pinned(module):
    names = importlib.import_module(module).__all__
    assert sorted(names) == sorted(PUBLIC[module]), (
        f"{module}.__all__ changed: update tests and docs/api.md"
    )
    mod = importlib.import_module(module)
    for name in names:
        assert hasattr(mod, name), f"{module}.{name} is listed in __all__ but missing"


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_docs_list_every_public_name(module):
    text = DOCS.read_text()
    section = text.split(f"## `{module}`\n", 1)
    assert len(section) == 2, f"docs/api.md has no section for {module}"
    body = section[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| `([^`]+)` \|", body, re.M))
    expected = set(PUBLIC[module])
    assert listed == expected, (
        f"docs/api.md's {module} section: missing {expected - listed}, extra {listed - expected}"
    )


def test_dir_of_the_package_is_its_public_api():
    shown = set(dir(onnxblocks))
    lazy = {
        "artifacts",
        "checkpoint",
        "compat",
        "datasets",
        "demo",
        "display",
        "gradient",
        "io",
        "runtime",
    }
    assert shown == set(onnxblocks.__all__) | lazy
    assert not shown & {"Any", "annotations", "importlib", "_html"}


def test_the_top_level_stays_small():
    assert len(onnxblocks.__all__) <= 30, "the top level is for the names most programs use"


@pytest.mark.parametrize("name", sorted(set(ERRORS) - {"OnnxBlocksError"}))
def test_errors_at_the_top_level_warn_for_one_release(name):
    import onnxblocks.errors

    with pytest.warns(DeprecationWarning, match=f"onnxblocks.errors.{name}"):
        moved = getattr(onnxblocks, name)
    assert moved is getattr(onnxblocks.errors, name)
    assert name not in dir(onnxblocks)


def test_moved_names_warn_for_one_release():
    from onnxblocks import compat, optim

    for name in ("ReferenceAdamW", "ReferenceSGD", "AdamWOptimizer", "SGDOptimizer"):
        with pytest.warns(DeprecationWarning, match=f"onnxblocks.compat.{name}"):
            moved = getattr(optim, name)
        assert moved is getattr(compat, name)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert (
            optim.AdamW is importlib.import_module("onnxblocks.optim.adamw").AdamW
        )  # the algorithms do not warn
    with pytest.raises(AttributeError, match="no attribute 'Lion'"):
        optim.Lion  # noqa: B018


@pytest.mark.parametrize(
    "module",
    ["onnxblocks.runtime", "onnxblocks.runtime.schedules", "onnxblocks.runtime.schedulers"],
)
@pytest.mark.parametrize(
    ("name", "replacement"),
    [
        ("ConstantSchedule", "ExponentialLR"),
        ("LinearSchedule", "LinearLR"),
        ("CosineSchedule", "CosineAnnealingLR"),
        ("StepSchedule", "StepLR"),
    ],
)
def test_the_warmup_schedules_warn_for_one_release(module, name, replacement):
    from onnxblocks.runtime.schedules import warmup

    with pytest.warns(
        DeprecationWarning,
        match=replacement
        if module != "onnxblocks.runtime.schedulers"
        else "onnxblocks.runtime.schedules",
    ):
        alias = getattr(importlib.import_module(module), name)
    assert alias is getattr(warmup, name)
    assert name not in importlib.import_module(module).__dict__.get("__all__", [])


def test_the_old_schedule_modules_resolve_to_the_new_one():
    from onnxblocks.runtime import schedules

    with pytest.warns(DeprecationWarning, match="onnxblocks.runtime.schedules"):
        step = importlib.import_module("onnxblocks.runtime.lr_schedulers").StepLR
    assert step is schedules.StepLR
    with pytest.warns(DeprecationWarning, match="onnxblocks.runtime.schedules"):
        from_dict = importlib.import_module("onnxblocks.runtime.schedulers").schedule_from_dict
    assert from_dict is schedules.schedule_from_dict
    assert issubclass(
        importlib.import_module("onnxblocks.runtime.schedules.warmup").StepSchedule,
        schedules.StepLR,
    )


def test_the_gradient_function_no_longer_shadows_its_module():
    import onnxblocks.gradient as gradient

    assert callable(gradient.normalize)
    module = importlib.import_module("onnxblocks.gradient.rewrites")
    assert module.normalize is gradient.normalize
