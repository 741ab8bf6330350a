"""dsd.common.special: scipy's own betaincinv, loaded without the scipy.special package."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from scipy import special as scipy_special

from dsd.common.special import betaincinv

# Run in a fresh interpreter: this test process has scipy.special imported already.
FRESH_PROCESS = textwrap.dedent(
    """
    import sys
    from dsd.common.special import betaincinv
    fast = betaincinv()
    assert "scipy.special" not in sys.modules, "the fast way imported scipy.special"
    assert fast(2.0, 3.0, 0.5) > 0.38
    import scipy.special  # the real package, after the fast way
    import scipy.stats
    assert scipy.special.betaincinv is fast
    assert abs(scipy.stats.beta.ppf(0.5, 2.0, 3.0) - fast(2.0, 3.0, 0.5)) < 1e-12
    print("ok")
    """
)


def test_fast_way_taken_and_scipy_special_importable_after() -> None:
    done = subprocess.run(
        [sys.executable, "-c", FRESH_PROCESS], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_public_function_when_scipy_special_is_imported() -> None:
    assert betaincinv() is scipy_special.betaincinv
