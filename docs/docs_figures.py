"""For the pages' executed code: a matplotlib figure as an ``<img>`` the page carries itself.

A page shows a picture its code made with a hidden block (no ``source=``)::

    ```python exec="on" html="on" session="vit-en"
    print(figure_html(fig))
    ```

after ``from docs_figures import figure_html`` in an earlier block of the session (the
build puts ``docs/`` on ``sys.path``; ``docs/hooks.py``). The picture is made when the
site is built, from the code above it; nothing is pasted.
"""

from __future__ import annotations

import base64
import io


def figure_html(fig, *, alt: str = "", width: int | None = None, dpi: int = 110) -> str:
    """The figure as a PNG in a data URL; the figure is closed."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    size = f' width="{width}"' if width else ""
    return f'<img alt="{alt}" src="data:image/png;base64,{data}"{size}>'
