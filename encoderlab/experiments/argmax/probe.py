"""The argmax task and the model that learns it: 64 tokens uniform in [1, 64] labelled with the index of their first
maximum (or, for the control, with a random position), and a `DTABertModel` body with the paper's
softmax-pooling position head."""

import torch
from torch import nn

from ...configuration.dta import DTABertConfig
from ...modeling.dta import DTABertModel
from .options import POSITION_SCHEMES

VOCAB = 64
SEQ_LEN = 64
TASKS = ("argmax", "random_labels")
CHANCE = 1.0 / SEQ_LEN
# P(first maximum at index 0) = sum_m P(x_0 = m) * P(all others <= m): the accuracy of always answering 0.
POSITION_BLIND_CEILING = sum((m / VOCAB) ** (SEQ_LEN - 1) for m in range(1, VOCAB + 1)) / VOCAB
EVAL_SEED = 20240917  # one held-out set for every run, independent of the run seeds


def first_argmax(tokens):
    """Index of the first maximum of each row; spelled out instead of relying on torch.argmax's tie order."""
    is_max = tokens == tokens.max(dim=1, keepdim=True).values
    index = torch.arange(tokens.shape[1], device=tokens.device).expand_as(tokens)
    return torch.where(is_max, index, tokens.shape[1]).min(dim=1).values


def sample_batch(generator, batch_size, task="argmax"):
    """A fresh batch: tokens (B, 64) uniform in [1, 64] and labels (B,).

    ``task="random_labels"`` draws labels independently of the tokens: the control that measures what a model
    scores when there is nothing to learn.
    """
    if task not in TASKS:
        raise ValueError(f"task={task!r} must be one of {TASKS}")
    tokens = torch.randint(1, VOCAB + 1, (batch_size, SEQ_LEN), generator=generator)
    if task == "random_labels":
        return tokens, torch.randint(0, SEQ_LEN, (batch_size,), generator=generator)
    return tokens, first_argmax(tokens)


def evaluation_batches(num_batches, batch_size, task="argmax", seed=EVAL_SEED):
    """The fixed held-out set: the same seed gives the same batches on every call and in every run."""
    generator = torch.Generator().manual_seed(seed)
    return [sample_batch(generator, batch_size, task) for _ in range(num_batches)]


# ---------------------------------------------------------------------------------------------------------- model


class SoftmaxPoolingHead(nn.Module):
    """The paper's position head: score_i = w.h_i, alpha = softmax(score), logits = W (sum_i alpha_i h_i).

    A learned attention-pooling read-out: the model has to mark the answer position in its hidden states, and
    the classifier has to read the position back out of the pooled vector.
    """

    def __init__(self, hidden_size, num_classes=SEQ_LEN):
        super().__init__()
        self.score = nn.Linear(hidden_size, 1, bias=False)
        self.classifier = nn.Linear(hidden_size, num_classes)

    def pooling_weights(self, hidden_states):
        """(B, L, D) -> alpha (B, L), each row a softmax over positions."""
        return self.score(hidden_states).squeeze(-1).softmax(dim=-1)

    def forward(self, hidden_states):
        alpha = self.pooling_weights(hidden_states)
        pooled = torch.einsum("bl,bld->bd", alpha, hidden_states)
        return self.classifier(pooled)


class ArgmaxProbe(nn.Module):
    """`DTABertModel` body + `SoftmaxPoolingHead`; returns logits over the 64 positions."""

    def __init__(self, config):
        super().__init__()
        self.body = DTABertModel(config)
        self.head = SoftmaxPoolingHead(config.hidden_size)

    def forward(self, input_ids):
        return self.head(self.body(input_ids=input_ids).last_hidden_state)


def heads_for(attention, hidden_size, head_size):
    """Heads of `head_size` channels (twice that for dual triangle, so each half-head has `head_size`); one head
    when the model is narrower than a head."""
    if head_size <= 0:
        raise ValueError(f"head_size={head_size} must be positive")
    width = 2 * head_size if attention == "dual_triangle" else head_size
    if hidden_size <= width:
        return 1
    if hidden_size % width:
        raise ValueError(f"hidden_size={hidden_size} is not a multiple of the {attention} head width {width}")
    return hidden_size // width


def build_probe(attention, positions, hidden_size, depth, head_size=64):
    """A fresh probe; `positions` is one of `POSITION_SCHEMES` (the "-drop" suffix only changes training)."""
    if positions not in POSITION_SCHEMES:
        raise ValueError(f"positions={positions!r} must be one of {POSITION_SCHEMES}")
    config = DTABertConfig(
        attention_type=attention,
        vocab_size=VOCAB + 1,  # id 0 is padding, never sampled
        hidden_size=hidden_size,
        num_hidden_layers=depth,
        num_attention_heads=heads_for(attention, hidden_size, head_size),
        position_embedding_type=positions.removesuffix("-drop"),
        max_position_embeddings=SEQ_LEN,
    )
    return ArgmaxProbe(config)
