"""Peak memory of one einsum's forward and backward, torch eager or ``OrtModule``, measured in this process.

``python einsum_memory.py {torch|ortmodule} EQUATION [NPZ]`` prints one JSON line: ``peak_bytes`` (the rise of the
resident set's high-water mark, ``VmHWM``, over the resident set before the measured call), ``io_bytes`` (the
operands, the output, its incoming gradient and the gradients computed) and ``exports`` (OrtModule's, which must
stay 1: the measured call reuses the graph the warm-up built). With ``NPZ`` the full-size call's operands, bias,
incoming gradient, output and gradients are saved there, for the caller to check against torch.

Both ways run the module of ORTModule's ``test_gradient_correctness_einsum`` (``einsum(eq, left + bias,
right)``) once at a small size first (imports, export, sessions, thread pools: all outside the measure; the
export keeps every dim symbolic), then reset the high-water mark (``/proc/self/clear_refs``) and run forward and
backward once at the full size (s=1024, e=64, c=32, m=768). Before that call the address space is capped at what
is mapped plus 3 GiB, so a graph that regresses to materialising the whole product fails with an allocation error
here instead of exhausting the machine.
"""

from __future__ import annotations

import json
import math
import resource
import sys

import numpy as np
import torch

FULL = {"s": 1024, "e": 64, "c": 32, "m": 768}
SMALL = {"s": 5, "e": 3, "c": 32, "m": 6}  # c: the bias's size
HEADROOM = 3 << 30


class EinsumWithBias(torch.nn.Module):
    """ORTModule's einsum test module: a bias on the left operand's last dim, then the einsum."""

    def __init__(self, equation: str, bias_size: int) -> None:
        super().__init__()
        self.equation = equation
        self.bias = torch.nn.Parameter(torch.randn(bias_size))

    def forward(self, left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
        return torch.einsum(self.equation, left + self.bias, right)


def operand_shapes(equation: str, sizes: dict[str, int]) -> tuple[list[int], list[int], list[int]]:
    """The left, right and output shapes of a two-operand explicit equation."""
    inputs, output = equation.split("->")
    left, right = inputs.split(",")
    return [sizes[c] for c in left], [sizes[c] for c in right], [sizes[c] for c in output]


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def _step(model: torch.nn.Module, equation: str, sizes: dict[str, int]) -> dict[str, torch.Tensor]:
    left_shape, right_shape, out_shape = operand_shapes(equation, sizes)
    left = torch.randn(left_shape, requires_grad=True)
    right = torch.randn(right_shape, requires_grad=True)
    grad = torch.randn(out_shape)
    out = model(left, right)
    out.backward(grad)
    assert left.grad is not None and right.grad is not None
    return {
        "left": left,
        "right": right,
        "grad": grad,
        "out": out,
        "left_grad": left.grad,
        "right_grad": right.grad,
    }


def main(kind: str, equation: str, npz: str | None = None) -> None:
    torch.manual_seed(0)
    left_shape, right_shape, out_shape = operand_shapes(equation, FULL)
    model: torch.nn.Module = EinsumWithBias(equation, left_shape[-1])
    if kind == "ortmodule":
        from onnxblocks.torch import OrtModule

        model = OrtModule(model, dynamic="all")
    elif kind != "torch":
        raise SystemExit(f"kind must be torch or ortmodule, not {kind!r}")
    _step(model, equation, SMALL)
    model.zero_grad(set_to_none=True)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the high-water mark starts again from the resident set
    mapped = _status_bytes("VmSize")
    resource.setrlimit(
        resource.RLIMIT_AS, (mapped + HEADROOM, resource.getrlimit(resource.RLIMIT_AS)[1])
    )
    before = _status_bytes("VmRSS")
    tensors = _step(model, equation, FULL)
    peak = _status_bytes("VmHWM") - before
    # operands, bias, output, incoming gradient, and a gradient of each operand and of the bias
    elements = 2 * (
        math.prod(left_shape) + math.prod(right_shape) + left_shape[-1] + math.prod(out_shape)
    )
    exports = model.exports if kind == "ortmodule" else 0
    print(json.dumps({"peak_bytes": peak, "io_bytes": 4 * elements, "exports": exports}))
    if npz is not None:
        bias = next(p for n, p in model.named_parameters() if n.endswith("bias"))
        arrays = {k: v.detach().numpy() for k, v in tensors.items()}
        np.savez(npz, bias=bias.detach().numpy(), bias_grad=bias.grad.numpy(), **arrays)


if __name__ == "__main__":
    main(*sys.argv[1:])
