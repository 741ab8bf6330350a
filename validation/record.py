"""The record of how a validation ran: the typed form of its folder's config.json.

`run_cells` makes a `ValidationRecord`, the writers and the folder take its JSON, and `rescore`
reads an old folder back through `ValidationRecord.from_json`, where the defaults say what a
report written before a field existed meant by leaving it out. Keys the record does not name
(the machine's environment, the hardware report's plan and times) ride along in `extra`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from dsd.common.errors import InputError
from dsd.sim.models.latency import PrefillForward


@dataclass(frozen=True)
class CellRecord:
    """One cell's limits as the run resolved them."""

    policy: str
    max_concurrency: int | None  # None: every request at once
    num_prompts: int
    k_max: int
    max_num_seqs: int
    max_model_len: int
    num_kv_blocks: int
    latency_model: str | None
    host_overhead_source: str


@dataclass(frozen=True)
class ValidationRecord:
    """A validation folder's config.json, field by field (JSON order is field order)."""

    command: str
    profile: str
    target: str
    draft: str
    policies: tuple[str, ...]
    max_concurrency: tuple[int, ...]
    dataset: str
    num_prompts_per_concurrency: int
    trials: int
    trials_done: int  # fewer than `trials` where a time budget stopped the rounds
    output_len: int | None
    seed: int
    scheduling: str
    latency_model: str
    acceptance_model: str
    host_overhead_ms: float | None
    host_overhead_source: str
    fast_path: str = "off"
    # how the engine ran prefill chunks beside decode rows (older reports: separate)
    prefill_forward: PrefillForward = "separate"
    ignore_eos: bool = True
    profile_problems: tuple[str, ...] = ()
    # what a plain `goodput` / `online` / `per-request` SPEC scored (older reports: rates)
    goodput_acceptance: str = "rates"
    online_acceptance: str = "rates"
    per_request_acceptance: str = "rates"
    retime: dict[str, Any] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)  # written flat, before the cells
    cells: tuple[CellRecord, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)  # written flat, after the cells

    def acceptance_as_run(self, family: str) -> str:
        """The SPEC a plain `goodput`, `online` or `per-request` cell ran as."""
        scored = getattr(self, f"{family.replace('-', '_')}_acceptance")
        return f"{family}:acceptance={scored}"

    def cell(self, policy: str, max_concurrency: int) -> CellRecord:
        for cell in self.cells:
            if cell.policy == policy and cell.max_concurrency == max_concurrency:
                return cell
        raise InputError(f"config.json: no cell {policy} at C={max_concurrency}")

    def with_extra(self, **values: Any) -> ValidationRecord:
        """The record with keys added (or, for a field, replaced: `command`)."""
        fields = {f.name for f in dataclasses.fields(self)} - {"environment", "cells", "extra"}
        own = {key: value for key, value in values.items() if key in fields}
        added = {key: value for key, value in values.items() if key not in fields}
        return dataclasses.replace(self, **own, extra={**self.extra, **added})

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {}
        for item in dataclasses.fields(self):
            value = getattr(self, item.name)
            if item.name == "environment":
                data.update(value)
            elif item.name == "cells":
                data["cells"] = [dataclasses.asdict(cell) for cell in value]
            elif item.name == "extra":
                data.update(value)
            else:
                data[item.name] = list(value) if isinstance(value, tuple) else value
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any], source: str = "config.json") -> ValidationRecord:
        """A record from a folder's config.json; keys it does not name go to `extra`."""
        names = {f.name for f in dataclasses.fields(cls)} - {"environment", "cells", "extra"}
        cell_names = [f.name for f in dataclasses.fields(CellRecord)]
        try:
            cells = tuple(
                CellRecord(**{name: cell.get(name) for name in cell_names})
                for cell in data["cells"]
            )
            known = {key: value for key, value in data.items() if key in names}
            for key in ("policies", "max_concurrency", "profile_problems"):
                if key in known:
                    known[key] = tuple(known[key])
            known.setdefault("trials_done", data.get("trials"))
            extra = {k: v for k, v in data.items() if k not in names and k != "cells"}
            return cls(**known, cells=cells, extra=extra)
        except (KeyError, TypeError) as error:
            raise InputError(f"{source}: not a validation record ({error})") from None
