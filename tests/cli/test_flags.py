"""dsd.cli.flags.int_list: integers and inclusive ranges, one clear error for bad text."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dsd.common.errors import InputError, int_list


def test_integers_and_ranges_read_in_the_order_written() -> None:
    assert int_list("--batch-sizes", "1,4,16", 1) == (1, 4, 16)
    assert int_list("--rows", "1-4", 1) == (1, 2, 3, 4)
    assert int_list("--rows", "7-7, 16,20-21", 1) == (7, 16, 20, 21)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("3-1", "the range '3-1' ends below its start"),
        ("1-a", "expected comma-separated integers or ranges a-b, got '1-a'"),
        ("x", "expected comma-separated integers or ranges a-b"),
        ("1-3,2", "duplicate values in '1-3,2'"),
        ("0-2", "every value must be an integer >= 1"),
        ("-3", "every value must be an integer >= 1"),  # a negative integer, not a range
        ("", "every value must be an integer >= 1"),
    ],
)
def test_bad_text_is_one_line_naming_the_flag(text: str, says: str) -> None:
    with pytest.raises(InputError) as raised:
        int_list("--rows", text, 1)
    message = str(raised.value)
    assert message.startswith("--rows: ") and says in message and "\n" not in message


@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 5)), min_size=1, max_size=6))
def test_a_list_of_ranges_reads_back_as_its_values(spans: list[tuple[int, int]]) -> None:
    text = ",".join(f"{low}-{low + width}" if width else str(low) for low, width in spans)
    expected = [v for low, width in spans for v in range(low, low + width + 1)]
    if len(set(expected)) != len(expected):
        with pytest.raises(InputError, match="duplicate"):
            int_list("--rows", text, 0)
    else:
        assert int_list("--rows", text, 0) == tuple(expected)
