"""Matplotlib figures to PNG bytes, deterministically; nothing else.

Callers draw, then hand the figure here; the bytes are written by the callers' atomic writers.
"""

from __future__ import annotations

import io
from typing import Any


def figure_png_bytes(figure: Any, dpi: int) -> bytes:
    """Lay out, render and close `figure`; PNG bytes that depend only on the data and matplotlib.

    No "Software" metadata entry: it would carry the matplotlib version string into the bytes.
    """
    import matplotlib.pyplot as plt

    try:
        figure.tight_layout()
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", dpi=dpi, metadata={"Software": None})
        return buffer.getvalue()
    finally:
        plt.close(figure)
