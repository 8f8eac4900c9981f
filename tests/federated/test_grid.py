"""The ServerApp's grid (onnxblocks.federated.grid.PromptGrid) on a scripted stand-in for Flower's.

A round's replies are returned as soon as all came; with ``straggler_timeout`` the wait ends that
many seconds after the first reply; the round timeout bounds both; no timeout waits for all, as
Flower's grids do; everything but the wait goes to the wrapped grid. The run config key
``straggler-timeout`` reaches :class:`~onnxblocks.federated.server.ServerSettings` and is checked.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from onnxblocks import OnnxBlocksError
from onnxblocks.federated import grid as grid_module
from onnxblocks.federated.grid import PromptGrid
from onnxblocks.federated.server import ServerSettings


class ScriptedGrid:
    """Pushes messages ``m0``, ``m1``...; pull ``k`` returns the replies ``script[k]`` names."""

    def __init__(self, script: list[list[str]]) -> None:
        self.script = script
        self.pulls = 0
        self.run = "the wrapped grid's run"

    def push_messages(self, messages):
        return [f"m{i}" for i, _ in enumerate(messages)]

    def pull_messages(self, message_ids):
        names = self.script[self.pulls] if self.pulls < len(self.script) else []
        self.pulls += 1
        return [SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id=n)) for n in names]


def _replied(replies) -> list[str]:
    return [r.metadata.reply_to_message_id for r in replies]


@pytest.fixture(autouse=True)
def quick_polls(monkeypatch):
    monkeypatch.setattr(grid_module, "POLL_S", 0.001)


def test_the_replies_come_back_as_soon_as_all_came():
    scripted = ScriptedGrid([[], ["m1"], ["m0", "m2"]])
    replies = PromptGrid(scripted).send_and_receive(["a", "b", "c"], timeout=60.0)
    assert sorted(_replied(replies)) == ["m0", "m1", "m2"]
    assert scripted.pulls == 3


def test_a_straggler_is_waited_for_only_the_straggler_timeout_after_the_first_reply():
    scripted = ScriptedGrid([[], ["m0"]])  # m1 never replies
    started = time.monotonic()
    replies = PromptGrid(scripted, straggler_timeout=0.05).send_and_receive(
        ["a", "b"], timeout=60.0
    )
    assert _replied(replies) == ["m0"]
    assert time.monotonic() - started < 30.0  # ended by the straggler timeout, not the round's


def test_the_round_timeout_bounds_the_wait_with_no_reply_at_all():
    scripted = ScriptedGrid([])
    replies = PromptGrid(scripted, straggler_timeout=30.0).send_and_receive(["a"], timeout=0.05)
    assert replies == [] and scripted.pulls >= 1


def test_no_timeout_waits_for_every_reply_as_flowers_grids_do():
    scripted = ScriptedGrid([[], [], [], ["m0"]])
    assert _replied(PromptGrid(scripted).send_and_receive(["a"], timeout=None)) == ["m0"]


def test_everything_but_the_wait_is_the_wrapped_grids():
    assert PromptGrid(ScriptedGrid([])).run == "the wrapped grid's run"


def test_the_run_config_sets_the_straggler_timeout_and_bad_values_are_refused():
    settings = ServerSettings.from_run_config({"artifacts": "a", "straggler-timeout": 20})
    assert settings.straggler_timeout == 20
    assert ServerSettings(artifacts="a").straggler_timeout is None
    for bad in (0, -1.0, "soon"):
        with pytest.raises(OnnxBlocksError, match="straggler-timeout"):
            ServerSettings(artifacts="a", straggler_timeout=bad)
