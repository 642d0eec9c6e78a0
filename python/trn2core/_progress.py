"""Progress of long command-line runs: a one-line bar on stderr when stderr is a terminal,
nothing at all when it is a pipe or a file (so piped output, logs and tests stay clean)."""

from __future__ import annotations

import sys

__all__ = ["Progress"]

_WIDTH = 30


class Progress:
    """``Progress(label, total)``, then ``step()`` after each unit of work and ``close()`` at
    the end (also as a context manager). ``live=False`` turns it off (``--non-interactive``)."""

    def __init__(self, label: str, total: int, *, live: bool | None = None, stream=None) -> None:
        self.stream = sys.stderr if stream is None else stream
        self.label, self.total, self.done = label, max(1, total), 0
        try:
            tty = self.stream.isatty()
        except (AttributeError, ValueError):  # a closed or unusual stream: no bar
            tty = False
        self.live = tty and (live is None or live)
        self._shown = 0
        self._draw()

    def _draw(self) -> None:
        if self.live:
            filled = _WIDTH * self.done // self.total
            bar = "#" * filled + "." * (_WIDTH - filled)
            text = f"\r   [{bar}] {self.done}/{self.total} {self.label}"
            self._shown = max(self._shown, len(text))
            self.stream.write(text)
            self.stream.flush()

    def step(self, n: int = 1) -> None:
        self.done = min(self.total, self.done + n)
        self._draw()

    def close(self) -> None:
        """Wipes the bar's line (the terminal is left as it was)."""
        if self.live and self._shown:
            self.stream.write("\r" + " " * self._shown + "\r")
            self.stream.flush()
            self._shown = 0

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
