"""A screen of text that redraws in place on a terminal, for ``flexiqctl watch`` and ``make demo``.

On a TTY each new screen overwrites the last: the cursor goes home, every line
is written and cleared to its end, and whatever the previous screen had below is
cleared (no full-screen clear per frame, so nothing flickers).  The cursor is
hidden while the view is live and shown again by ``close`` -- also after Ctrl-C,
when the view is used as a context manager.  Anywhere else (a pipe, a file, a
log) each screen is printed after the previous one, followed by a blank line.
"""

from __future__ import annotations

import os
import shutil
from typing import Callable, TextIO

HOME = "\x1b[H"
CLEAR_SCREEN = "\x1b[2J"
CLEAR_TO_LINE_END = "\x1b[K"
CLEAR_TO_SCREEN_END = "\x1b[J"
HIDE_CURSOR = "\x1b[?25l"
SHOW_CURSOR = "\x1b[?25h"


def frame(screen: str, columns: int, rows: int) -> str:
    """The escape sequences and text that redraw ``screen`` over the previous one.

    Lines are cut to ``columns`` and the screen to ``rows`` lines: a wrapped or
    overlong screen would scroll the terminal, and the next frame would be drawn
    below the top.  No newline after the last line, for the same reason.
    """
    lines = [line[:max(1, columns)] for line in screen.rstrip("\n").split("\n")][:max(1, rows)]
    return HOME + (CLEAR_TO_LINE_END + "\n").join(lines) + CLEAR_TO_LINE_END + CLEAR_TO_SCREEN_END


class LiveView:
    """Shows successive screens on ``stream``.  Not thread-safe: one loop drives it.

    ``tty`` defaults to ``stream.isatty()``; ``size`` gives the terminal's
    (columns, rows) at each frame, so a resized window is followed.
    """

    def __init__(self, stream: TextIO, *, tty: bool | None = None,
                 size: Callable[[], os.terminal_size] = shutil.get_terminal_size) -> None:
        self.stream = stream
        self.tty = stream.isatty() if tty is None else tty
        self.size = size
        self._started = False

    def show(self, screen: str) -> None:
        if not self.tty:
            self.stream.write(screen.rstrip("\n") + "\n\n")
        else:
            if not self._started:
                # Once: a clean screen to draw on; later frames overwrite only what changes.
                self.stream.write(HIDE_CURSOR + HOME + CLEAR_SCREEN)
                self._started = True
            columns, rows = self.size()
            self.stream.write(frame(screen, columns, rows))
        self.stream.flush()

    def close(self) -> None:
        """Give the terminal back: the cursor shown, below the last screen.  Idempotent."""
        if self.tty and self._started:
            self._started = False
            self.stream.write(SHOW_CURSOR + "\n")
            self.stream.flush()

    def __enter__(self) -> LiveView:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
