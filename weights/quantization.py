"""What a checkpoint's ``quantization_config`` says about the bytes of its weights.

vLLM loads a quantised checkpoint in the scheme its config.json names
(``quantization_config.quant_method``; vLLM ``model_executor/layers/quantization``), whatever
``torch_dtype`` says (``torch_dtype`` is the activation dtype: DeepSeek-V3 says ``bfloat16``
and stores FP8 weights). The linear layers' weights are stored at the scheme's width, plus
their scales; embeddings, the LM head and norms stay in the activation dtype.

Schemes read (bits per weight, from the named fields):

==================  ===============================================================
``fp8``             8 (``fmt``); block scales: one fp32 per ``weight_block_size``
``fbgemm_fp8``      8; per-channel scales (negligible)
``compressed-tensors``  ``config_groups.*.weights.num_bits`` (the widest group);
                    group scales 16 bits per ``group_size`` when strategy is group
``awq``             ``bits``/``w_bit``; fp16 scale and zero per ``group_size``/``q_group_size``
``gptq``            ``bits``; fp16 scale and packed zero per ``group_size``
``bitsandbytes``    4 (``load_in_4bit``, one fp32 absmax per 64) or 8 (``load_in_8bit``)
``mxfp4``           4 + one 8-bit scale per 32 (OCP MX)
``modelopt``        ``quant_algo`` FP8 -> 8, NVFP4 -> 4 + one fp8 scale per 16
==================  ===============================================================

An unknown ``quant_method`` is an error naming it (a guess would size it as BF16 again).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from weights.errors import SizingError

__all__ = ["Quantization", "kv_cache_scheme", "read_quantization"]


@dataclass(frozen=True)
class Quantization:
    """The weights' scheme as read from config.json.

    Attributes:
        method: ``quant_method`` as written.
        bits: Bits per quantised weight, scales included.
        source: The fields read (``config.json:quantization_config.quant_method=fp8, ...``).
    """

    method: str
    bits: float
    source: str


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) \
        else None


def _group_bits(group: Any, scale_bits: float) -> float:
    g = _num(group)
    return scale_bits / g if g and g > 0 else 0.0


def read_quantization(config: Mapping[str, Any]) -> Quantization | None:
    """Read ``quantization_config`` (also under a multimodal ``text_config``).

    Returns:
        The scheme, or None when the checkpoint is not quantised.

    Raises:
        SizingError: A ``quant_method`` this tool does not know, or one without its width.
    """
    q = config.get("quantization_config")
    where = "config.json:quantization_config"
    if not isinstance(q, dict):
        text = config.get("text_config")
        q = text.get("quantization_config") if isinstance(text, dict) else None
        where = "config.json:text_config.quantization_config"
    if not isinstance(q, dict):
        return None
    method = str(q.get("quant_method", "")).lower()
    src = [f"{where}.quant_method={method}"]
    bits: float | None
    if method in ("fp8", "fbgemm_fp8", "ptpc_fp8"):
        bits = 8.0
        block = q.get("weight_block_size")
        if isinstance(block, list) and len(block) == 2 and all(_num(b) for b in block):
            bits += 32 / (float(block[0]) * float(block[1]))
            src.append(f"weight_block_size={block}")
    elif method == "compressed-tensors":
        groups = q.get("config_groups") if isinstance(q.get("config_groups"), dict) else {}
        widths = []
        for name, g in (groups or {}).items():
            w = g.get("weights") if isinstance(g, dict) else None
            if isinstance(w, dict) and _num(w.get("num_bits")):
                extra = _group_bits(w.get("group_size"), 16) \
                    if w.get("strategy") in ("group", "tensor_group") else 0.0
                widths.append(float(w["num_bits"]) + extra)
                src.append(f"config_groups.{name}.weights.num_bits={w['num_bits']}"
                           + (f", group_size={w.get('group_size')}" if extra else ""))
        bits = max(widths) if widths else None
    elif method in ("awq", "gptq", "gptq_marlin", "awq_marlin", "marlin"):
        bits = _num(q.get("bits", q.get("w_bit")))
        group = q.get("group_size", q.get("q_group_size"))
        if bits is not None:
            bits += _group_bits(group, 16 + bits)  # an fp16 scale and a zero point per group
            src.append(f"bits={q.get('bits', q.get('w_bit'))}, group_size={group}")
    elif method == "bitsandbytes":
        if q.get("load_in_4bit"):
            bits = 4 + 32 / 64
            src.append("load_in_4bit=true")
        elif q.get("load_in_8bit"):
            bits = 8.0
            src.append("load_in_8bit=true")
        else:
            bits = None
    elif method == "mxfp4":
        bits = 4 + 8 / 32
    elif method == "modelopt":
        algo = str(q.get("quant_algo", "")).upper()
        bits = {"FP8": 8.0, "NVFP4": 4 + 8 / 16}.get(algo)
        src.append(f"quant_algo={algo}")
    else:
        raise SizingError(f"{where}.quant_method {method!r} is not a scheme this tool sizes",
                          hint="give --dtype with the width the weights are stored in")
    if bits is None:
        raise SizingError(f"{where} ({method}) does not say how many bits a weight takes",
                          hint="give --dtype with the width the weights are stored in")
    return Quantization(method=method, bits=bits, source=", ".join(src))


def kv_cache_scheme(config: Mapping[str, Any]) -> str | None:
    """The KV cache scheme a checkpoint declares, as ``"fp8 (config.json:...)"``, or None.

    compressed-tensors: ``quantization_config.kv_cache_scheme`` (``num_bits``, ``type``);
    modelopt: ``quantization_config.kv_cache_quant_algo``. vLLM uses the checkpoint's KV
    scales when started with ``--kv-cache-dtype fp8``; with ``auto`` the cache keeps the model
    dtype.
    """
    q = config.get("quantization_config")
    if not isinstance(q, dict):
        return None
    scheme = q.get("kv_cache_scheme")
    if isinstance(scheme, dict) and scheme.get("num_bits") == 8:
        kind = "fp8" if scheme.get("type") == "float" else "int8"
        return f"{kind} (config.json:quantization_config.kv_cache_scheme)"
    algo = q.get("kv_cache_quant_algo")
    if isinstance(algo, str) and algo:
        return f"{algo.lower()} (config.json:quantization_config.kv_cache_quant_algo)"
    return None
