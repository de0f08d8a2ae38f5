"""Fixed-vocabulary protein tokenizers: one token per residue character.

Both are built in code (nothing to download) on a `tokenizers` WordLevel model, so they are fast
tokenizers that save and reload with `save_pretrained` / `AutoTokenizer.from_pretrained`.
Lowercase residue letters are read as uppercase; any character outside the vocabulary becomes the
unknown token. Special-token strings written in the input (e.g. ``<mask>``) are recognised as
those tokens, which is how masked sequences are written for inference.
"""

import string

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from .text import MODEL_INPUT_NAMES

ESM2_VOCAB = (
    "<cls>", "<pad>", "<eos>", "<unk>",
    "L", "A", "G", "V", "S", "E", "R", "T", "I", "D", "P", "K", "Q", "N", "F", "Y", "M", "H", "W", "C",
    "X", "B", "U", "Z", "O", ".", "-",
    "<null_1>", "<mask>",
)  # fmt: skip
"""The 33 tokens of ESM-2 in id order (ids 0..32), as in the released ESM-2 checkpoints."""

TAPE_IUPAC_VOCAB = ("<pad>", "<mask>", "<cls>", "<sep>", "<unk>", *(c for c in string.ascii_uppercase if c != "J"))
"""TAPE's 30-token IUPAC vocabulary: 5 specials, then the 25 letters A..Z without J (ids 5..29)."""

# Any single character, newlines included, so every input character maps to exactly one piece.
_ONE_CHARACTER = Regex(r"[\s\S]")


def _uppercase_normalizer() -> normalizers.Sequence:
    # `tokenizers` has a Lowercase normalizer but no Uppercase one; 26 replacements do the job.
    return normalizers.Sequence([normalizers.Replace(c, c.upper()) for c in string.ascii_lowercase])


def _residue_backend(
    vocab: tuple[str, ...], special_tokens: list[str], unk_token: str, drop_whitespace: bool
) -> Tokenizer:
    """A WordLevel tokenizer that emits one token per (non-special) input character."""
    backend = Tokenizer(models.WordLevel({token: i for i, token in enumerate(vocab)}, unk_token=unk_token))
    backend.normalizer = _uppercase_normalizer()
    split_characters = pre_tokenizers.Split(_ONE_CHARACTER, behavior="isolated")
    backend.pre_tokenizer = (
        pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), split_characters])
        if drop_whitespace
        else split_characters
    )
    # Residues concatenate back without separators: decode(encode("MKT")) == "MKT".
    backend.decoder = decoders.Fuse()
    # Registered as special tokens: never normalised or split, skipped by `skip_special_tokens`.
    backend.add_special_tokens(special_tokens)
    return backend


def _wrapping_template(vocab: tuple[str, ...], start: str, end: str) -> processors.TemplateProcessing:
    """``start A end`` for single sequences, ``start A end B end`` for pairs."""
    return processors.TemplateProcessing(
        single=f"{start} $A {end}",
        pair=f"{start} $A {end} $B:1 {end}:1",
        special_tokens=[(start, vocab.index(start)), (end, vocab.index(end))],
    )


def esm2_tokenizer(model_max_length: int = 1024) -> PreTrainedTokenizerFast:
    """The ESM-2 protein tokenizer (33 tokens), built in code.

    Sequences are wrapped as ``<cls> seq <eos>``. Whitespace is dropped, as ESM's own tokenizer
    does. ``<eos>`` doubles as ``sep_token`` so code that asks for a separator works unchanged
    (ESM-2 has no separate one); ``<null_1>`` is registered as an extra special token so it is
    never masked or sampled as a random replacement.

    Args:
        model_max_length: Longest sequence (special tokens included) the model accepts.
    """
    specials = ["<cls>", "<pad>", "<eos>", "<unk>", "<null_1>", "<mask>"]
    backend = _residue_backend(ESM2_VOCAB, specials, unk_token="<unk>", drop_whitespace=True)
    backend.post_processor = _wrapping_template(ESM2_VOCAB, "<cls>", "<eos>")
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        cls_token="<cls>",
        pad_token="<pad>",
        eos_token="<eos>",
        sep_token="<eos>",
        unk_token="<unk>",
        mask_token="<mask>",
        extra_special_tokens=["<null_1>"],
        model_max_length=model_max_length,
        model_input_names=MODEL_INPUT_NAMES,
    )


def tape_iupac_tokenizer(model_max_length: int = 512) -> PreTrainedTokenizerFast:
    """TAPE's IUPAC protein tokenizer (30 tokens, ``<pad>=0``), built in code.

    Sequences are wrapped as ``<cls> seq <sep>``. Every input character, whitespace included,
    becomes exactly one token (unknown ones ``<unk>``), so with ``add_special_tokens=False``
    token ``i`` is residue ``i`` and per-residue labels (secondary structure) stay aligned with
    the ids. The only exception is a special-token string such as ``<mask>`` typed in the input,
    which is read as that one token.

    Args:
        model_max_length: Longest sequence (special tokens included); 512 in the HOMA paper.
    """
    specials = ["<pad>", "<mask>", "<cls>", "<sep>", "<unk>"]
    backend = _residue_backend(TAPE_IUPAC_VOCAB, specials, unk_token="<unk>", drop_whitespace=False)
    backend.post_processor = _wrapping_template(TAPE_IUPAC_VOCAB, "<cls>", "<sep>")
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        mask_token="<mask>",
        cls_token="<cls>",
        sep_token="<sep>",
        unk_token="<unk>",
        model_max_length=model_max_length,
        model_input_names=MODEL_INPUT_NAMES,
    )
