"""The attention kernel a pretraining run trains with when ``train.attn_implementation`` is unset, and why.

Measured on one H200 (bench/RESULTS.md, "GPU"), 12 x 768 on UniProt lengths: on packed rows varlen (FlashAttention
on the real tokens) trains fastest, ahead of sdpa and well ahead of flex_attention; on unpacked rows sdpa is ahead of
varlen. On a CPU only sdpa trains (flex_attention has no CPU backward, varlen no CPU kernel). So: varlen for packed
rows on a GPU where the model and the torch build allow it, else sdpa. A named kernel is always kept.
"""

from dataclasses import dataclass

from .trainer import use_bf16


@dataclass(frozen=True)
class AttentionChoice:
    implementation: str
    reason: str

    def line(self) -> str:
        return f"attention kernel: {self.implementation} ({self.reason})"


def choose_attention(run, config, device_type: str) -> AttentionChoice:
    """The kernel for `run`'s model `config` on a ``device_type`` ("cuda", "cpu", ...) device; a device name with
    an index ("cuda:0") counts as its type."""
    if run.train.attn_implementation is not None:
        return AttentionChoice(run.train.attn_implementation, "set by train.attn_implementation")
    device_type = str(device_type).split(":")[0]
    if device_type != "cuda":
        return AttentionChoice("sdpa", f"the training kernel on {device_type}")
    if run.data.packing != "pack":
        return AttentionChoice("sdpa", f"the fastest on unpacked rows (data.packing={run.data.packing!r})")
    blocker = _varlen_blocker(run, config)
    if blocker is not None:
        return AttentionChoice("sdpa", f"packed rows, but varlen cannot train this run: {blocker}")
    return AttentionChoice("varlen", "the fastest on packed rows on a GPU; set train.attn_implementation to choose")


def _varlen_blocker(run, config):
    from encoderlab.modeling.kernels import varlen

    if varlen.TORCH_VARLEN_ATTN is None:
        return "this torch has no torch.nn.attention.varlen"
    if not use_bf16(run.train.precision):
        return f"train.precision={run.train.precision!r}, and FlashAttention needs bf16"
    return config.varlen_blocker


__all__ = ["AttentionChoice", "choose_attention"]
