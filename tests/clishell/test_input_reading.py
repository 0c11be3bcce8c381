"""Input files and pipes read by :func:`clishell.read_input`: a signal meanwhile is never lost.

CPython runs a Python signal handler only in the main thread, between bytecodes or when a
blocking system call returns EINTR. A signal whose C-level handler ran while the main thread
was not yet inside ``read(2)`` (or ran on another thread) interrupts nothing, and a read of a
pipe whose writer stays silent then waits for ever: ``gateway serve --config FIFO`` hung after
its SIGINT in 1 of 120 runs under load (CI: ``test_interrupted_long_running``'s "starting"
case). The child here makes that race certain instead of rare: its main thread blocks SIGINT,
so the kernel delivers it to another thread, exactly as when the handler ran just before the
read began. A plain ``Path.read_bytes`` then hangs (the control); ``read_input`` is interrupted.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from clishell import read_input, read_input_text
from tests.conftest import default_signals, wait_until

ROOT = Path(__file__).resolve().parents[2]

# argv: FIFO, "read_input" | "plain". Prints "ready" once SIGINT can only reach another thread.
CHILD = textwrap.dedent("""
    import signal, sys, threading, time
    from pathlib import Path
    from clishell import Interrupted, interruptible, read_input

    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    unblocked = threading.Event()

    def catcher():  # the one thread the kernel can deliver SIGINT to
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        unblocked.set()
        time.sleep(600)

    threading.Thread(target=catcher, daemon=True).start()
    unblocked.wait()
    read = read_input if sys.argv[2] == "read_input" else (lambda p: Path(p).read_bytes())
    try:
        with interruptible():
            print("ready", flush=True)
            data = read(sys.argv[1])
    except Interrupted as exc:
        print("interrupted", exc.name, flush=True)
        sys.exit(130)
    print("read", len(data), flush=True)
""")


def _in_pipe_read(pid: int, main_thread_only: bool) -> bool:
    tasks = [str(pid)] if main_thread_only else os.listdir(f"/proc/{pid}/task")
    for tid in tasks:
        try:
            if "pipe_read" in Path(f"/proc/{pid}/task/{tid}/wchan").read_text():
                return True
        except OSError:
            continue
    return False


@pytest.fixture
def silent_fifo(tmp_path: Path) -> Iterator[tuple[Path, list[int]]]:
    """A FIFO and a list for the write ends the test opens (and keeps silent)."""
    fifo = tmp_path / "input.yaml"
    os.mkfifo(fifo)
    fds: list[int] = []
    yield fifo, fds
    for fd in fds:
        os.close(fd)


def _start_blocked_reader(fifo: Path, fds: list[int], how: str,
                          tmp_path: Path) -> tuple[subprocess.Popen[bytes], Path]:
    out = tmp_path / f"{how}.out"
    with out.open("wb") as out_file:
        proc = subprocess.Popen(default_signals([sys.executable, "-c", CHILD, str(fifo), how]),
                                cwd=ROOT, stdout=out_file, stderr=subprocess.STDOUT)

    def writer_open() -> bool:
        if not fds:
            try:  # ENXIO until the child has the FIFO open for reading
                fds.append(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                return proc.poll() is not None
        return True

    wait_until(writer_open, 60, "the child to open the FIFO")
    # The reading thread sits in read(2) of the silent pipe: the signal comes now.
    wait_until(lambda: proc.poll() is not None
               or _in_pipe_read(proc.pid, main_thread_only=how == "plain"),
               60, "the child to block reading the FIFO")
    assert proc.poll() is None, out.read_text()
    return proc, out


def test_a_signal_delivered_to_another_thread_interrupts_read_input(
    silent_fifo: tuple[Path, list[int]], tmp_path: Path,
) -> None:
    fifo, fds = silent_fifo
    proc, out = _start_blocked_reader(fifo, fds, "read_input", tmp_path)
    proc.send_signal(signal.SIGINT)
    try:
        status = proc.wait(20)  # within WAKE_S (0.25 s) of the signal; the bound is for load
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert status == 130, out.read_text()
    assert out.read_text().splitlines() == ["ready", "interrupted SIGINT"]


def test_the_control_a_plain_read_loses_that_signal_and_waits_for_its_writer(
    silent_fifo: tuple[Path, list[int]], tmp_path: Path,
) -> None:
    """The failure ``read_input`` exists for, shown with the same child (so the test above
    can fail): the plain read stays blocked after its SIGINT until the writer closes."""
    fifo, fds = silent_fifo
    proc, out = _start_blocked_reader(fifo, fds, "plain", tmp_path)
    proc.send_signal(signal.SIGINT)
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(1.5)
        os.close(fds.pop())  # the writer closes: the read returns, the handler runs then
        assert proc.wait(20) == 130, out.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert out.read_text().splitlines() == ["ready", "interrupted SIGINT"]


def test_a_pipe_is_read_whole_once_its_writer_closes(tmp_path: Path) -> None:
    fifo = tmp_path / "config.yaml"
    os.mkfifo(fifo)
    body = b"listen:\r\n  port: 8080\r\n" + "é".encode() * 100_000  # several pipe buffers

    def write() -> None:
        with open(fifo, "wb") as fh:
            fh.write(body)

    writer = threading.Thread(target=write)
    writer.start()
    try:
        assert read_input(fifo) == body
    finally:
        writer.join(10)
    writer = threading.Thread(target=write)
    writer.start()
    try:
        text = read_input_text(fifo)
    finally:
        writer.join(10)
    assert text == body.decode().replace("\r\n", "\n")


def test_text_is_what_read_text_gives_and_errors_are_a_plain_reads(tmp_path: Path) -> None:
    crlf = tmp_path / "crlf.yaml"
    crlf.write_bytes(b"a: 1\r\nb: 2\rc: 3\n")
    assert read_input_text(crlf) == crlf.read_text(encoding="utf-8") == "a: 1\nb: 2\nc: 3\n"
    assert read_input(crlf) == crlf.read_bytes()

    bad = tmp_path / "latin1.yaml"
    bad.write_bytes(b"name: caf\xe9\n")
    with pytest.raises(UnicodeDecodeError) as decode:
        read_input_text(bad)
    assert decode.value.start == 9  # the byte offset in the file

    with pytest.raises(FileNotFoundError) as missing:
        read_input(tmp_path / "absent.yaml")
    assert missing.value.filename == str(tmp_path / "absent.yaml")
    with pytest.raises(IsADirectoryError):
        read_input(tmp_path)


def test_an_error_in_the_reader_thread_reaches_the_caller(tmp_path: Path) -> None:
    # A Unix socket is neither a regular file nor a directory: it goes through the reader
    # thread, whose open() fails with ENXIO.
    path = tmp_path / "s"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(path))
        with pytest.raises(OSError) as failed:
            read_input(path)
    assert failed.value.errno == 6  # ENXIO
    assert failed.value.filename == str(path)


def test_another_thread_reads_a_pipe_directly(tmp_path: Path) -> None:
    fifo = tmp_path / "p"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(read_input(fifo)))
    reader.start()
    with open(fifo, "wb") as fh:
        fh.write(b"key: value\n")
    reader.join(10)
    assert got == [b"key: value\n"]
    assert [t for t in threading.enumerate() if t.name.startswith("read ")] == []


def test_not_regular_names_pipes_and_nothing_else(tmp_path: Path) -> None:
    from clishell import not_regular

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (tmp_path / "file").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "file")  # a Kubernetes Secret's file
    assert not_regular(fifo)
    assert not_regular("/dev/null")
    assert not any(not_regular(p) for p in (tmp_path / "file", tmp_path / "link", tmp_path,
                                            tmp_path / "absent"))


def test_a_pipe_where_a_file_is_read_again_by_name_is_refused_at_once(tmp_path: Path) -> None:
    """The TLS layer and the model-signing library read their files by name after our check:
    a pipe's content is gone by then (``<(...)`` gave "MalformedFraming") and a FIFO waited
    for a writer for ever. Both are refused naming the file; nothing is opened."""
    from gateway.config.loader import parse
    from gateway.config.tls_files import check_tls_files
    from gateway.errors import ConfigError
    from tests.gateway.helpers import BACKEND_KEY, config
    from weights.errors import SigningError
    from weights.signing import check_key

    fifo = tmp_path / "tls.pem"
    os.mkfifo(fifo)
    settings = parse(config(["http://127.0.0.1:1"], listen={
        "host": "127.0.0.1", "port": 0, "tls_cert_file": str(fifo),
        "tls_key_file": str(fifo)}), {"VLLM_KEY": BACKEND_KEY})
    with pytest.raises(ConfigError) as tls:
        check_tls_files(settings)
    assert str(tls.value).startswith(f"listen.tls_cert_file: {fifo} is not a regular file")
    with pytest.raises(SigningError) as key:
        check_key(fifo, private=True)
    assert str(key.value).startswith(f"{fifo}: not a regular file")
