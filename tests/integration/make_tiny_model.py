"""Create a tiny random-weight Llama model that a real vLLM can serve on CPU.

Run with the Python of the vLLM virtualenv (it needs ``torch``, ``transformers`` and
``tokenizers``)::

    .tools/vllm-venv/bin/python tests/integration/make_tiny_model.py .cache/tiny-llama

The model is NOT meaningful: 2 layers, hidden size 128, 2 attention heads (head_dim 64, the
minimum vLLM's CPU attention supports), random weights, and a byte-level BPE tokenizer trained
on a few sentences that include multi-byte UTF-8 ("café", "日本語", emoji) so that vLLM's
incremental detokenizer produces multi-byte characters. The tokenizer carries a chat template so
``/v1/chat/completions`` works. Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

CORPUS = [
    "Hello, this is a tiny test model for the sovereign gateway.",
    "Le café est très bon, naïve über alles.",
    "日本語のテキストも少し含まれています。",
    "Emoji: 🚀 ✓ 🎉 and more text to learn merges from.",
    "The quick brown fox jumps over the lazy dog 0123456789.",
]

SPECIAL = ["<unk>", "<s>", "</s>", "<|user|>", "<|assistant|>", "<|system|>"]


def build_tokenizer(out: Path) -> int:
    """Train and save a byte-level BPE tokenizer; returns its vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))  # noqa: S106 - a token, not a password
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS, trainer)
    specials = {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>",
                "pad_token": "</s>"}
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, **specials)
    fast.chat_template = CHAT_TEMPLATE
    fast.model_max_length = 2048
    fast.save_pretrained(out)
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["chat_template"] = CHAT_TEMPLATE
    cfg_path.write_text(json.dumps(cfg, indent=2))
    return int(tok.get_vocab_size())


def build_model(out: Path, vocab_size: int, eos_id: int, bos_id: int) -> None:
    """Save a random 2-layer Llama with ``vocab_size`` embeddings (float32 safetensors)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(out, safe_serialization=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="output directory")
    args = parser.parse_args(argv)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    vocab = build_tokenizer(out)
    build_model(out, vocab, eos_id=SPECIAL.index("</s>"), bos_id=SPECIAL.index("<s>"))
    print(f"tiny model written to {out} (vocab {vocab})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
