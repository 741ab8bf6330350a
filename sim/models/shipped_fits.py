"""The parametric fits that come with dsd: those of the bundled profiles, so that a first run
(an empty cache, a fresh worker, `DSD_CACHE_DIR=off`) does not spend seconds of scipy on them.

`SHIPPED_FITS` holds `dsd.common.disk_memo` entries of the "parametric-fit" namespace, exactly
as the memo writes them; `sim.models.latency_choice.fit_parametric` reads them where the cache
has none. An entry's name is the hash of its key, which names the fit's code (the source of
`sim.models.latency`) and the numpy and scipy versions: after an edit of that module or an
upgrade, the shipped entries no longer match (runs fit again, as without them) and
tests/sim/test_shipped_fits.py says to write them again:

    python -m dsd.sim.models.shipped_fits

which runs the latency-model choice ("auto" and "parametric") of every bundled profile with an
empty cache and keeps the entries it wrote. Not here: fits of a user's own profiles (the cache).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

SHIPPED_FITS = Path(__file__).resolve().parent / "data" / "fits"
# The profiles in the package whose fits are shipped (tests use the fixture's table alone).
_PROFILES = Path(__file__).resolve().parents[2] / "policies" / "profiles"
BUNDLED_PROFILES = (_PROFILES / "pr32374_llama31_8b_eagle_h100.json",)
NAMESPACE = "parametric-fit"


def write_shipped_fits() -> list[Path]:
    """Fit the bundled profiles with an empty cache and ship the entries; returns them."""
    from dsd.common.disk_memo import CACHE_DIR_ENV
    from dsd.policies.profile_io import load_profile
    from dsd.sim.models.latency_choice import select_latency_model

    if SHIPPED_FITS.exists():
        shutil.rmtree(SHIPPED_FITS)  # else the choice would read them instead of fitting
    previous = os.environ.get(CACHE_DIR_ENV)
    with tempfile.TemporaryDirectory() as scratch:
        os.environ[CACHE_DIR_ENV] = scratch
        try:
            for path in BUNDLED_PROFILES:
                profile = load_profile(str(path))
                for kind in ("auto", "parametric"):
                    select_latency_model(profile, kind)
        finally:
            if previous is None:
                del os.environ[CACHE_DIR_ENV]
            else:
                os.environ[CACHE_DIR_ENV] = previous
        SHIPPED_FITS.mkdir(parents=True)
        written = sorted((Path(scratch) / NAMESPACE).glob("*.json"))
        for entry in written:
            shutil.copyfile(entry, SHIPPED_FITS / entry.name)
    return [SHIPPED_FITS / entry.name for entry in written]


if __name__ == "__main__":
    for shipped in write_shipped_fits():
        print(shipped)
