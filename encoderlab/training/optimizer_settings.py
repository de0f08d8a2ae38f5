"""The optimizer section of a run config (``optimizer``): plain values, without torch, so that the command line
checks a run config before torch loads; `encoderlab.training.optim.build_optimizer` turns them into an optimizer."""

from dataclasses import dataclass

OPTIMIZERS = ("adamw", "muon")
SCHEDULES = ("wsd", "cosine")


@dataclass(frozen=True)
class OptimizerSettings:
    """Hyper-parameters of `build_optimizer` (defaults: the DTA paper)."""

    name: str = "muon"
    lr: float = 1e-3
    """AdamW learning rate (for ``"muon"``: of the embeddings, head, norms, biases and scalars)."""
    weight_decay: float = 0.0
    """AdamW's decoupled weight decay, on 2-D and larger parameters only (not on biases, norm gains, scalars)."""
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = 1e-8
    muon_lr: float = 0.01
    muon_momentum: float = 0.95
    muon_weight_decay: float = 0.0

    def __post_init__(self):
        if self.name not in OPTIMIZERS:
            raise ValueError(f"optimizer={self.name!r} is not supported; allowed values: {list(OPTIMIZERS)}")
        for name in ("lr", "muon_lr"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}={getattr(self, name)!r} must be > 0")
        for name in ("weight_decay", "muon_weight_decay"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}={getattr(self, name)!r} must be >= 0")
        if len(self.betas) != 2 or not all(0 <= beta < 1 for beta in self.betas):
            raise ValueError(f"betas={self.betas!r} must be two numbers in [0, 1)")
        if not 0 <= self.muon_momentum < 1:
            raise ValueError(f"muon_momentum={self.muon_momentum!r} must be in [0, 1)")
