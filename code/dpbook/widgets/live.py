"""Live controls for a running kernel: ipywidgets that rebuild a player when a value changes.

The built book shows the static player; these controls need a kernel (JupyterLab, Notebook),
since every change calls back into Python to rebuild the frames.
"""

from __future__ import annotations

import time
from typing import Callable

from .. import vi


def live(build: Callable[..., "object"], **controls):
    """``build(**values)`` must return an object with ``to_html()`` (a ``Player`` or a figure
    panel). ``controls`` maps each keyword of ``build`` to an ipywidgets control. Returns a
    ``VBox`` of the controls, a status line (rebuild time) and the output area."""
    import ipywidgets as w
    from IPython.display import HTML, display

    out = w.Output()
    status = w.HTML()

    def redraw(change=None):
        values = {name: ctl.value for name, ctl in controls.items()}
        t0 = time.perf_counter()
        try:
            html = build(**values).to_html()
        except ValueError as err:  # a combination the model refuses: say why, keep the page
            status.value = f"<b>Không vẽ được:</b> {err}"
            return
        status.value = f"Dựng lại trong {vi.ms(time.perf_counter() - t0, 0)}"
        out.clear_output(wait=True)
        with out:
            display(HTML(html))

    for ctl in controls.values():
        ctl.observe(redraw, names="value")
    redraw()
    return w.VBox([w.HBox(list(controls.values())), status, out])
