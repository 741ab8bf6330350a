"""Strict JSON text: the one writer of every JSON file and `--json` output dsd produces.

Python's `json` writes NaN and infinities as the bare words `NaN` and `Infinity`, which are not
JSON: every strict parser (browsers, jq, serde, Go) refuses the document. `dumps` writes a
non-finite float (Python's or numpy's) as null instead, numpy scalars and arrays as their
Python values, and then refuses anything non-finite left (`allow_nan=False`). Tables in
markdown or text say "-" for the same missing values (`missing_text`), CSV files an empty field
(`csv_text`: Python's `csv` would write `nan`; pandas' `to_csv` writes NaN empty too).

Not here: reading user files (`common.user_files`, which refuses the bare words unless asked).
"""

from __future__ import annotations

import csv
import io
import json
import math
import numbers
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal

# What a table cell says where JSON says null (a metric with no samples, e.g. acceptance at K=0)
MISSING = "-"


def finite_or_none(value: Any) -> Any:
    """`value` with every NaN or infinite float replaced by None, tuples as lists and numpy
    scalars and arrays as Python values (dict keys are kept as they are)."""
    if isinstance(value, float):  # numpy's float64 too
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite_or_none(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [finite_or_none(item) for item in value]
    if type(value).__module__ == "numpy" and hasattr(value, "tolist"):
        # an array or a scalar (numpy stays unimported here: the CLI starts without it)
        return finite_or_none(value.tolist())
    return value


def dumps(
    value: Any,
    *,
    indent: int | None = None,
    sort_keys: bool = False,
    separators: tuple[str, str] | None = None,
    ensure_ascii: bool = True,
    default: Callable[[Any], Any] | None = None,
    nonfinite: Literal["null", "refuse"] = "null",
) -> str:
    """`json.dumps` that never writes NaN or Infinity: non-finite floats become null
    (`nonfinite="refuse"`: ValueError instead, for stores that must read back what they
    wrote). `default` converts other objects as in `json.dumps`; its results are mapped too."""
    hook = None if default is None else (lambda item: finite_or_none(default(item)))
    return json.dumps(
        finite_or_none(value) if nonfinite == "null" else value,
        indent=indent,
        sort_keys=sort_keys,
        separators=separators,
        ensure_ascii=ensure_ascii,
        default=hook,
        allow_nan=False,
    )


def missing_text(value: Any, fmt: str = "{}") -> str:
    """`fmt` of a table cell's value, or MISSING for None, NaN and infinities."""
    if value is None:
        return MISSING
    if isinstance(value, numbers.Real) and not math.isfinite(value):
        return MISSING
    return fmt.format(value)


def csv_field(value: Any) -> Any:
    """A CSV cell's value: "" for None, NaN and infinities, else `value` as it is."""
    if value is None:
        return ""
    if isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral):
        return value if math.isfinite(value) else ""
    return value


def csv_text(rows: Iterable[Sequence[Any]]) -> str:
    """CSV text of `rows` (the header first), Unix line ends, missing values empty fields."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    for row in rows:
        writer.writerow([csv_field(value) for value in row])
    return buffer.getvalue()
