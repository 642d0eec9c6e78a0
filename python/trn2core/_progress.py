"""Progress of long command-line runs: a one-line bar on stderr when stderr is a terminal,
nothing at all when it is a pipe or a file (so piped output, logs and tests stay clean).

The bar shows the time elapsed and the rate, redrawn twice a second while a long step runs.
With tqdm installed (a maintained progress library that also draws in notebooks), tqdm
draws it instead; without it, trn2core's own one-line bar does."""

from __future__ import annotations

import sys
import threading
import time

__all__ = ["Progress"]

_WIDTH = 30


class Progress:
    """``Progress(label, total)``, then ``step()`` after each unit of work and ``close()`` at
    the end (also as a context manager). ``live=False`` turns it off (``--non-interactive``)."""

    def __init__(
        self, label: str, total: int, *, live: bool | None = None, stream=None, unit: str = "it"
    ) -> None:
        self.stream = sys.stderr if stream is None else stream
        self.label, self.total, self.done, self.unit = label, max(1, total), 0, unit
        try:
            tty = self.stream.isatty()
        except (AttributeError, ValueError):  # a closed or unusual stream: no bar
            tty = False
        self.live = tty and (live is None or live)
        self._shown = 0
        self._t0 = time.perf_counter()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._tqdm = None
        if self.live:
            try:
                from tqdm.auto import tqdm
            except ImportError:
                tqdm = None
            if tqdm is not None:
                self._tqdm = tqdm(
                    total=self.total, desc=label, unit=unit, file=self.stream, leave=False
                )
                return
            threading.Thread(target=self._tick, daemon=True).start()
        self._draw()

    def _tick(self) -> None:
        """Redraws the elapsed time while a long step runs."""
        while not self._stop.wait(0.5):
            self._draw()

    def _draw(self) -> None:
        if self.live and self._tqdm is None:
            with self._lock:
                if self._stop.is_set() and self._shown == 0:
                    return
                filled = _WIDTH * self.done // self.total
                bar = "#" * filled + "." * (_WIDTH - filled)
                dt = time.perf_counter() - self._t0
                rate = f", {self.done / dt:.2f} {self.unit}/s" if self.done and dt > 0 else ""
                text = f"\r   [{bar}] {self.done}/{self.total} {self.label} {dt:.1f} s{rate}"
                self._shown = max(self._shown, len(text))
                self.stream.write(text.ljust(self._shown))
                self.stream.flush()

    def step(self, n: int = 1) -> None:
        self.done = min(self.total, self.done + n)
        if self._tqdm is not None:
            self._tqdm.update(n)
        self._draw()

    def close(self) -> None:
        """Wipes the bar's line (the terminal is left as it was)."""
        self._stop.set()
        if self._tqdm is not None:
            self._tqdm.close()
            self._tqdm = None
            return
        with self._lock:
            if self.live and self._shown:
                self.stream.write("\r" + " " * self._shown + "\r")
                self.stream.flush()
                self._shown = 0

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
