"""A format is decided by a full parse, and anything a pickle loader would run is a pickle.

Polyglots (a safetensors length or the GGUF magic that an unpickler reads as a float before
a working payload), NumPy arrays of objects, and hostile safetensors headers, with the
``safetensors`` library itself and ``numpy`` as the oracles of what a loader does."""

from __future__ import annotations

import io
import json
import pickle
import struct
import subprocess
import sys
import tracemalloc
import zipfile
from pathlib import Path

import numpy as np
import pytest
from safetensors import SafetensorError, safe_open

from tests.hub_emulator.safetensors_gen import make_safetensors
from tests.weights import pickle_samples as S
from weights.errors import ModelFileRefused, SizingError, UnsafeSerialisationError
from weights.format_scan import inspect_file
from weights.gguf_format import MalformedGGUF, parse_gguf
from weights.safetensors_format import MalformedSafetensors, parse_safetensors
from weights.serialisation import DEFAULT_POLICY, SerialisationPolicy, check_format
from weights.sizing import count_params, read_header_file

ALLOW = SerialisationPolicy(allow_pickle=True)


def _payload(marker: Path) -> bytes:
    """A protocol-0 body (no STOP-less tricks): ``posix.system('touch MARKER')``, then STOP."""
    return S.reduce_command(marker, 0)


def safetensors_polyglot(marker: Path) -> bytes:
    """``G\\0*7{``: a safetensors length of 71 then ``{``; to an unpickler BINFLOAT + payload."""
    body = b"G" + b"\0" * 7 + b"{" + _payload(marker)
    return body + b" " * max(0, 8 + 71 - len(body))


def gguf_polyglot(marker: Path) -> bytes:
    """``GGUF`` + version 3 + one byte: BINFLOAT over ``GUF\\x03\\0\\0\\0\\0``, then payload."""
    return b"GGUF" + struct.pack("<I", 3) + b"\0" + _payload(marker) + b"\0" * 64


def _runs_under_pickle(path: Path) -> bool:
    marker = path.parent / "ran"
    marker.unlink(missing_ok=True)
    S.run_in_child(path)
    return marker.exists()


@pytest.mark.parametrize("name", ["pytorch_model.bin", "model.pkl", "model.joblib",
                                  "model.safetensors", "weights.dat"])
@pytest.mark.parametrize("shape", ["safetensors", "gguf"])
def test_polyglots_are_pickles_whatever_their_name_or_header(
    tmp_path: Path, name: str, shape: str
) -> None:
    marker = tmp_path / "ran"
    data = safetensors_polyglot(marker) if shape == "safetensors" else gguf_polyglot(marker)
    f = tmp_path / name
    f.write_bytes(data)
    assert _runs_under_pickle(f), "the polyglot must really run under pickle.load"
    kind, verdict = inspect_file(f, name)
    assert kind == "pickle"
    assert verdict is not None and not verdict.safe
    assert "posix.system" in verdict.globals
    with pytest.raises(UnsafeSerialisationError, match="pickle-based file refused"):
        check_format(f, f"acme/m:{name}", DEFAULT_POLICY)
    with pytest.raises(UnsafeSerialisationError, match=r"posix\.system"):
        check_format(f, f"acme/m:{name}", ALLOW)


def test_a_real_safetensors_file_is_safetensors_and_a_lookalike_is_data(tmp_path: Path) -> None:
    good = tmp_path / "model.safetensors"
    good.write_bytes(make_safetensors({"w": ("BF16", [4, 4])}))
    assert inspect_file(good, good.name) == ("safetensors", None)
    look = tmp_path / "look.safetensors"
    look.write_bytes(struct.pack("<Q", 2) + b"{}" + b"x" * 10)  # data not covered
    assert inspect_file(look, look.name) == ("data", None)


def _object_array(marker: Path) -> np.ndarray:
    return np.array([S._RunsCommand(marker), 1], dtype=object)


def test_npy_of_objects_is_a_pickle_and_numeric_npy_is_data(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    evil = tmp_path / "evil.npy"
    np.save(evil, _object_array(marker), allow_pickle=True)
    code = f"import numpy; numpy.load({str(evil)!r}, allow_pickle=True)"
    subprocess.run([sys.executable, "-c", code], check=False, timeout=60, capture_output=True)
    assert marker.exists(), "np.load(allow_pickle=True) must really run the payload"
    kind, verdict = inspect_file(evil, evil.name)
    assert kind == "pickle" and verdict is not None and not verdict.safe
    assert "posix.system" in verdict.globals
    plain = tmp_path / "plain.npy"
    np.save(plain, np.arange(12, dtype=np.float32).reshape(3, 4))
    assert inspect_file(plain, plain.name) == ("data", None)
    structured = tmp_path / "structured.npy"
    np.save(structured, np.zeros(2, dtype=[("a", "<f4"), ("b", "O")]), allow_pickle=True)
    assert inspect_file(structured, structured.name)[0] == "pickle"


def test_npz_holding_an_object_array_is_a_pickle(tmp_path: Path) -> None:
    evil = tmp_path / "arrays.npz"
    np.savez(evil, ok=np.ones(3), bad=_object_array(tmp_path / "ran"))
    kind, verdict = inspect_file(evil, evil.name)
    assert kind == "pickle" and verdict is not None and not verdict.safe
    with pytest.raises(UnsafeSerialisationError, match="pickle-based file refused"):
        check_format(evil, "acme/m:arrays.npz", DEFAULT_POLICY)
    fine = tmp_path / "fine.npz"
    np.savez(fine, a=np.ones(3), b=np.zeros((2, 2)))
    assert inspect_file(fine, fine.name) == ("data", None)


def test_an_encrypted_archive_member_has_its_own_code(tmp_path: Path) -> None:
    data = bytearray(S.torch_zip(S.torch_state_dict_pickle()))
    # Set the "encrypted" flag (bit 0) in every local and central header (APPNOTE 4.4.4).
    for sig, flag_at in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):
        i = data.find(sig)
        while i >= 0:
            data[i + flag_at] |= 0x1
            i = data.find(sig, i + 4)
    f = tmp_path / "pytorch_model.bin"
    f.write_bytes(bytes(data))
    with pytest.raises(ModelFileRefused, match="encrypted archive member") as info:
        check_format(f, "acme/m:pytorch_model.bin", ALLOW)
    assert info.value.code == "encrypted_archive"


def test_archives_nested_too_deep_have_their_own_code(tmp_path: Path) -> None:
    f = tmp_path / "model.pt"
    f.write_bytes(S.nested_zip(S.torch_zip(S.torch_state_dict_pickle()), 5))
    with pytest.raises(ModelFileRefused, match="nested deeper than 3") as info:
        check_format(f, "acme/m:model.pt", ALLOW)
    assert info.value.code == "archive_too_deep"


# ---- safetensors headers, with the safetensors library as the oracle -----------------------

def _st(header: object, data: bytes = b"", raw: bytes | None = None) -> bytes:
    text = raw if raw is not None else json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


def _t(dtype: str, shape: list[object], begin: object, end: object) -> dict[str, object]:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


HOSTILE: dict[str, bytes] = {
    "negative_shape": _st({"w": _t("F32", [-2], 0, 8)}, b"\0" * 8),
    "overflowing_shape": _st({"w": _t("F32", [2**63, 4], 0, 8)}, b"\0" * 8),
    "shape_past_u64": _st({"w": _t("F32", [2**64], 0, 8)}, b"\0" * 8),
    "negative_offset": _st({"w": _t("F32", [2], -8, 0)}, b"\0" * 8),
    "offset_past_u64": _st({"w": _t("F32", [2], 0, 2**64 + 8)}, b"\0" * 8),
    "overlapping": _st({"a": _t("F32", [2], 0, 8), "b": _t("F32", [2], 0, 8)}, b"\0" * 8),
    "hole": _st({"a": _t("F32", [2], 8, 16)}, b"\0" * 16),
    "size_mismatch": _st({"a": _t("F32", [4], 0, 8)}, b"\0" * 8),
    "nested_header": _st({"w": {"dtype": "F32", "shape": [[2]], "data_offsets": [0, 8]}},
                         b"\0" * 8),
    "nested_metadata": _st({"__metadata__": {"k": {"x": "y"}}}),
    "unknown_dtype": _st({"w": _t("Q4", [2], 0, 1)}, b"\0"),
    "uncovered_tail": _st({"w": _t("F32", [2], 0, 8)}, b"\0" * 9),
    "length_past_file": struct.pack("<Q", 10**6) + b"{}",
    "not_json": _st(None, raw=b"{\"w\": }"),
    "trailing_bytes": _st(None, raw=b"{}\0"),
}


def _library_accepts(path: Path) -> bool:
    try:
        with safe_open(str(path), framework="np") as f:
            f.keys()
    except SafetensorError:
        return False
    return True


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_headers_are_refused_where_the_library_refuses_them(
    tmp_path: Path, case: str
) -> None:
    f = tmp_path / "model.safetensors"
    f.write_bytes(HOSTILE[case])
    assert not _library_accepts(f), "the oracle must refuse this header"
    with f.open("rb") as fh, pytest.raises(MalformedSafetensors):
        parse_safetensors(fh, f.stat().st_size)
    with pytest.raises(SizingError, match="not a valid safetensors file"):
        read_header_file(f)
    assert inspect_file(f, f.name) == ("data", None)


def test_duplicate_names_are_refused_though_the_library_keeps_the_last(tmp_path: Path) -> None:
    raw = b'{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},' \
          b'"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}'
    f = tmp_path / "dup.safetensors"
    f.write_bytes(_st(None, b"\0" * 4, raw=raw))
    assert _library_accepts(f)  # two readers may see different tensors: we refuse
    with f.open("rb") as fh, pytest.raises(MalformedSafetensors, match="appears twice"):
        parse_safetensors(fh, f.stat().st_size)


@pytest.mark.parametrize("tensors", [
    {"w": ("BF16", [4, 4]), "b": ("F32", [4]), "s": ("F8_E4M3", [3, 5]), "scalar": ("F32", [])},
    {"empty": ("F16", [0, 7]), "x": ("I64", [1])},
    {},
])
def test_valid_files_parse_the_same_as_the_library(tmp_path: Path,
                                                   tensors: dict[str, tuple[str, list[int]]]
                                                   ) -> None:
    f = tmp_path / "ok.safetensors"
    f.write_bytes(make_safetensors(tensors, metadata={"format": "pt"}))
    assert _library_accepts(f)
    with f.open("rb") as fh:
        header = parse_safetensors(fh, f.stat().st_size)
    with safe_open(str(f), framework="np") as lib:
        assert sorted(t.name for t in header.tensors) == sorted(lib.keys())
        assert header.metadata == lib.metadata()
        for t in header.tensors:
            assert list(t.shape) == list(lib.get_slice(t.name).get_shape())


def test_a_negative_shape_no_longer_shrinks_a_size_estimate(tmp_path: Path) -> None:
    """40 bytes with shape [-2**40, ...] used to lower the parameter count below zero."""
    big = tmp_path / "a.safetensors"
    big.write_bytes(make_safetensors({"w": ("BF16", [1024, 1024])}))
    evil = tmp_path / "b.safetensors"
    evil.write_bytes(_st({"w": _t("BF16", [-(2**30)], 0, 0)}))
    assert count_params([("a", read_header_file(big))]).total == 1024 * 1024
    with pytest.raises(SizingError, match="not a valid safetensors file"):
        read_header_file(evil)


@pytest.mark.parametrize("entries", [
    # ~5.9 MB: the same worst shape; json.loads peaks near 9.9x of it, the parser near 5.9x.
    pytest.param(100_000, id="6MB"),
    # ~26 MB (20 s under tracemalloc): make test only.
    pytest.param(450_000, id="26MB", marks=pytest.mark.slow),
])
def test_a_huge_header_costs_a_bounded_multiple_of_its_size(tmp_path: Path,
                                                            entries: int) -> None:
    """Tiny entries: json.loads of them peaks near 10-12x; the strict parser stays low."""
    entry = '"t{}":{{"dtype":"U8","shape":[],"data_offsets":[{},{}]}}'
    parts = [entry.format(i, i, i + 1) for i in range(entries)]
    text = ("{" + ",".join(parts) + "}").encode()
    f = tmp_path / "huge.safetensors"
    f.write_bytes(struct.pack("<Q", len(text)) + text + b"\0" * entries)
    size = f.stat().st_size
    tracemalloc.start()
    try:
        with f.open("rb") as fh:
            header = parse_safetensors(fh, size)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(header.tensors) == entries
    assert peak < 8 * len(text), f"peak {peak / 1e6:.0f} MB for a {len(text) / 1e6:.0f} MB header"


# ---- GGUF ----------------------------------------------------------------------------------

def _gguf(tensors: list[tuple[str, list[int], int]], *, version: int = 3,
          kv: list[tuple[str, int, bytes]] | None = None, pad_data: bool = True) -> bytes:
    def s(x: str) -> bytes:
        return struct.pack("<Q", len(x.encode())) + x.encode()
    out = b"GGUF" + struct.pack("<Iqq", version, len(tensors), len(kv or []))
    for key, vtype, value in kv or []:
        out += s(key) + struct.pack("<I", vtype) + value
    offset = 0
    sizes = []
    for name, shape, ttype in tensors:
        out += s(name) + struct.pack("<I", len(shape)) + b"".join(struct.pack("<q", d)
                                                                   for d in shape)
        out += struct.pack("<IQ", ttype, offset)
        n = 1
        for d in shape:
            n *= d
        nbytes = n * (4 if ttype == 0 else 2)
        sizes.append(nbytes)
        offset += -(-nbytes // 32) * 32
    out += b"\0" * (-len(out) % 32)
    return out + (b"\0" * offset if pad_data else b"")


def _parse_gguf(data: bytes) -> object:
    return parse_gguf(io.BytesIO(data), len(data))


def test_a_well_formed_gguf_parses() -> None:
    data = _gguf([("tok_embd.weight", [8, 4], 0), ("out.weight", [4], 1)],
                 kv=[("general.architecture", 8, struct.pack("<Q", 5) + b"llama")])
    assert _parse_gguf(data)
    f = io.BytesIO(data)
    assert parse_gguf(f, len(data)).tensors[1].name == "out.weight"


@pytest.mark.parametrize("data", [
    _gguf([("w", [8], 0)], version=1),
    _gguf([("w", [8], 0)], pad_data=False),
    _gguf([("w", [-8], 0)], pad_data=False),
    _gguf([("w", [2**40, 2**40], 0)], pad_data=False),
    _gguf([("w", [8], 99)]),
    _gguf([("w", [8], 0), ("w", [8], 0)]),
    _gguf([("w", [8, 1, 1, 1, 1], 0)]),
    b"GGUF" + struct.pack("<Iqq", 3, 2**40, 0),
    _gguf([], kv=[("a", 9, struct.pack("<IQ", 9, 1))]),  # nested array
    _gguf([], kv=[("general.alignment", 4, struct.pack("<I", 3))]),
], ids=["v1", "data_past_end", "negative_dim", "overflow", "bad_type", "duplicate",
        "five_dims", "count_past_file", "nested_array", "alignment"])
def test_hostile_gguf_headers_are_refused(data: bytes) -> None:
    with pytest.raises(MalformedGGUF):
        _parse_gguf(data)


def test_pickle_polyglot_samples_really_are_pickles(tmp_path: Path) -> None:
    """Guard for the samples above: the float swallows exactly the 8 header bytes."""
    for data in (safetensors_polyglot(tmp_path / "m"), gguf_polyglot(tmp_path / "m")):
        ops = [op.name for op, _a, _p in __import__("pickletools").genops(io.BytesIO(data))]
        assert ops[0] == "BINFLOAT" and "REDUCE" in ops
    assert zipfile.is_zipfile(io.BytesIO(S.torch_zip(b"")))
    assert pickle.HIGHEST_PROTOCOL >= 5
