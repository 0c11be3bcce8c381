"""Create a tiny random-weight Llama as a GGUF file that llama.cpp's server can load on CPU.

Run with the Python of the llama.cpp virtualenv (it needs ``gguf`` and ``numpy``)::

    .cache/llamacpp-venv/bin/python tests/integration/make_tiny_gguf.py .cache/tiny-llama.gguf

The model has the shape of ``make_tiny_model.py``'s (Llama, 2 layers, hidden size 128, 2
attention heads, FFN 256, float32, random weights, seed 0) and is written directly with the
``gguf`` package's ``GGUFWriter`` instead of being converted from safetensors (that conversion
needs ``torch``/``transformers`` and llama.cpp's own convert script). The tokenizer is a
SentencePiece-style vocabulary (``tokenizer.ggml.model = llama``) of the special tokens, the 256
byte-fallback tokens ``<0x00>``..``<0xFF>`` and a few word pieces, so any UTF-8 text tokenizes;
the chat template is ``make_tiny_model.py``'s. Nothing is downloaded.

GGUF format: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md (tensor shapes are
written in numpy order, the reverse of ggml's ``ne``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
HIDDEN, FFN, LAYERS, HEADS, CONTEXT = 128, 256, 2, 2, 2048
SPECIAL = ["<unk>", "<s>", "</s>"]
WORDS = ["▁", "▁the", "▁a", "▁is", "▁hello", "▁model", "▁tiny", "▁test", "e", "t", "a", "o",
         "n", "s", "r", "l", ".", ",", "!", "?", "▁café", "▁日本語"]


def vocabulary() -> tuple[list[str], list[float], list[int]]:
    """(tokens, scores, token types) of the tiny SentencePiece-style vocabulary."""
    from gguf import TokenType

    tokens = list(SPECIAL)
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [TokenType.BYTE] * 256
    tokens += WORDS
    types += [TokenType.NORMAL] * len(WORDS)
    # SentencePiece scores: higher merges first; longer pieces score higher here
    scores = [0.0] * (len(SPECIAL) + 256) + [float(len(w)) - 100.0 for w in WORDS]
    return tokens, scores, [int(t) for t in types]


def write(path: Path) -> int:
    """Write the GGUF file; returns its vocabulary size."""
    import numpy as np
    from gguf import GGUFWriter, LlamaFileType

    tokens, scores, types = vocabulary()
    vocab = len(tokens)
    rng = np.random.default_rng(0)

    def w(*shape: int) -> np.ndarray:
        return rng.normal(0.0, 0.02, size=shape).astype(np.float32)

    out = GGUFWriter(str(path), "llama")
    out.add_name("sg-tiny-llama")
    out.add_context_length(CONTEXT)
    out.add_embedding_length(HIDDEN)
    out.add_block_count(LAYERS)
    out.add_feed_forward_length(FFN)
    out.add_head_count(HEADS)
    out.add_head_count_kv(HEADS)
    out.add_rope_dimension_count(HIDDEN // HEADS)
    out.add_layer_norm_rms_eps(1e-5)
    out.add_file_type(LlamaFileType.ALL_F32)
    out.add_tokenizer_model("llama")
    out.add_token_list(tokens)
    out.add_token_scores(scores)
    out.add_token_types(types)
    out.add_unk_token_id(0)
    out.add_bos_token_id(1)
    out.add_eos_token_id(2)
    out.add_add_bos_token(True)
    out.add_add_eos_token(False)
    out.add_chat_template(CHAT_TEMPLATE)

    ones = np.ones(HIDDEN, dtype=np.float32)
    out.add_tensor("token_embd.weight", w(vocab, HIDDEN))
    for i in range(LAYERS):
        out.add_tensor(f"blk.{i}.attn_norm.weight", ones)
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            out.add_tensor(f"blk.{i}.{name}.weight", w(HIDDEN, HIDDEN))
        out.add_tensor(f"blk.{i}.ffn_norm.weight", ones)
        out.add_tensor(f"blk.{i}.ffn_gate.weight", w(FFN, HIDDEN))
        out.add_tensor(f"blk.{i}.ffn_up.weight", w(FFN, HIDDEN))
        out.add_tensor(f"blk.{i}.ffn_down.weight", w(HIDDEN, FFN))
    out.add_tensor("output_norm.weight", ones)
    out.add_tensor("output.weight", w(vocab, HIDDEN))

    path.parent.mkdir(parents=True, exist_ok=True)
    out.write_header_to_file()
    out.write_kv_data_to_file()
    out.write_tensors_to_file()
    out.close()
    return vocab


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("out", type=Path, help="output .gguf file")
    args = parser.parse_args(argv)
    tmp = args.out.with_suffix(".gguf.tmp")
    vocab = write(tmp)
    tmp.replace(args.out)  # nothing half-written under the final name
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes, vocabulary {vocab})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
