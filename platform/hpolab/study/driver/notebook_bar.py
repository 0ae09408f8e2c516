"""A study's progress bar in Jupyter: finished trials of the budget, updated in place.

In a notebook rich prints each line of Progress as its own HTML output, which works, but a long study
is then a long scroll with no "how far along" at a glance. This bar is one output (IPython's
display with a display_id) updated as trials finish and epochs end: plain HTML (<progress>), so it
needs no ipywidgets (not installed with hpolab; rich's and tqdm's live bars need them in Jupyter),
and a text form for front ends without HTML. Outside Jupyter there is no bar (the terminal keeps its
lines as the CLI prints them).
"""

from __future__ import annotations

import html
import time

MIN_INTERVAL = 0.25  # seconds between two updates of the bar for epoch ends (a finished trial always updates)


class NotebookBar:
    def __init__(self, name: str, n_trials: int):
        from IPython.display import display

        self.name, self.n_trials = name, n_trials
        self.finished, self.detail = 0, "starting"
        self._last = 0.0
        self._handle = display(self, display_id=True)  # (this object's reprs are the bar)

    def update(self, finished: int | None = None, detail: str | None = None, force: bool = True) -> None:
        if finished is not None:
            self.finished = finished
        if detail is not None:
            self.detail = detail
        now = time.monotonic()
        if force or now - self._last >= MIN_INTERVAL:
            self._last = now
            self._handle.update(self)

    def _repr_html_(self) -> str:
        return (f"<div><b>study {html.escape(self.name)}</b> <progress value={self.finished} max={self.n_trials} "
                f"style='width: 20em; vertical-align: middle'></progress> {self.finished}/{self.n_trials} finished "
                f"<small>{html.escape(self.detail)}</small></div>")

    def __repr__(self) -> str:
        width = 30
        done = round(width * self.finished / self.n_trials) if self.n_trials else width
        return f"study {self.name} [{'#' * done}{'.' * (width - done)}] {self.finished}/{self.n_trials} finished {self.detail}"
