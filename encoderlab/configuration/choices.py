"""Allowed values of the config fields that the command line offers as choices.

Plain tuples, without transformers, so that ``encoderlab ... --help`` lists them without loading torch; the configs
check their fields against these same tuples.
"""

ATTENTION_IMPLEMENTATIONS = ("eager", "sdpa", "flex_attention", "varlen")  # varlen: CUDA only
ROPE_SCALING_TYPES = ("linear", "ntk", "yarn")
DTA_ATTENTION_TYPES = ("bidirectional", "causal", "dual_triangle")
DUAL_TRIANGLE_ROUTINGS = ("channel_halves", "head_groups")
PAIR_ENCODINGS = ("joint", "separate")


def check_choice(field, value, allowed):
    """The one check of a value against its allowed choices, for the configs and the run configs alike."""
    if value not in allowed:
        raise ValueError(f"{field}={value!r} is not supported; allowed values: {', '.join(map(repr, allowed))}")


def pair_encoding(config, changes=None) -> str:
    """How a sequence head reads a text pair (``classifier_pair_encoding``, one of `PAIR_ENCODINGS`): the value in
    `changes` (a fine-tuning run's ``model.config`` edits) if it holds one, else the config's (a config object or
    the dict of a saved config.json), else "joint", which configs from before the field existed mean. The one place
    that decides it: the heads, the fine-tuning set-up and the model card ask here."""
    if changes and "classifier_pair_encoding" in changes:
        return changes["classifier_pair_encoding"]
    saved = (
        config.get("classifier_pair_encoding")
        if isinstance(config, dict)
        else getattr(config, "classifier_pair_encoding", None)
    )
    return saved or "joint"
