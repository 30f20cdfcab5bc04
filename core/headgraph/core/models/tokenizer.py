"""Tokenizers for checkpoints: does a folder ship one, and an offline byte-level fallback.

Random-weight models and checkpoints without tokenizer files still need one to run prompts
(TransformerBridge, attention patterns); ``byte_level_tokenizer`` builds it in memory, with no
download, from the 256 byte symbols of GPT-2's byte-level alphabet.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# Any one of these in a checkpoint folder means it ships its own tokenizer.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "vocab.txt",
                   "tokenizer.model", "spiece.model", "sentencepiece.bpe.model")


def byte_level_tokenizer() -> Any:
    """An offline GPT-2-style byte-level tokenizer with no merges: 256 bytes + <|endoftext|>.

    For random-weight models and checkpoints that ship no tokenizer (ids 0..256); it
    prepends <|endoftext|> (id 256) as BOS.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab["<|endoftext|>"] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    special = "<|endoftext|>"
    # add_bos_token / name_or_path: TransformerLens's tokenizer setup reads both.
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=special, eos_token=special,
                                   unk_token=special, pad_token=special, add_bos_token=True,
                                   name_or_path="headgraph/byte-level")


def has_tokenizer(folder: Path) -> bool:
    """True when ``folder`` holds any tokenizer file (``TOKENIZER_FILES``)."""
    return any((folder / f).is_file() for f in TOKENIZER_FILES)

