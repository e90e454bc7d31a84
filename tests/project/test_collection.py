"""The collection shortcut (tests/support/collection.py): a module is skipped under -m
only where no test it could hold would be selected."""

from __future__ import annotations

import pytest
from collection import deselects_all, module_marks

INNER = "not daemons and not model and not experiment"


@pytest.mark.parametrize("source,marks", [
    ("import pytest\npytestmark = pytest.mark.daemons\n", {"daemons"}),
    ("pytestmark = [pytest.mark.model, pytest.mark.daemons]\n", {"model", "daemons"}),
    ("pytestmark = pytest.mark.skipif(True, reason='x')\n", None),  # a call: not a name
    ("pytestmark = [pytest.mark.daemons, SKIP]\n", None),  # one part unknown
    ("daemons = pytest.mark.daemons\n", None),  # no pytestmark
    ("def f(:\n", None),
])
def test_module_marks_are_read_from_the_source(source, marks):
    assert module_marks(source) == marks


@pytest.mark.parametrize("marks,markexpr,skipped", [
    ({"daemons"}, INNER, True),
    ({"model", "daemons"}, INNER, True),
    ({"experiment"}, INNER, True),
    ({"slow"}, INNER, False),  # its tests run unless they add a mark
    ({"daemons"}, "daemons", False),
    ({"daemons"}, "not experiment", False),
    ({"daemons"}, "not daemons or slow", False),  # a test adding slow is selected
    ({"daemons"}, "not (daemons or model)", True),
    ({"model"}, "daemons and model", False),  # a test adding daemons is selected
])
def test_a_module_is_skipped_only_when_no_test_in_it_could_be_selected(marks, markexpr,
                                                                       skipped):
    assert deselects_all(marks, markexpr) is skipped
