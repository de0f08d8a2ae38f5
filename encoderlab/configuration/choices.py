"""Allowed values of the config fields that the command line offers as choices.

Plain tuples, without transformers, so that ``encoderlab ... --help`` lists them without loading torch; the configs
check their fields against these same tuples.
"""

ROPE_SCALING_TYPES = ("linear", "ntk", "yarn")
DTA_ATTENTION_TYPES = ("bidirectional", "causal", "dual_triangle")
DUAL_TRIANGLE_ROUTINGS = ("channel_halves", "head_groups")


def check_choice(field, value, allowed):
    """The one check of a value against its allowed choices, for the configs and the run configs alike."""
    if value not in allowed:
        raise ValueError(f"{field}={value!r} is not supported; allowed values: {', '.join(map(repr, allowed))}")
