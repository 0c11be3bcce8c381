"""Generated pickles for the serialisation-policy tests: benign state dicts and known attack
and evasion shapes. Nothing here unpickles; ``run_in_child`` does, in a child process, to show
that an attack shape is real (it writes a marker file)."""

from __future__ import annotations

import io
import os
import pickle
import struct
import subprocess
import sys
import zipfile
from collections import OrderedDict
from pathlib import Path


def _u(s: str) -> bytes:
    b = s.encode()
    return b"X" + struct.pack("<I", len(b)) + b  # BINUNICODE


def torch_state_dict_pickle() -> bytes:
    """The ``data.pkl`` of ``torch.save({'weight': tensor(2x2)})``, assembled by hand (protocol 2).

    Layout as torch/serialization.py ``_save`` writes it: an OrderedDict rebuilt by REDUCE,
    each tensor a ``torch._utils._rebuild_tensor_v2`` call on a persistent-id storage tuple.
    """
    return b"".join([
        b"\x80\x02",
        b"ccollections\nOrderedDict\nq\x00)Rq\x01",
        _u("weight"),
        b"ctorch._utils\n_rebuild_tensor_v2\nq\x02",
        b"((", _u("storage"), b"ctorch\nFloatStorage\nq\x03", _u("0"), _u("cpu"), b"K\x04tq\x04Q",
        b"K\x00", b"K\x02K\x02\x86", b"K\x02K\x01\x86", b"\x89",
        b"ccollections\nOrderedDict\n)R",
        b"tR",
        b"s.",
    ])


def torch_zip(pkl: bytes, *, name: str = "archive", extra: dict[str, bytes] | None = None) -> bytes:
    """A torch >= 1.6 checkpoint: a zip with ``<name>/data.pkl``, ``data/0``, ``version``."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr(f"{name}/data.pkl", pkl)
        zf.writestr(f"{name}/data/0", struct.pack("<4f", 1.0, 2.0, 3.0, 4.0))
        zf.writestr(f"{name}/version", b"3\n")
        for k, v in (extra or {}).items():
            zf.writestr(k, v)
    return buf.getvalue()


class _RunsCommand:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.system, (f"touch {self.marker}",)


def reduce_command(marker: Path, protocol: int) -> bytes:
    """A pickle whose ``__reduce__`` runs ``touch MARKER`` (``posix.system``) when loaded."""
    return pickle.dumps(_RunsCommand(marker), protocol=protocol)


def state_dict(protocol: int) -> bytes:
    """A plain state dict (OrderedDict of name -> raw little-endian bytes) by ``pickle.dumps``."""
    return pickle.dumps(OrderedDict(
        [("layer.weight", struct.pack("<4f", 1, 2, 3, 4)), ("layer.bias", [0.5, 0.25])]
    ), protocol=protocol)


def innocuous_module_chain(marker: Path) -> bytes:
    """Protocol 4 ``STACK_GLOBAL('logging', 'os.system')``: a harmless-looking module whose
    attribute chain reaches ``os.system`` (``find_class`` walks dotted names since protocol 4)."""
    return b"".join([
        b"\x80\x04", b"\x8c\x07logging\x94", b"\x8c\x09os.system\x94", b"\x93",
        _u(f"touch {marker}"), b"\x85R.",
    ])


def timeit_global(marker: Path) -> bytes:
    """Protocol 0 ``GLOBAL 'timeit timeit'``: a benchmarking helper that ``exec``s its ``setup``
    argument once (``timeit('pass', CODE)``)."""
    code = f"__import__('os').system('touch {marker}')"
    return f"ctimeit\ntimeit\n(Vpass\nV{code}\ntR.".encode()


def appended(first: bytes, second: bytes) -> bytes:
    """Two pickles in a row (legacy torch files are several pickles back to back)."""
    return first + second


def nested_zip(inner: bytes, depth: int = 2) -> bytes:
    """``inner`` (a zip) wrapped ``depth - 1`` more times in zip archives."""
    data = inner
    for i in range(depth - 1):
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as zf:
            zf.writestr(f"level{i}/model.pt", data)
        data = buf.getvalue()
    return data


def run_in_child(path: Path) -> None:
    """Unpickle ``path`` in a child Python (shows an attack shape is real; never in-process)."""
    code = ("import pickle,sys,zipfile,io\n"
            "p=sys.argv[1]\n"
            "d=open(p,'rb').read()\n"
            "f=io.BytesIO(d)\n"
            "pickle.load(f)\n"
            "try:\n pickle.load(f)\nexcept EOFError:\n pass\n")
    subprocess.run([sys.executable, "-c", code, str(path)], check=False, timeout=60,
                   capture_output=True)
