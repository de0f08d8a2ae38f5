"""Masked-language-model masking and batch collation.

`mask_tokens` is the masking rule as a pure tensor function: it runs on whatever device its
inputs live on, so a training loop can mask on the GPU. `MLMCollator` pads examples into a batch
and either masks them right away (on CPU, in the data loader) or leaves masking to the loop.

BERT / DTA masking is ``mlm_probability=0.15, mask_replace_prob=0.8, random_replace_prob=0.1``
(the default); NeoBERT / DSTG masking is ``mlm_probability=0.2, mask_replace_prob=1.0,
random_replace_prob=0.0``.
"""

import hashlib
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase
from transformers.data.data_collator import DataCollatorForLanguageModeling

from ..modeling.heads import IGNORE_INDEX


def _check_probabilities(mlm_probability: float, mask_replace_prob: float, random_replace_prob: float) -> None:
    if not 0 < mlm_probability < 1:
        raise ValueError(f"mlm_probability must be in (0, 1), got {mlm_probability!r}.")
    for name, value in (("mask_replace_prob", mask_replace_prob), ("random_replace_prob", random_replace_prob)):
        if not 0 <= value <= 1:
            raise ValueError(f"{name} must be in [0, 1], got {value!r}.")
    # A small tolerance so that e.g. 0.8 + 0.2 is accepted despite floating-point rounding.
    if mask_replace_prob + random_replace_prob > 1 + 1e-9:
        raise ValueError(
            f"mask_replace_prob + random_replace_prob must be <= 1 (the rest of the selected tokens is kept), "
            f"got {mask_replace_prob} + {random_replace_prob} = {mask_replace_prob + random_replace_prob}."
        )


def _check_generator_device(generator: torch.Generator | None, device: torch.device) -> None:
    if generator is None:
        return
    gen_device = generator.device
    same_index = gen_device.index is None or device.index is None or gen_device.index == device.index
    if gen_device.type != device.type or not same_index:
        raise ValueError(
            f"generator is on {gen_device} but input_ids is on {device}; create the generator with "
            f"torch.Generator(device=input_ids.device)."
        )


def _random_non_special_ids(
    shape: torch.Size,
    vocab_size: int,
    special_token_ids: Iterable[int],
    generator: torch.Generator | None,
    device: torch.device,
) -> torch.Tensor:
    """Token ids drawn uniformly from the vocabulary minus the special tokens."""
    special = sorted(set(special_token_ids))  # checked on the host: no device sync per batch
    if special and (special[0] < 0 or special[-1] >= vocab_size):
        raise ValueError(f"special_token_ids must lie in [0, vocab_size={vocab_size}), got {special}.")
    if len(special) == vocab_size:
        raise ValueError("Every id is a special token, so there is no token to use as a random replacement.")
    # Draw a rank r among the non-special ids, then map it to the r-th non-special id: that is r
    # plus the number of special ids s_i (sorted) with s_i - i <= r, s_i - i being the count of
    # non-special ids below s_i. This avoids materialising (and syncing on) a candidate table.
    ranks = torch.randint(vocab_size - len(special), shape, generator=generator, device=device)
    non_special_below = torch.tensor([s - i for i, s in enumerate(special)], dtype=torch.long, device=device)
    return ranks + torch.searchsorted(non_special_below, ranks, right=True)


def mask_tokens(
    input_ids: torch.Tensor,
    maskable: torch.Tensor,
    *,
    mask_token_id: int,
    vocab_size: int,
    special_token_ids: Iterable[int],
    mlm_probability: float = 0.15,
    mask_replace_prob: float = 0.8,
    random_replace_prob: float = 0.1,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Select tokens for masked-language modelling and corrupt them.

    Each maskable token is selected with probability `mlm_probability`. A selected token is
    replaced by `mask_token_id` with probability `mask_replace_prob`, by a random non-special
    token with probability `random_replace_prob`, and kept otherwise. Nothing is modified in place.

    Args:
        input_ids: Integer token ids of any shape, on any device.
        maskable: Bool tensor of the same shape; False at special and padding tokens, which are
            never selected.
        mask_token_id: Id written at masked positions.
        vocab_size: Number of token ids (``len(tokenizer)``).
        special_token_ids: Ids never used as random replacements.
        mlm_probability: Selection probability, in (0, 1).
        mask_replace_prob: Share of selected tokens replaced by the mask token, in [0, 1].
        random_replace_prob: Share replaced by a random token, in [0, 1]; the two sum to <= 1.
        generator: Random generator on the device of `input_ids`; None uses torch's global one.

    Returns:
        ``(masked_input_ids, labels)``: labels hold the original id at selected positions and
        -100 elsewhere.
    """
    _check_probabilities(mlm_probability, mask_replace_prob, random_replace_prob)
    if input_ids.dtype.is_floating_point or input_ids.dtype == torch.bool:
        raise ValueError(f"input_ids must hold integer token ids, got dtype {input_ids.dtype}.")
    if maskable.dtype != torch.bool or maskable.shape != input_ids.shape or maskable.device != input_ids.device:
        raise ValueError(
            f"maskable must be a bool tensor shaped and placed like input_ids {tuple(input_ids.shape)} on "
            f"{input_ids.device}, got dtype {maskable.dtype}, shape {tuple(maskable.shape)} on {maskable.device}."
        )
    if not 0 <= mask_token_id < vocab_size:
        raise ValueError(f"mask_token_id must lie in [0, vocab_size={vocab_size}), got {mask_token_id!r}.")
    device = input_ids.device
    _check_generator_device(generator, device)

    selected = maskable & (torch.rand(input_ids.shape, generator=generator, device=device) < mlm_probability)
    labels = input_ids.masked_fill(~selected, IGNORE_INDEX)
    # One uniform draw per position picks its fate, so the three outcomes are exactly exclusive:
    # [0, p_mask) -> mask token, [p_mask, p_mask + p_random) -> random token, the rest kept.
    fate = torch.rand(input_ids.shape, generator=generator, device=device)
    masked_input_ids = input_ids.masked_fill(selected & (fate < mask_replace_prob), mask_token_id)
    if random_replace_prob > 0:
        random_ids = _random_non_special_ids(input_ids.shape, vocab_size, special_token_ids, generator, device)
        to_random = selected & (fate >= mask_replace_prob) & (fate < mask_replace_prob + random_replace_prob)
        masked_input_ids = torch.where(to_random, random_ids.to(input_ids.dtype), masked_input_ids)
    return masked_input_ids, labels


def special_token_ids_of(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """All ids a tokenizer treats as special: its named ones plus special added tokens.

    The second part catches tokens such as ESM-2's ``<null_1>`` that a tokenizer may register
    as special in its backend without naming them in `all_special_ids`.
    """
    ids = set(tokenizer.all_special_ids)
    ids.update(index for index, token in tokenizer.added_tokens_decoder.items() if token.special)
    return sorted(ids)


def _example_seed(seed: int, ids: torch.Tensor) -> int:
    """A generator seed from the collator seed and an example's tokens (independent of batching)."""
    digest = hashlib.blake2b(ids.to(torch.int64).numpy().tobytes(), digest_size=8, key=str(seed).encode())
    return int.from_bytes(digest.digest(), "big") >> 1  # manual_seed takes values below 2**63


class MLMCollator(DataCollatorForLanguageModeling):
    """Pads examples into a batch and applies MLM masking; usable as a HF Trainer `data_collator`.

    Each example is a mapping with ``"input_ids"`` (list, tensor or array; other keys are ignored)
    or the ids themselves, already including special tokens (see `tokenize_to_examples`).
    Batches are padded to the longest example (rounded up to `pad_to_multiple_of`) on the
    tokenizer's ``padding_side``.

    Returned batch (torch tensors):

    - default: ``input_ids`` (masked), ``attention_mask``, ``labels`` (-100 where not masked);
    - ``mask_on_device=True``: ``input_ids`` (unmasked), ``attention_mask`` and
      ``special_tokens_mask`` (bool, True at special and padding tokens). Move it to the GPU and
      call `mask_batch` there (or `mask_tokens` with ``maskable=~special_tokens_mask``), which
      takes masking off the data-loader CPUs.

    With `seed` set, masks are fixed: each example's mask is drawn from a generator seeded by
    `seed` and the example's tokens, so every evaluation pass masks the same positions, whatever
    the batch composition, padding or worker. Use it for evaluation collators; for training leave
    it None so masks are redrawn every epoch from torch's (seedable) global generator.

    Built on transformers' `DataCollatorForLanguageModeling`: its fields, argument checks and call
    protocol (``collator(examples)`` -> `torch_call` -> `torch_mask_tokens`) are the parent's. Three
    parts are ours and override it, because the parent's do something else:

    - The masking rule (`torch_mask_tokens`, i.e. `mask_tokens`): random replacements are drawn
      from the non-special ids (the parent draws from the whole vocabulary, so [PAD], [CLS], [MASK]
      or ESM-2's ``<null_1>`` land inside sequences), on the device of the inputs, from a generator
      the caller passes (the trainer seeds one per step, so a resumed run masks as the uninterrupted
      one did). The parent draws on the CPU from one generator held by the collator.
    - Fixed masks (`seed`, above). The parent's `seed` seeds that one generator at the first call,
      so its masks change from one evaluation pass to the next and with the batch composition.
    - Padding: one tensor fill that also gives the special-token mask. The parent's
      ``tokenizer.pad`` took 4-5x as long on a 256 x 512 batch, and gives no attention mask when
      the examples are plain id lists.

    Args:
        tokenizer: Provides the pad and mask tokens, special ids, vocabulary size, padding side.
        mlm_probability, mask_replace_prob, random_replace_prob: See `mask_tokens`.
        pad_to_multiple_of: Round the padded length up to a multiple of this (e.g. 8 for tensor cores).
        mask_on_device: Return unmasked batches for masking in the training loop.
        seed: Fixed masks (see above). Not combinable with `mask_on_device`; seed the generator
            passed to `mask_batch` instead.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        mlm_probability: float = 0.15,
        mask_replace_prob: float = 0.8,
        random_replace_prob: float = 0.1,
        pad_to_multiple_of: int | None = None,
        mask_on_device: bool = False,
        seed: int | None = None,
    ) -> None:
        for name in ("pad_token_id", "mask_token_id"):
            if getattr(tokenizer, name) is None:
                raise ValueError(f"The tokenizer has no {name.removesuffix('_id')}; MLM collation needs one.")
        _check_probabilities(mlm_probability, mask_replace_prob, random_replace_prob)
        if pad_to_multiple_of is not None and (
            isinstance(pad_to_multiple_of, bool) or not isinstance(pad_to_multiple_of, int) or pad_to_multiple_of < 1
        ):
            raise ValueError(f"pad_to_multiple_of must be None or an int >= 1, got {pad_to_multiple_of!r}.")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ValueError(f"seed must be None or an int, got {seed!r}.")
        if seed is not None and mask_on_device:
            raise ValueError(
                "seed fixes masks drawn by the collator, but mask_on_device=True leaves masking to the training "
                "loop; pass a seeded generator to mask_batch instead."
            )
        super().__init__(
            tokenizer=tokenizer,
            mlm=True,
            mlm_probability=mlm_probability,
            mask_replace_prob=mask_replace_prob,
            random_replace_prob=random_replace_prob,
            pad_to_multiple_of=pad_to_multiple_of,
            return_tensors="pt",
            seed=seed,
        )
        self.mask_on_device = mask_on_device
        self.special_token_ids = special_token_ids_of(tokenizer)
        self.vocab_size = len(tokenizer)
        self._special_ids_tensor = torch.tensor(self.special_token_ids, dtype=torch.long)

    def torch_call(
        self, examples: Sequence[Mapping[str, Any] | Sequence[int] | torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        """Collate `examples` into a padded (and, unless ``mask_on_device``, masked) batch."""
        if len(examples) == 0:
            raise ValueError("Cannot collate an empty list of examples.")
        sequences = [self._as_ids(example) for example in examples]
        input_ids, attention_mask = self._pad(sequences)
        special_tokens_mask = torch.isin(input_ids, self._special_ids_tensor) | (attention_mask == 0)
        if self.mask_on_device:
            return {
                "input_ids": input_ids,
                "attention_mask": attention_mask,
                "special_tokens_mask": special_tokens_mask,
            }
        if self.seed is None:
            masked, labels = self.torch_mask_tokens(input_ids, special_tokens_mask)
        else:
            masked, labels = self._mask_per_example(input_ids, special_tokens_mask, attention_mask)
        return {"input_ids": masked, "attention_mask": attention_mask, "labels": labels}

    def numpy_call(self, examples):
        raise ValueError("MLMCollator returns torch tensors only (return_tensors='pt'), got return_tensors='np'.")

    def torch_mask_tokens(
        self,
        inputs: torch.Tensor,
        special_tokens_mask: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(masked_input_ids, labels)`` by our rule, `mask_tokens`, on the device of `inputs`.

        `special_tokens_mask` is True where a token must never be selected (by default at the
        tokenizer's special ids, padding included); `generator` lives on that device, None uses
        torch's global generator.
        """
        if special_tokens_mask is None:
            special_tokens_mask = torch.isin(inputs, self._special_ids_tensor.to(inputs.device))
        return mask_tokens(
            inputs,
            ~special_tokens_mask.bool(),
            mask_token_id=self.tokenizer.mask_token_id,
            vocab_size=self.vocab_size,
            special_token_ids=self.special_token_ids,
            mlm_probability=self.mlm_probability,
            mask_replace_prob=self.mask_replace_prob,
            random_replace_prob=self.random_replace_prob,
            generator=generator,
        )

    def mask_batch(
        self, batch: Mapping[str, torch.Tensor], generator: torch.Generator | None = None
    ) -> dict[str, torch.Tensor]:
        """Mask a ``mask_on_device=True`` batch where its tensors are (e.g. after ``.to("cuda")``).

        Returns the batch without ``special_tokens_mask``, with masked ``input_ids`` and ``labels``.
        """
        if "special_tokens_mask" not in batch:
            raise ValueError(
                "mask_batch expects a batch from a collator with mask_on_device=True (no special_tokens_mask)."
            )
        masked, labels = self.torch_mask_tokens(batch["input_ids"], batch["special_tokens_mask"], generator)
        rest = {key: value for key, value in batch.items() if key != "special_tokens_mask"}
        return {**rest, "input_ids": masked, "labels": labels}

    def _mask_per_example(
        self, input_ids: torch.Tensor, special_tokens_mask: torch.Tensor, attention_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Fixed masks: each example masked over its real tokens with its own seeded generator."""
        masked = input_ids.clone()
        labels = torch.full_like(input_ids, IGNORE_INDEX)
        generator = torch.Generator()
        for row in range(input_ids.shape[0]):
            real = attention_mask[row].bool()
            generator.manual_seed(_example_seed(self.seed, input_ids[row, real]))
            masked[row, real], labels[row, real] = self.torch_mask_tokens(
                input_ids[row, real], special_tokens_mask[row, real], generator
            )
        return masked, labels

    @staticmethod
    def _as_ids(example: Mapping[str, Any] | Sequence[int] | torch.Tensor) -> torch.Tensor:
        ids = example["input_ids"] if isinstance(example, Mapping) else example
        ids = torch.as_tensor(ids, dtype=torch.long)
        if ids.dim() != 1:
            raise ValueError(f"Each example's input_ids must be one-dimensional, got shape {tuple(ids.shape)}.")
        return ids

    def _pad(self, sequences: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        side = self.tokenizer.padding_side
        if side not in ("right", "left"):
            raise ValueError(f"tokenizer.padding_side must be 'right' or 'left', got {side!r}.")
        length = max(len(ids) for ids in sequences)
        if self.pad_to_multiple_of is not None:
            length = math.ceil(length / self.pad_to_multiple_of) * self.pad_to_multiple_of
        input_ids = torch.full((len(sequences), length), self.tokenizer.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(sequences), length), dtype=torch.long)
        for row, ids in enumerate(sequences):
            columns = slice(0, len(ids)) if side == "right" else slice(length - len(ids), length)
            input_ids[row, columns] = ids
            attention_mask[row, columns] = 1
        return input_ids, attention_mask
