"""flexiqd.cli.live and `flexiqctl watch`: screens redrawn in place on a TTY, printed one after another elsewhere."""

from __future__ import annotations

import io
import os
import signal

import pytest

from flexiqd.cli import flexiqctl
from flexiqd.cli.live import (CLEAR_SCREEN, CLEAR_TO_LINE_END, CLEAR_TO_SCREEN_END, HIDE_CURSOR, HOME, SHOW_CURSOR,
                              LiveView, frame)

from test_flexiqctl import document


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def size(columns: int = 80, rows: int = 24):
    return lambda: os.terminal_size((columns, rows))


def test_a_frame_goes_home_clears_each_line_s_rest_and_what_is_below():
    assert frame("a\nbb\n", 80, 24) == (HOME + "a" + CLEAR_TO_LINE_END + "\n" + "bb" + CLEAR_TO_LINE_END
                                        + CLEAR_TO_SCREEN_END)


def test_a_frame_is_cut_to_the_terminal_so_it_never_scrolls():
    text = frame("\n".join(f"line {n} " + "x" * 50 for n in range(40)), 20, 5)
    assert text.count("\n") == 4  # 5 rows, no newline after the last
    lines = text[len(HOME):-len(CLEAR_TO_SCREEN_END)].split(CLEAR_TO_LINE_END + "\n")
    assert lines[0] == "line 0 " + "x" * 13 and lines[-1] == "line 4 " + "x" * 13 + CLEAR_TO_LINE_END


def test_on_a_tty_screens_overwrite_each_other_and_the_cursor_comes_back():
    stream = FakeTTY()
    with LiveView(stream, size=size()) as view:
        view.show("first screen\nsecond line")
        view.show("next")
    out = stream.getvalue()
    assert out.startswith(HIDE_CURSOR + HOME + CLEAR_SCREEN)  # one full clear, at the start only
    assert out.count(CLEAR_SCREEN) == 1
    assert out.count(HOME) == 3  # the initial clear, then one per frame
    assert HOME + "next" + CLEAR_TO_LINE_END + CLEAR_TO_SCREEN_END in out  # the old second line is cleared
    assert out.endswith(SHOW_CURSOR + "\n")


def test_elsewhere_each_screen_is_printed_after_the_last_without_escapes():
    stream = io.StringIO()
    with LiveView(stream) as view:
        assert not view.tty
        view.show("one\n")
        view.show("two")
    assert stream.getvalue() == "one\n\ntwo\n\n"


def test_closing_a_view_that_never_drew_leaves_the_terminal_alone():
    stream = FakeTTY()
    LiveView(stream, size=size()).close()
    assert stream.getvalue() == ""


class FakeClient:
    """flexiqctl's Client without a bus; Ctrl-C is pressed at the third status read."""

    def __init__(self, address: str) -> None:
        self.reads = 0

    async def connect(self) -> None:
        pass

    def close(self) -> None:
        pass

    async def status(self) -> dict:
        self.reads += 1
        if self.reads == 3:
            signal.raise_signal(signal.SIGINT)
        return document()


@pytest.fixture
def ctrl_c():
    """Python's own Ctrl-C handler, which asyncio.run builds on: a run started in the
    background by a shell inherits SIGINT ignored, and the watch would never end."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_watch_redraws_in_place_and_ctrl_c_exits_130_with_the_cursor_shown(monkeypatch, ctrl_c):
    stream = FakeTTY()
    monkeypatch.setattr(flexiqctl, "Client", FakeClient)
    monkeypatch.setattr("sys.stdout", stream)
    monkeypatch.setenv("COLUMNS", "100")
    monkeypatch.setenv("LINES", "50")
    assert flexiqctl.main(["watch", "--interval", "1ms"]) == flexiqctl.EXIT_INTERRUPTED
    out = stream.getvalue()
    frames = out.split(HOME)[2:]  # [0] before, [1] the initial clear
    assert len(frames) >= 2
    assert all("Ctrl-C to quit" in f and "ScaleUpAge" in f for f in frames)
    assert out.count(CLEAR_SCREEN) == 1 and out.endswith(SHOW_CURSOR + "\n")


def test_watch_into_a_pipe_prints_whole_screens_one_after_another(monkeypatch, ctrl_c):
    stream = io.StringIO()
    monkeypatch.setattr(flexiqctl, "Client", FakeClient)
    monkeypatch.setattr("sys.stdout", stream)
    assert flexiqctl.main(["watch", "--interval", "1ms"]) == flexiqctl.EXIT_INTERRUPTED
    out = stream.getvalue()
    assert "\x1b" not in out
    assert out.count("Ctrl-C to quit") >= 2 and out.endswith("\n\n")
