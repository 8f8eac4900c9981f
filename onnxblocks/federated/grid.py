"""The ServerApp's grid: replies collected as they arrive, and stragglers given a bounded wait.

Flower's grids wait for a round's replies by pulling them every 3 s until all came or the round
timeout passed, so a round that is done waits up to 3 s more, and a round with a node that hangs
waits the whole round timeout. :class:`PromptGrid` wraps the grid Flower hands the ServerApp and
replaces only that wait: it pulls every :data:`POLL_S` seconds, and with ``straggler_timeout`` set
it stops waiting that many seconds after the first reply of the round came (never later than the
round timeout; no round timeout waits for every reply, as Flower's does). Everything else goes
to the wrapped grid.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

#: Seconds between two pulls of the replies of a round.
POLL_S = 0.25


class PromptGrid:
    """A Flower ``Grid`` whose :meth:`send_and_receive` returns as soon as the round is settled.

    Args:
        grid: The grid Flower gave the ServerApp.
        straggler_timeout: Seconds the round still waits for the missing replies once its first
            reply came; None waits until every reply came or the round timeout passed.
    """

    def __init__(self, grid: Any, straggler_timeout: float | None = None) -> None:
        self._grid = grid
        self.straggler_timeout = straggler_timeout

    def __getattr__(self, name: str) -> Any:
        return getattr(self._grid, name)

    def send_and_receive(self, messages: Iterable[Any], *, timeout: float | None = None) -> list:
        """Push ``messages``, then pull their replies until all came, or a timeout passed."""
        waiting = set(self._grid.push_messages(messages))
        now = time.monotonic()
        deadline = None if timeout is None else now + timeout
        replies: list = []
        while waiting:
            pulled = list(self._grid.pull_messages(waiting))
            if pulled and not replies and self.straggler_timeout is not None:
                late = time.monotonic() + self.straggler_timeout
                deadline = late if deadline is None else min(deadline, late)
            replies += pulled
            waiting.difference_update(m.metadata.reply_to_message_id for m in pulled)
            if not waiting or (deadline is not None and time.monotonic() >= deadline):
                break
            time.sleep(POLL_S)
        return replies
