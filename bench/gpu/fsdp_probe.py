"""``encoderlab pretrain`` with one callback that writes, at the start of training, how the Trainer wrapped the
model: run under ``accelerate launch`` by check.py's FSDP2 section (a subprocess cannot be asked otherwise).

    accelerate launch --config_file CONFIG bench/gpu/fsdp_probe.py PROBE.json --config demo --set ... [--resume]
"""

import json
import sys

from transformers import TrainerCallback


class WrapperProbe(TrainerCallback):
    """Records the model's class, whether FSDP2 sharded it (`FSDPModule`), and the wrapper the Trainer trains."""

    def __init__(self, path):
        self.path = path

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        from torch.distributed.fsdp import FSDPModule

        if state.is_world_process_zero:
            sharded = [name for name, module in model.named_modules() if isinstance(module, FSDPModule)]
            record = {
                "model_class": type(model).__name__,
                "is_fsdp2": isinstance(model, FSDPModule),
                "fsdp2_units": len(sharded),
                "world_size": args.world_size,
            }
            with open(self.path, "w", encoding="utf-8") as handle:
                json.dump(record, handle)


def main(argv):
    from encoderlab.training.pretrain import load_run_config, pretrain

    probe_path, rest = argv[0], argv[1:]
    config = rest[rest.index("--config") + 1]
    sets = [rest[i + 1] for i, word in enumerate(rest) if word == "--set"]
    pretrain(load_run_config(config, sets), resume="--resume" in rest, callbacks=[WrapperProbe(probe_path)])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
