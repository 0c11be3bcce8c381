"""Where a command's output goes: results on stdout, progress and diagnostics on stderr.

One rule for every CLI (``cmd > file`` keeps the result, the terminal still shows what
happens)::

    results()      the rich Console on standard output: reports, tables, the plan, --json
    diagnostics()  the rich Console on standard error: warnings, notes, the progress bar
    byte_progress(total, label, quiet)
                   a context manager yielding a byte-count callback that draws a rich bar
                   (bytes, throughput, ETA) on standard error, or ``None`` when quiet or when
                   standard error is not a terminal
    table(*headers, title=...)
                   a rich table whose cells fold instead of ending in an ellipsis

Each call returns a real ``rich.console.Console`` (never a proxy: rich enters a console as a
context manager, and a stand-in that forwards attributes is not one). rich is imported on
first use so that a command that prints nothing styled (``airgap verify``'s fast path) does not
pay for it. Markup and ``:emoji:`` codes are off: file names, paths, revisions such as
``a[/b]`` and IPv6 addresses such as ``2001:db8::a:b`` print as they are;
soft wrap is on, so a long path is never cut with an ellipsis: the terminal wraps it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table


def _console(*, stderr: bool) -> Console:
    from rich.console import Console

    # No emoji codes: ":a:" inside an IPv6 address or bundle text must print as written.
    return Console(stderr=stderr, soft_wrap=True, markup=False, highlight=False, emoji=False)


def results() -> Console:
    """The console on standard output, for a command's result (what ``> file`` must keep)."""
    return _console(stderr=False)


def diagnostics() -> Console:
    """The console on standard error, for progress, warnings and notes."""
    return _console(stderr=True)


@contextmanager
def byte_progress(total: int, label: str, quiet: bool) -> Iterator[Callable[[int], None] | None]:
    """A progress bar of ``total`` bytes on standard error while the block runs.

    Args:
        total: Bytes expected (the bar's 100 %).
        label: Shown left of the bar.
        quiet: Draw nothing (``--quiet``, ``--json``).

    Yields:
        A callback taking a signed byte count to add, or ``None`` when nothing is drawn (quiet,
        or standard error is not a terminal: a log file gets no redraw sequences).
    """
    if quiet:  # before the console: a quiet command never imports rich
        yield None
        return
    console = diagnostics()
    if not console.is_terminal:
        yield None
        return
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
               TransferSpeedColumn(), TimeRemainingColumn())  # fmt: skip
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task(label, total=total)
        yield lambda n: bar.advance(task, n)


def table(*headers: str, title: str | None = None, whole: Collection[str] = ()) -> Table:
    """A rich table whose cells wrap and fold rather than end in an ellipsis.

    rich cuts a cell with ``…`` when the table is wider than the console; an id, a formula or a
    path cut that way is lost on an 80-column terminal. Folding keeps every character.

    Args:
        headers: The column headers, left to right.
        title: Shown above the table.
        whole: Headers of the columns whose cells are kept on one line when the width allows
            (ids one greps for); the other columns give way first.
    """
    from rich.table import Table

    t = Table(title=title)
    for header in headers:
        t.add_column(header, overflow="fold", no_wrap=header in whole)
    return t


def print_wrapped(console: Console, text: str, *, indent: int = 0, hang: int = 2) -> None:
    """Print ``text`` wrapped at word boundaries to ``console``'s width, continuation indented.

    rich wraps a long line back to column 0 (or not at all with soft wrap on); a sentence of
    reasons printed that way ran to 300 columns in a log. Here every line fits the console's
    width (80 when not a terminal), lines after the first are indented by ``indent + hang``
    spaces. A token longer than the line (a long path, ``org/name@COMMIT``) is never broken: it
    gets a line of its own, which may be wider, so that it can still be grepped and copied.

    Args:
        console: Where to print (markup and highlighting are not applied to ``text``).
        text: One paragraph.
        indent: Spaces before the first line.
        hang: Extra spaces before the following lines.
    """
    import textwrap

    width = max(console.width, 40)
    lines = textwrap.wrap(text, width=width, initial_indent=" " * indent,
                          subsequent_indent=" " * (indent + hang), break_on_hyphens=False,
                          break_long_words=False)
    console.print("\n".join(lines), markup=False, highlight=False, soft_wrap=True)
