"""The pair template of separately encoded pairs (``classifier_pair_encoding="separate"``): each text of a pair
written with the tokenizer's single-text template, ``[CLS] a [SEP] [CLS] b [SEP]``, so that the second text, once the
model cuts the pair after its first separator, is exactly what the tokenizer gives for it alone. The usual pair
template (``[CLS] a [SEP] b [SEP]``) leaves the second text without its ``[CLS]``; an encoder without positions, such
as DTA-BERT, reads a text's start from that token."""

import json

from tokenizers import Tokenizer


def single_text_template(post_processor: dict) -> dict | None:
    """The TemplateProcessing state inside a post-processor state (alone or in a Sequence), or None."""
    if post_processor is None:
        return None
    if post_processor.get("type") == "TemplateProcessing":
        return post_processor
    for inner in post_processor.get("processors", []) if post_processor.get("type") == "Sequence" else []:
        found = single_text_template(inner)
        if found is not None:
            return found
    return None


def as_second_text(piece: dict) -> dict:
    """A piece of the single-text template, moved to the pair's second text (sequence B, type id 1)."""
    if "Sequence" in piece:
        return {"Sequence": {"id": "B", "type_id": 1}}
    return {"SpecialToken": {**piece["SpecialToken"], "type_id": 1}}


def with_separate_pair_template(tokenizer):
    """`tokenizer` (a fast tokenizer, changed in place and returned) writing a pair as its two texts' single-text
    templates one after the other; texts alone are written as before. A tokenizer whose post-processor has no
    TemplateProcessing cannot be rewritten and is a ValueError."""
    state = json.loads(tokenizer.backend_tokenizer.to_str())
    template = single_text_template(state.get("post_processor"))
    if template is None:
        kind = (state.get("post_processor") or {}).get("type")
        raise ValueError(
            f"classifier_pair_encoding='separate' writes each text of a pair with the tokenizer's "
            f"single-text template, but its post-processor is {kind!r}; allowed: a TemplateProcessing "
            "(encoderlab's tokenizers have one)"
        )
    template["pair"] = [*template["single"], *(as_second_text(piece) for piece in template["single"])]
    tokenizer.backend_tokenizer.post_processor = Tokenizer.from_str(json.dumps(state)).post_processor
    return tokenizer
