"""The shared consoles print values as they are: no ``:emoji:`` codes, no markup.

rich replaces ``:name:`` codes even where markup is off, and an IPv6 address is full of them:
``2001:db8::a:b`` holds ``:a:`` (printed as a letter emoji), ``::ab:cd:`` holds ``:cd:``.
"""

from __future__ import annotations

import pytest

from clishell.consoles import diagnostics, results

TEXT = "deny [2001:db8::a:b]:8000 [::ab:cd]:80 operator team :smile: a[/b]"


def test_results_and_diagnostics_print_text_as_written(
        capsys: pytest.CaptureFixture[str]) -> None:
    results().print(TEXT)
    diagnostics().print(TEXT)
    out, err = capsys.readouterr()
    assert out == TEXT + "\n"
    assert err == TEXT + "\n"
