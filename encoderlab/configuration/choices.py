"""Allowed values of the config fields that the command line offers as choices.

Plain tuples, without transformers, so that ``encoderlab ... --help`` lists them without loading torch; the configs
check their fields against these same tuples.
"""

ROPE_SCALING_TYPES = ("linear", "ntk", "yarn")
DTA_ATTENTION_TYPES = ("bidirectional", "causal", "dual_triangle")
DUAL_TRIANGLE_ROUTINGS = ("channel_halves", "head_groups")
