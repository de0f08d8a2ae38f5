"""Trainer callbacks of the pretraining pipeline."""

import logging
import math

from transformers import TrainerCallback

logger = logging.getLogger(__name__)


def drope_step(fraction: float, max_steps: int) -> int:
    """The optimizer step from which positions are off: `fraction` of a run of `max_steps` steps."""
    if not 0 < fraction < 1:
        raise ValueError(f"drope_fraction={fraction!r} must be in (0, 1), or None to keep positions")
    return math.ceil(fraction * max_steps)


class DroPECallback(TrainerCallback):
    """Switches the model's position signal off for good once `switch_step` optimizer steps are done (DroPE).

    The switch is the model's ``set_positions_enabled(False)``, which flips ``config.use_positions``: no weight
    changes, and the saved checkpoint keeps positions off. It is checked at the start of every step, so a run
    resumed past the switch step is switched off again before its first step, and every DDP rank switches at
    the same step.
    """

    def __init__(self, switch_step: int):
        if isinstance(switch_step, bool) or not isinstance(switch_step, int) or switch_step < 0:
            raise ValueError(f"switch_step={switch_step!r} must be an int >= 0")
        self.switch_step = switch_step
        self.switched_at_step = None

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        if state.global_step >= self.switch_step and model.config.use_positions:
            model.set_positions_enabled(False)
            self.switched_at_step = state.global_step
            logger.info("DroPE: positions switched off before step %d", state.global_step + 1)
