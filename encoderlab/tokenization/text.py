"""Natural-language tokenizers trained with the Hugging Face `tokenizers` library.

Both builders return a `transformers.PreTrainedTokenizerFast` whose special tokens sit at the same
ids: ``[PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4``. Padding id 0 is what the DTA and DSTG
references use, and keeping the layout identical across tokenizers lets models and collators
rely on it. Sequences are wrapped BERT-style: ``[CLS] A [SEP]`` and ``[CLS] A [SEP] B [SEP]``.
"""

from collections.abc import Iterable

from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

TEXT_SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
"""Special tokens in id order; trainers place them first, so ``[PAD]`` gets id 0."""

DEFAULT_TEXT_MODEL_MAX_LENGTH = 1024
"""DTA trains at 256 tokens and evaluates long context at 1024 (4x), so 1024 must fit."""

# The encoders in this project take no segment embeddings, so the tokenizers do not emit
# `token_type_ids` (a model whose `forward` lacks that argument would reject them).
MODEL_INPUT_NAMES = ["input_ids", "attention_mask"]


def _check_vocab_size(vocab_size: int) -> None:
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size <= len(TEXT_SPECIAL_TOKENS):
        raise ValueError(
            f"vocab_size must be an int larger than the {len(TEXT_SPECIAL_TOKENS)} special tokens, got {vocab_size!r}."
        )


def _check_min_frequency(min_frequency: int) -> None:
    if isinstance(min_frequency, bool) or not isinstance(min_frequency, int) or min_frequency < 1:
        raise ValueError(f"min_frequency must be an int >= 1, got {min_frequency!r}.")


def _bert_style_post_processor() -> processors.TemplateProcessing:
    """``[CLS] A [SEP]`` for single texts, ``[CLS] A [SEP] B [SEP]`` for pairs (B gets type id 1)."""
    return processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", TEXT_SPECIAL_TOKENS.index("[CLS]")), ("[SEP]", TEXT_SPECIAL_TOKENS.index("[SEP]"))],
    )


def _wrap(backend: Tokenizer, model_max_length: int) -> PreTrainedTokenizerFast:
    """Wrap a trained backend so `transformers` knows its special tokens and maximum length."""
    pad, unk, cls, sep, mask = TEXT_SPECIAL_TOKENS
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=pad,
        unk_token=unk,
        cls_token=cls,
        sep_token=sep,
        mask_token=mask,
        model_max_length=model_max_length,
        model_input_names=MODEL_INPUT_NAMES,
    )


def _assert_special_ids(backend: Tokenizer) -> None:
    # The trainers put special tokens first; fail loudly if a `tokenizers` release ever changes that.
    for expected_id, token in enumerate(TEXT_SPECIAL_TOKENS):
        if backend.token_to_id(token) != expected_id:
            raise RuntimeError(f"{token} was assigned id {backend.token_to_id(token)}, expected {expected_id}.")


def train_bpe_tokenizer(
    texts: Iterable[str],
    vocab_size: int = 4096,
    min_frequency: int = 2,
    model_max_length: int = DEFAULT_TEXT_MODEL_MAX_LENGTH,
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer (the DTA paper's natural-language tokenizer, vocab 4096).

    Byte-level means every input byte is representable, so there are no unknown tokens and
    ``decode(encode(text))`` gives back the text exactly (spaces, newlines and non-ASCII included). ``[MASK]``
    takes the space before it (``lstrip``, as RoBERTa's mask does), so ``"a [MASK] of"`` masks the word after "a"
    with its leading space, as pretraining does, and a filled-in sentence keeps one space there.

    Args:
        texts: Training documents; any iterable, consumed once (streams are fine).
        vocab_size: Final vocabulary size, including the 5 special tokens and the 256 byte symbols.
        min_frequency: Minimum pair count for a merge to be learned.
        model_max_length: Longest sequence (special tokens included) the model accepts.

    Returns:
        A fast tokenizer with ``[PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4``.
    """
    _check_vocab_size(vocab_size)
    _check_min_frequency(min_frequency)
    backend = Tokenizer(models.BPE(unk_token="[UNK]"))
    # No prefix space: a document's first word is encoded as written, so decoding is lossless.
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(TEXT_SPECIAL_TOKENS),
        # Seed with all 256 byte symbols so bytes unseen in training still encode.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(texts, trainer=trainer)
    _assert_special_ids(backend)
    # The mask takes the space before it, as RoBERTa's does: "a [MASK] of" reads as "a", "[MASK]", " of", the way
    # pretraining masks a word's token (its leading space included), not as "a", " ", "[MASK]", " of".
    backend.add_special_tokens([AddedToken("[MASK]", special=True, lstrip=True, normalized=False)])
    # ByteLevel post-processing trims the leading-space byte from offsets; then add [CLS]/[SEP].
    backend.post_processor = processors.Sequence(
        [processors.ByteLevel(trim_offsets=True), _bert_style_post_processor()]
    )
    return _wrap(backend, model_max_length)


def train_wordpiece_tokenizer(
    texts: Iterable[str],
    vocab_size: int = 30522,
    lowercase: bool = True,
    min_frequency: int = 2,
    model_max_length: int = 512,
) -> PreTrainedTokenizerFast:
    """Train a BERT-style WordPiece tokenizer (uncased by default, like ``bert-base-uncased``).

    The DSTG paper uses the bert-base-uncased vocabulary (30522 entries); this trains an
    equivalent one offline. Unlike BERT's own vocabulary, ``[PAD]`` is id 0 and the other
    special tokens follow it directly (``[UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4``).

    Args:
        texts: Training documents; any iterable, consumed once.
        vocab_size: Final vocabulary size including special tokens.
        lowercase: Lowercase and strip accents (uncased BERT) before splitting.
        min_frequency: Minimum count for a sub-word to enter the vocabulary.
        model_max_length: Longest sequence (special tokens included) the model accepts.
    """
    _check_vocab_size(vocab_size)
    _check_min_frequency(min_frequency)
    backend = Tokenizer(models.WordPiece(unk_token="[UNK]", continuing_subword_prefix="##"))
    backend.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, lowercase=lowercase)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.decoder = decoders.WordPiece(prefix="##")
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(TEXT_SPECIAL_TOKENS),
        continuing_subword_prefix="##",
        show_progress=False,
    )
    backend.train_from_iterator(texts, trainer=trainer)
    _assert_special_ids(backend)
    backend.post_processor = _bert_style_post_processor()
    return _wrap(backend, model_max_length)
