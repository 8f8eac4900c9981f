"""Rich display: summary tables, SVG pictures, focused views, and large graphs."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import xml.etree.ElementTree as ET

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from support.onnx_models import make_linear_model

import onnxblocks
from onnxblocks import display
from onnxblocks.display.collapse import _range_label, collapse, scope_of
from onnxblocks.display.layout import layered_layout
from onnxblocks.display.scene import build_scene
from onnxblocks.errors import UnknownNameError

SVG = "{http://www.w3.org/2000/svg}"


# ---------------------------------------------------------------- helpers
def svg_texts(svg: str) -> list[str]:
    """Every <text> of a well-formed SVG (parsing fails on malformed XML)."""
    root = ET.fromstring(svg)
    assert root.tag == SVG + "svg"
    return [t.text or "" for t in root.iter(SVG + "text")]


def svg_boxes(svg: str) -> list[tuple[str, tuple[float, float, float, float]]]:
    """(tooltip, first rect) of every box group in a picture."""
    root = ET.fromstring(svg)
    out = []
    for g in root.iter(SVG + "g"):
        title = g.find(SVG + "title")
        rect = g.find(SVG + "rect")
        if title is not None and rect is not None:
            out.append(
                (title.text or "", tuple(float(rect.get(k)) for k in ("x", "y", "width", "height")))
            )
    return out


def svg_faded_only(svg: str) -> str:
    """The picture with only its faded boxes (those drawn with reduced opacity)."""
    root = ET.fromstring(svg)
    for parent in root.iter(SVG + "g"):
        for g in list(parent):
            if (
                g.tag == SVG + "g"
                and g.find(SVG + "title") is not None
                and g.get("opacity") is None
            ):
                parent.remove(g)
    return ET.tostring(root, encoding="unicode")


def drawn_node_names(svg: str) -> set[str]:
    """Names of the op nodes in a picture (from their tooltips)."""
    names = set()
    for tip, _ in svg_boxes(svg):
        first = tip.split("\n")[0]
        m = re.match(r"^(\S+)(?: \([^)]*\))? (\S+) \[(\w+)\]$", first)
        if m:
            names.add(m.group(2))
    return names


def training_like_model() -> onnx.ModelProto:
    """A hand-made graph shaped like ORT's training graphs (names as ORT writes them).

    forward: MatMul(x, W) -> Add(b) -> y; loss: Sub(y, target) -> Mul -> ReduceMean -> loss;
    backward: nodes named ``*_Grad/*`` producing ``*_grad``; accumulation of W_grad.
    """
    f = TensorProto.FLOAT
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["xw"], name="mm"),
        helper.make_node("Add", ["xw", "b"], ["y"], name="add"),
        helper.make_node("Sub", ["y", "target"], ["d"], name="Sub_0"),
        helper.make_node("Mul", ["d", "d"], ["d2"], name="Mul_0"),
        helper.make_node("ReduceMean", ["d2"], ["loss"], name="ReduceMean_0", keepdims=0),
        helper.make_node(
            "Shape", ["d2"], ["ReduceMean_0_Grad/shape"], name="ReduceMean_0_Grad/Shape_0"
        ),
        helper.make_node(
            "Expand",
            ["loss_grad", "ReduceMean_0_Grad/shape"],
            ["d2_grad"],
            name="ReduceMean_0_Grad/Expand_1",
        ),
        helper.make_node("Mul", ["d2_grad", "d"], ["d_grad"], name="Mul_0_Grad/Mul_0"),
        helper.make_node("Identity", ["d_grad"], ["y_grad"], name="Sub_0_Grad/Identity_0"),
        helper.make_node("Identity", ["y_grad"], ["xw_grad"], name="add_Grad/Identity_0"),
        helper.make_node("Gemm", ["x", "xw_grad"], ["W_grad"], name="mm_Grad/Gemm_0", transA=1),
        helper.make_node(
            "InPlaceAccumulatorV2",
            ["W_grad.accumulation.buffer", "W_grad", "lazy_reset_grad"],
            ["W_grad.accumulation.out"],
            name="GradientAccumulator_0",
            domain="com.microsoft",
        ),
    ]
    graph = helper.make_graph(
        nodes,
        "training",
        [
            helper.make_tensor_value_info("x", f, ["N", 8]),
            helper.make_tensor_value_info("target", f, ["N", 4]),
            helper.make_tensor_value_info("W", f, [8, 4]),
            helper.make_tensor_value_info("b", f, [4]),
            helper.make_tensor_value_info("W_grad.accumulation.buffer", f, [8, 4]),
            helper.make_tensor_value_info("lazy_reset_grad", TensorProto.BOOL, [1]),
        ],
        [
            helper.make_tensor_value_info("loss", f, []),
            helper.make_tensor_value_info("W_grad.accumulation.out", TensorProto.BOOL, [1]),
        ],
        [onnx.numpy_helper.from_array(np.array(1.0, np.float32), "loss_grad")],
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )


FORWARD = {"mm", "add"}
LOSS = {"Sub_0", "Mul_0", "ReduceMean_0"}
BACKWARD = {
    "ReduceMean_0_Grad/Shape_0",
    "ReduceMean_0_Grad/Expand_1",
    "Mul_0_Grad/Mul_0",
    "Sub_0_Grad/Identity_0",
    "add_Grad/Identity_0",
    "mm_Grad/Gemm_0",
}
ACCUMULATION = {"GradientAccumulator_0"}


def random_dag(n: int, seed: int = 0, named: bool = False) -> onnx.ModelProto:
    """``n`` Add/Relu nodes, each reading values from the 20 before it."""
    rng = np.random.default_rng(seed)
    values = ["x"]
    nodes = []
    for i in range(n):
        back = lambda: values[max(0, len(values) - 1 - int(rng.integers(0, 20)))]  # noqa: E731
        if rng.integers(0, 2):
            nodes.append(helper.make_node("Add", [back(), back()], [f"v{i}"], name=f"n{i}"))
        else:
            nodes.append(helper.make_node("Relu", [back()], [f"v{i}"], name=f"n{i}"))
        values.append(f"v{i}")
    graph = helper.make_graph(
        nodes,
        "dag",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info(values[-1], TensorProto.FLOAT, ["N", 4])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def layered_model(layers: int, per_block: int) -> onnx.ModelProto:
    """A transformer-shaped chain: ``/layers.{k}/{attn,mlp}/Op_j`` with one weight per MatMul."""
    nodes, inits = [], []
    prev = "x"
    for k in range(layers):
        for block in ("attn", "mlp"):
            h = prev
            for j in range(per_block):
                name = f"/layers.{k}/{block}/{'MatMul' if j % 2 == 0 else 'Add'}_{j}"
                if j % 2 == 0:
                    w = f"layers.{k}.{block}.w{j}"
                    inits.append(onnx.numpy_helper.from_array(np.zeros((4, 4), np.float32), w))
                    nodes.append(helper.make_node("MatMul", [h, w], [name + ":0"], name=name))
                else:
                    nodes.append(helper.make_node("Add", [h, prev], [name + ":0"], name=name))
                h = name + ":0"
            prev = h
    graph = helper.make_graph(
        nodes,
        "layers",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info(prev, TensorProto.FLOAT, ["N", 4])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


# ---------------------------------------------------------------- summary
def test_summary_totals_of_linear_model():
    s = display.summarize(make_linear_model(), trainable=["W"], frozen=["b"])
    assert (s.params.count, s.params.elements, s.params.nbytes) == (2, 36, 144)
    assert (s.trainable.count, s.trainable.elements, s.trainable.nbytes) == (1, 32, 128)
    assert (s.frozen.count, s.frozen.elements, s.frozen.nbytes) == (1, 4, 16)
    assert s.unknown.count == 0
    assert [t.name for t in s.index.inputs] == ["x"] and [t.name for t in s.index.outputs] == ["y"]


def test_summary_html_rows_and_totals():
    html = display.summary_table(make_linear_model(), trainable=["W"], frozen=["b"])
    rows = re.findall(r"<tr>(.*?)</tr>", html)
    cells = [re.findall(r"<td[^>]*>(.*?)</td>", r) for r in rows]
    assert ["x", "float32", "[N, 8]", "?"] in cells
    assert ["y", "float32", "[N, 4]", "?"] in cells
    assert ["W", "float32", "[8, 4]", "32", "128", "trainable"] in cells
    assert ["b", "float32", "[4]", "4", "16", "frozen"] in cells
    assert ["total: 2", "", "", "36", "144", ""] in cells
    assert "trainable: 1 (32 elements, 128 B)" in html and "frozen: 1 (4 elements, 16 B)" in html


def test_summary_guesses_parameters_of_a_plain_model():
    html = display.summary_table(make_linear_model())
    s = display.summarize(make_linear_model())
    assert {p.name: p.trainable for p in s.index.params} == {"W": None, "b": None}
    assert "status unknown: 2" in html


def test_summary_cuts_long_tables_but_totals_cover_all():
    model = layered_model(layers=10, per_block=12)  # 120 weights of 16 floats
    html = display.summary_table(model, max_rows=10)
    assert "… 110 more" in html
    assert "total: 120" in html and f"{120 * 64:,}" in html


def test_summary_of_training_graph_finds_gradient_state():
    s = display.summarize(training_like_model())
    assert {p.name: p.trainable for p in s.index.params} == {"W": True}
    assert [t.name for t in s.index.state] == ["W_grad.accumulation.buffer", "lazy_reset_grad"]
    assert [t.name for t in s.index.constants] == ["loss_grad"]


def test_format_bytes():
    assert display.format_bytes(144) == "144 B"
    assert display.format_bytes(1536) == "1.5 KiB"
    assert display.format_bytes(3 * 1024**3) == "3.0 GiB"
    assert display.format_bytes(None) == "?"


# ---------------------------------------------------------------- parts and views
def test_parts_of_training_graph():
    index = display.GraphIndex(training_like_model(), frozen=["b"])
    assert {p.name: p.trainable for p in index.params} == {"W": True, "b": False}
    parts = {n.name: p for n, p in zip(index.nodes, index.parts, strict=True)}
    assert {n for n, p in parts.items() if p == "forward"} == FORWARD
    assert {n for n, p in parts.items() if p == "loss"} == LOSS
    assert {n for n, p in parts.items() if p == "backward"} == BACKWARD
    assert {n for n, p in parts.items() if p == "accumulation"} == ACCUMULATION
    assert index.loss == "loss"


@pytest.mark.parametrize(
    ("view", "expected"),
    [
        ("full", FORWARD | LOSS | BACKWARD | ACCUMULATION),
        ("forward", FORWARD | LOSS),
        ("loss", LOSS),
        ("backward", BACKWARD | ACCUMULATION),
    ],
)
def test_named_views_select_the_right_nodes(view, expected):
    index = display.GraphIndex(training_like_model(), frozen=["b"])
    selection = display.select(index, view)
    assert {index.nodes[i].name for i in selection.nodes} == expected
    svg = display.draw_svg(index, view)
    assert drawn_node_names(svg) == expected


def test_loss_part_without_knowing_frozen_parameters():
    # Unknown to the index, the frozen "b" looks like data: the Add after the last weight joins the loss.
    index = display.GraphIndex(training_like_model())
    assert {
        n.name for n, p in zip(index.nodes, index.parts, strict=True) if p == "loss"
    } == LOSS | {"add"}
    # The loss block's own nodes make it exact.
    index = display.GraphIndex(training_like_model(), loss_nodes=LOSS)
    assert {n.name for n, p in zip(index.nodes, index.parts, strict=True) if p == "loss"} == LOSS


def test_nodes_view_with_context():
    index = display.GraphIndex(training_like_model())
    sel = display.select(index, nodes=["Sub_0", "Mul_0"], context=1)
    assert {index.nodes[i].name for i in sel.nodes} == {"Sub_0", "Mul_0"}
    # context stays in the forward family: the gradient nodes reading d / d2 are not added
    assert {index.nodes[i].name for i in sel.context} == {"add", "ReduceMean_0"}
    svg = display.draw_svg(index, nodes=["Sub_0", "Mul_0"], context=1)
    assert drawn_node_names(svg) == {"Sub_0", "Mul_0", "add", "ReduceMean_0"}
    faded = svg_faded_only(svg)
    assert drawn_node_names(faded) == {"add", "ReduceMean_0"}
    # values feeding only faded nodes are faded too; the loss target is not
    tips = [tip for tip, _ in svg_boxes(faded)]
    assert "value xw: type unknown" in tips and "input b: float32[4], 16 bytes" in tips
    assert "target" not in " ".join(tip for tip, _ in svg_boxes(faded))


def test_neighbourhood_of_parameter_and_node():
    index = display.GraphIndex(training_like_model())
    assert {index.nodes[i].name for i in display.select(index, around="W", depth=1).nodes} == {"mm"}
    assert {index.nodes[i].name for i in display.select(index, around="W", depth=2).nodes} == {
        "mm",
        "add",
    }
    assert {index.nodes[i].name for i in display.select(index, around="Mul_0", depth=1).nodes} == {
        "Sub_0",
        "Mul_0",
        "ReduceMean_0",
        "ReduceMean_0_Grad/Shape_0",
    }
    svg = display.draw_svg(index, around="W", depth=1)
    assert "W" in svg_texts(svg)
    w_box = [r for tip, r in svg_boxes(svg) if tip.startswith("param W")]
    assert w_box, "the parameter is drawn"


def test_unknown_names_and_views_are_clear_errors():
    index = display.GraphIndex(training_like_model())
    with pytest.raises(UnknownNameError, match="Did you mean 'Mul_0'"):
        display.select(index, nodes=["Mul_O"])
    with pytest.raises(UnknownNameError, match="neither a node nor a value"):
        display.select(index, around="nothing_like_it")
    with pytest.raises(ValueError, match="Unknown view 'backwards'.*Did you mean 'backward'"):
        display.select(index, "backwards")


def test_empty_view_says_what_the_graph_has():
    svg = display.draw_svg(make_linear_model(), "backward")
    texts = " ".join(svg_texts(svg))
    assert "no nodes" in texts and "forward (2)" in texts


# ---------------------------------------------------------------- pictures
def test_svg_is_well_formed_and_labels_nodes():
    svg = display.draw_svg(make_linear_model())
    texts = svg_texts(svg)
    for label in ("MatMul", "Add", "x", "W", "b", "y", "float32[8, 4]"):
        assert label in texts
    root = ET.fromstring(svg)
    width, height = float(root.get("width")), float(root.get("height"))
    for _, (x, y, w, h) in svg_boxes(svg):
        assert 0 <= x and x + w <= width and 0 <= y and y + h + 22 <= height


def test_svg_escapes_names():
    model = make_linear_model()
    model.graph.node[0].name = 'a<b>&"c"'
    svg = display.draw_svg(model)
    assert 'a<b>&"c"' in svg_texts(svg)


def test_edges_connect_producers_to_consumers():
    svg = display.draw_svg(make_linear_model(), edges="straight")
    root = ET.fromstring(svg)
    paths = [p.get("d") for p in root.iter(SVG + "path") if p.get("marker-end")]
    # x->MatMul, W->MatMul, MatMul->Add, b->Add, Add->y
    assert len(paths) == 5
    with pytest.raises(ValueError, match="edges must be"):
        display.draw_svg(make_linear_model(), edges="wavy")


def test_layout_keeps_boxes_apart():
    model = random_dag(150, seed=3)
    svg = display.draw_svg(model, max_nodes=300)
    boxes = [r for _, r in svg_boxes(svg)]
    assert len(boxes) == 150 + 2
    for k, (x1, y1, w1, h1) in enumerate(boxes):
        for x2, y2, w2, h2 in boxes[k + 1 :]:
            overlap = x1 < x2 + w2 and x2 < x1 + w1 and y1 < y2 + h2 and y2 < y1 + h1
            assert not overlap


def test_layout_breaks_cycles_and_ignores_unknown_edges():
    lay = layered_layout(
        ["a", "b", "c"],
        [(40, 20)] * 3,
        [("a", "b"), ("b", "c"), ("c", "a"), ("a", "zz"), ("a", "a")],
    )
    ys = {k: v[1] for k, v in lay.boxes.items()}
    assert ys["a"] < ys["b"] < ys["c"]
    assert len(lay.edges) == 3


def test_does_not_mutate_the_model():
    model = training_like_model()
    before = model.SerializeToString()
    display.show(model, view="backward")
    display.summary_table(model)
    assert model.SerializeToString() == before


# ---------------------------------------------------------------- large graphs
def test_10k_node_graph_renders_a_bounded_summary():
    model = random_dag(10_000)
    outcome: list = []

    def render() -> None:
        try:
            outcome.append(display.show(model))
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(target=render, daemon=True)
    worker.start()
    worker.join(600)  # an event wait: a hang fails here, a slow or busy machine does not
    assert outcome, "display.show of a 10k-node graph did not return within 600 s (a hang)"
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    shown = outcome[0]
    boxes = svg_boxes(shown.svg)
    assert len(boxes) <= display.MAX_NODES
    caption = svg_texts(shown.svg)[0]
    assert "10,000 of 10,000 nodes" in caption and "truncated" in caption
    assert any(t.endswith("more nodes") for t in svg_texts(shown.svg))
    assert "10,000 nodes" in shown.html


def test_repeated_layers_collapse_into_one_box_with_a_count():
    model = layered_model(layers=100, per_block=50)  # 10,000 nodes
    svg = display.draw_svg(model)
    texts = svg_texts(svg)
    assert "layers.[0-99]/attn \u00d7100" in texts and "layers.[0-99]/mlp \u00d7100" in texts
    assert len(svg_boxes(svg)) == 4  # x, attn group, mlp group, output


def test_scope_grouping_prefers_the_deepest_scope_that_fits():
    model = layered_model(layers=4, per_block=100)  # 800 nodes: 8 scopes
    model.graph.node[0].op_type = "Gemm"  # layers.0/attn differs from its siblings
    index = display.GraphIndex(model)
    nodes = list(range(len(index.nodes)))
    groups, how = collapse(index, nodes, cap=300)
    assert how == "grouped by name scope (depth 2)"
    assert [g.label for g in groups][:3] == ["layers.0/attn", "layers.0/mlp", "layers.1/attn"]
    assert sum(len(g.members) for g in groups) == 800
    # fewer boxes wanted: repeats with the same ops merge (layers.0/attn stays apart)
    groups, how = collapse(index, nodes, cap=300, target=3)
    assert how == "grouped by name scope (depth 2), repeats merged"
    assert sorted((g.label, g.repeat) for g in groups) == [
        ("layers.0/attn", 1),
        ("layers.[0-3]/mlp", 4),
        ("layers.[1-3]/attn", 3),
    ]
    # fewer still: the shallower scope, merged
    groups, how = collapse(index, nodes, cap=300, target=2)
    assert how == "grouped by name scope (depth 1), repeats merged"
    assert sorted((g.label, g.repeat) for g in groups) == [("layers.0", 1), ("layers.[1-3]", 3)]


def test_unscoped_feeders_join_their_consumer_and_unscoped_ops_gather():
    model = layered_model(layers=30, per_block=10)  # 600 nodes
    extra = [helper.make_node("Identity", ["layers.3.attn.w0"], ["w0_copy"], name="Identity_7")]
    model.graph.node[30].input[1] = "w0_copy"  # /layers.1/mlp/MatMul_0 reads an unscoped Identity
    model.graph.node.insert(0, extra[0])
    for k in range(3):  # unscoped nodes with inputs from the graph: gathered by op type
        model.graph.node.append(
            helper.make_node("Relu", [model.graph.node[-1].output[0]], [f"r{k}"], name=f"Relu_{k}")
        )
    index = display.GraphIndex(model)
    groups, _ = collapse(index, list(range(len(index.nodes))), cap=40)
    by_label = {g.label: g for g in groups}
    identity = index.by_name["Identity_7"]
    assert any(identity in g.members and g.label.startswith("layers.") for g in groups)
    assert "Relu" in by_label and by_label["Relu"].repeat == 3


def test_focused_view_of_a_large_graph_stays_small():
    model = layered_model(layers=50, per_block=100)
    svg = display.draw_svg(model, around="layers.7.mlp.w4", depth=2)
    assert drawn_node_names(svg) == {
        "/layers.7/mlp/Add_3",
        "/layers.7/mlp/MatMul_4",
        "/layers.7/mlp/Add_5",
    }


def test_scope_helpers():
    assert scope_of("/layers.3/attn/MatMul_1") == ("layers.3", "attn")
    assert scope_of("MatMul_1") == ()
    assert (
        _range_label(["layers.0/attn", "layers.1/attn", "layers.11/attn"]) == "layers.[0-11]/attn"
    )


# ---------------------------------------------------------------- rich display
def test_show_block_lists_its_nodes():
    model = make_linear_model()
    with onnxblocks.base(model) as acc:
        block = onnxblocks.blocks.Sigmoid()
        out = block("y")
    html = display.repr_html(block)
    assert "<b>Sigmoid</b> added 1 node(s)" in html
    node = block.nodes[0]
    assert f">{node}<" in html and f"{out}: float32[N, 4]" in html
    assert drawn_node_names(display.show(block).svg) == {
        node,
        "#1",
    }  # the block's node + Add as context
    assert "<svg" in display.repr_html(acc)


def test_show_unbuilt_block_and_unknown_objects():
    assert "has not been built yet" in display.repr_html(onnxblocks.blocks.Sigmoid())
    with pytest.raises(TypeError, match="cannot display a int"):
        display.show(3)
    assert (
        "could not display this int: InvalidTypeError: onnxblocks.display.show() cannot display"
        in display.repr_html(3)
    )
    with pytest.raises(TypeError, match="unknown option"):
        display.show(make_linear_model(), colour="red")


def test_show_model_file_and_save(tmp_path):
    path = tmp_path / "linear.onnx"
    onnx.save(make_linear_model(), path)
    shown = display.show(path)
    assert "linear.onnx" in shown.html and "<svg" in shown.html
    shown.save(tmp_path / "pic.svg")
    shown.save(tmp_path / "page.html")
    ET.parse(tmp_path / "pic.svg")
    assert "<svg" in (tmp_path / "page.html").read_text()
    with pytest.raises(ValueError, match=r"\.svg or \.html"):
        shown.save(tmp_path / "pic.png")
    assert shown._repr_svg_() == shown.svg


def test_show_training_directory_without_checkpoint(tmp_path):
    onnx.save(training_like_model(), tmp_path / "training_model.onnx")
    shown = display.show(tmp_path, view="backward")
    assert "training_model.onnx" in shown.html and "Gradients" in shown.html
    assert "W_grad.accumulation.buffer" in shown.html
    assert drawn_node_names(shown.svg) == BACKWARD | ACCUMULATION
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no training_model.onnx"):
        display.show(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        display.show(tmp_path / "missing.onnx")


def test_dot_engine_falls_back_with_a_warning(monkeypatch):
    import onnxblocks.display.dot as dot

    monkeypatch.setattr(dot.shutil, "which", lambda name: None)
    with pytest.warns(UserWarning, match="graphviz 'dot' is not on PATH"):
        svg = display.draw_svg(make_linear_model(), engine="dot")
    assert "MatMul" in svg_texts(svg)
    index = display.GraphIndex(make_linear_model())
    source = dot.scene_to_dot(build_scene(index, display.select(index)))
    assert source.startswith("digraph G {") and '"v:W" -> "n:0";' in source


def test_import_onnxblocks_does_not_import_display():
    code = "import sys, onnxblocks; print('onnxblocks.display' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ---------------------------------------------------------------- real training graphs
@pytest.fixture(scope="module")
def linear_artifacts(tmp_path_factory):
    """Artifacts of the linear model with an MSE loss: W trainable, b frozen (built once)."""
    from onnxblocks.artifacts import LossType, OptimType, generate_artifacts

    return generate_artifacts(
        make_linear_model(),
        requires_grad=["W"],
        frozen_params=["b"],
        loss=LossType.MSELoss,
        optimizer=OptimType.AdamW,
        artifact_directory=tmp_path_factory.mktemp("artifacts"),
    )


def _param_rows(html: str) -> dict[str, str]:
    rows = [re.findall(r"<td[^>]*>(.*?)</td>", r) for r in re.findall(r"<tr>(.*?)</tr>", html)]
    return {r[0]: r[5] for r in rows if len(r) == 6 and r[0] in ("W", "b")}


def test_show_artifacts_and_their_directory(linear_artifacts):
    from_object = display.show(linear_artifacts)
    from_directory = display.show(
        linear_artifacts.directory
    )  # frozen/trainable read from the checkpoint
    for shown in (from_object, from_directory):
        assert _param_rows(shown.html) == {"W": "trainable", "b": "frozen"}
        for name in (
            "training_model.onnx",
            "eval_model.onnx",
            "optimizer_model.onnx",
            "checkpoint",
        ):
            assert name in shown.html
        assert "W_grad.accumulation.buffer" in shown.html and "lazy_reset_grad" in shown.html
        assert "eval model" in shown.html and "optimizer model" in shown.html
    size = linear_artifacts.training_model.stat().st_size
    assert f">{size:,}<" in from_object.html
    assert linear_artifacts._repr_html_() == from_object.html
    optimizer = display.show(linear_artifacts, model="optimizer")
    assert drawn_node_names(optimizer.svg) and "AdamWOptimizer" in svg_texts(optimizer.svg)
    with pytest.raises(ValueError, match="model='nope' is not available"):
        display.show(linear_artifacts, model="nope")


def test_real_training_graph_parts(linear_artifacts):
    training = onnx.load(linear_artifacts.training_model)
    index = display.GraphIndex(training, trainable=["W"], frozen=["b"])
    for node, part in zip(index.nodes, index.parts, strict=True):
        if part == "backward":
            assert "_Grad/" in node.name or any("_grad" in v for v in node.outputs + node.inputs)
        elif part in ("forward", "loss"):
            assert "_Grad/" not in node.name and not any("_grad" in v for v in node.outputs)
    assert {n.op_type for n, p in zip(index.nodes, index.parts, strict=True) if p == "forward"} == {
        "MatMul",
        "Add",
    }
    assert [
        n.op_type for n, p in zip(index.nodes, index.parts, strict=True) if p == "accumulation"
    ] == ["InPlaceAccumulatorV2"]
    assert index.loss == linear_artifacts.loss_name


def test_training_block_display_uses_its_partition_and_loss_nodes():
    from onnxblocks.blocks.training import TrainingBlock

    class MSETraining(TrainingBlock):
        def __init__(self):
            super().__init__()
            self.loss = onnxblocks.losses.MSELoss()

        def build(self, output):
            return self.loss(output)

    block = MSETraining()
    assert "has not been built yet" in display.repr_html(block)
    block.requires_grad("W")
    block.requires_grad("b", False)
    with onnxblocks.base(make_linear_model()) as acc:
        block("y")
        during = display.repr_html(acc)
    html = display.repr_html(block)
    assert _param_rows(html) == {"W": "trainable", "b": "frozen"}
    assert "1 trainable, 1 frozen" in html
    loss_svg = display.draw_svg(
        display.GraphIndex(block.graphs.training, loss_nodes=block.nodes), "loss"
    )
    assert drawn_node_names(loss_svg) == set(block.loss.nodes)
    assert drawn_node_names(display.show(block, view="loss").svg) == set(block.loss.nodes)
    assert "Model being built" in during and "<svg" in during
