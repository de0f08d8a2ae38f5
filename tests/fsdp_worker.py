"""One process of the FSDP2 tests (tests/test_fsdp.py) and benchmark: started by torchrun on CPU (gloo), or alone.

``train``: a few optimizer steps of a tiny model of tests/test_family_contract.py's `CASES` on fixed masked-LM
batches, as ``--mode fsdp`` (sharded by `encoderlab.training.fsdp.shard_model`, the plugin read from the shipped
``fsdp2`` accelerate config through accelerate's launch code, fp32), ``ddp`` (DistributedDataParallel) or
``single`` (one process taking both ranks' batches as two accumulated micro-batches: the same objective). Every
step's global batch depends only on the step, so a run resumed from a checkpoint sees the batches of an
uninterrupted one. The sharded checkpoints are written and read by accelerate's ``save_fsdp_model`` /
``save_fsdp_optimizer`` / ``load_*``, the functions the Trainer calls. Rank 0 writes the loss curve and the full
final weights to ``--out``.

``wrap``: every case of `CASES`, tied and untied: sharded logits and gradients equal the unsharded model's, every
block is its own FSDP unit and a tied decoder stays tied to the embeddings.
"""

import argparse
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from test_family_contract import CASES, build  # noqa: E402

from encoderlab.training import fsdp  # noqa: E402
from encoderlab.training.launch import accelerate_config_path  # noqa: E402
from encoderlab.training.optim import build_optimizer  # noqa: E402
from encoderlab.training.run_config import OptimizerSettings  # noqa: E402

WORLD = 2  # the batches are cut for two ranks in every mode
ROWS_PER_RANK, LENGTH, MASK_ID = 2, 12, 3


def batch(step: int, rank: int, vocab: int) -> dict:
    """Rank `rank`'s half of step `step`'s global batch: random tokens, about a third of them masked."""
    generator = torch.Generator().manual_seed(1000 + step)
    ids = torch.randint(4, vocab, (WORLD * ROWS_PER_RANK, LENGTH), generator=generator)
    masked = torch.rand(ids.shape, generator=generator) < 0.3
    masked[:, 1] = True  # at least one label per row
    labels = torch.where(masked, ids, -100)
    inputs = torch.where(masked, MASK_ID, ids)
    rows = slice(rank * ROWS_PER_RANK, (rank + 1) * ROWS_PER_RANK)
    return {"input_ids": inputs[rows], "attention_mask": torch.ones_like(inputs[rows]), "labels": labels[rows]}


def fsdp_context(activation_checkpointing: bool = False) -> fsdp.ShardingContext:
    launch_args = ["--mixed_precision", "no"]  # the tests compare in fp32
    if activation_checkpointing:
        launch_args += ["--fsdp_activation_checkpointing", "true"]
    variables = fsdp.launch_environment(accelerate_config_path("fsdp2"), launch_args)
    return fsdp.ShardingContext(fsdp.fsdp_plugin(variables))


CLASSIFY = "+classify"
"""Case suffix: the family's sequence classifier (3 labels) instead of its masked LM (fine-tuning)."""


def new_model(case: str, tie: bool = False) -> torch.nn.Module:
    # eval(): the comparisons need no dropout; gradients flow all the same.
    if case.endswith(CLASSIFY):
        import encoderlab

        masked_lm_class, config_class, settings = CASES[case.removesuffix(CLASSIFY)]
        model_class = getattr(encoderlab, masked_lm_class.__name__.replace("ForMaskedLM", "ForSequenceClassification"))
        torch.manual_seed(0)
        model = model_class(config_class(**settings, num_labels=3))
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.copy_(torch.randn_like(parameter) * 0.3)
        return model.eval()
    return build(case, dtype=torch.float32, tie_word_embeddings=tie).eval()


def case_batch(case: str, step: int, rank: int, vocab: int) -> dict:
    inputs = batch(step, rank, vocab)
    if case.endswith(CLASSIFY):  # a label per row, from its tokens
        inputs["labels"] = inputs["input_ids"][:, 2] % 3
    return inputs


def full_weights(model, mode: str) -> dict:
    if mode == "fsdp":
        return fsdp.gathered_state_dict(model)
    module = model.module if mode == "ddp" else model
    return {name: tensor.detach().clone() for name, tensor in module.state_dict().items()}


def train(args) -> None:
    """Every case of ``--case`` (comma-separated) in turn; rank 0 saves {case: {"losses", "weights"}}."""
    results = {}
    for case in args.case.split(","):
        results[case] = train_case(args, case)
    if args.mode == "single" or dist.get_rank() == 0:
        torch.save(results, args.out)


def train_case(args, case: str) -> dict:
    rank = dist.get_rank() if args.mode != "single" else 0
    model = new_model(case, args.tie)
    vocab = model.config.vocab_size
    context = None
    if args.mode == "fsdp":
        context = fsdp_context(args.activation_checkpointing)
        model = fsdp.shard_model(model, context)
    elif args.mode == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
    # As in the Trainer, the optimizer sees the model itself (its parameter split needs `base_model`), not DDP.
    unwrapped = model.module if args.mode == "ddp" else model
    optimizer = build_optimizer(unwrapped, OptimizerSettings(name=args.optimizer, lr=1e-2, muon_lr=2e-2, eps=1e-6))
    checkpoint = os.path.join(args.checkpoint, case) if args.checkpoint else None
    first_step = 0
    if args.resume:
        from accelerate.utils.fsdp_utils import load_fsdp_model, load_fsdp_optimizer

        load_fsdp_model(context.plugin, context, model, checkpoint)
        load_fsdp_optimizer(context.plugin, context, optimizer, model, checkpoint)
        first_step = args.save_at
    losses = []
    for step in range(first_step, args.steps):
        parts = [rank] if args.mode != "single" else list(range(WORLD))
        total = 0.0
        for part in parts:
            loss = model(**case_batch(case, step, part, vocab)).loss / len(parts)
            loss.backward()
            total += loss.detach()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # the Trainer clips at max_grad_norm=1
        optimizer.step()
        optimizer.zero_grad()
        if args.mode != "single":
            dist.all_reduce(total)
            total /= WORLD
        losses.append(float(total))
        if checkpoint and step + 1 == args.save_at and not args.resume:
            from accelerate.utils.fsdp_utils import save_fsdp_model, save_fsdp_optimizer

            save_fsdp_model(context.plugin, context, model, checkpoint)
            save_fsdp_optimizer(context.plugin, context, optimizer, model, checkpoint)
        if step + 1 == args.stop_at:
            os._exit(0)  # killed: the steps after the checkpoint are lost
    weights = full_weights(model, args.mode)
    if args.gather and rank == 0:  # the run's final folder: the gathered weights through save_pretrained
        model.save_pretrained(os.path.join(args.gather, case), state_dict=dict(weights))  # it empties the dict
    return {"losses": losses, "weights": weights}


def check_wrapping(args) -> None:
    """`wrap`: for every case, tied and untied, one forward/backward sharded vs unsharded."""
    from torch.distributed.fsdp import FSDPModule

    rank = dist.get_rank()
    failures = []
    for case in args.case.split(",") if args.case else sorted(CASES):
        for tie in (True, False):
            reference = new_model(case, tie)
            sharded = fsdp.shard_model(new_model(case, tie), fsdp_context(args.activation_checkpointing))
            vocab = reference.config.vocab_size
            # The sharded gradient is the mean over the ranks' batches: the reference takes both.
            expected = reference(**batch(0, rank, vocab))
            sum(reference(**batch(0, part, vocab)).loss / WORLD for part in range(WORLD)).backward()
            got = sharded(**batch(0, rank, vocab))
            got.loss.backward()
            blocks = fsdp.wrap_block_names(reference)
            count = sum(type(m).__name__ in blocks for m in reference.modules())
            # An FSDP unit per block (with activation checkpointing: the checkpoint wrapper around the block).
            units = [
                getattr(m, "_checkpoint_wrapped_module", m) for m in sharded.modules() if isinstance(m, FSDPModule)
            ]
            problems = []
            # (accelerate shards both the wrapper and the block inside it: the wrapper's unit holds no parameter.)
            if len({id(m) for m in units if type(m).__name__.removeprefix("FSDP") in blocks}) != count or not count:
                problems.append(f"blocks {blocks} not each an FSDP unit")
            if tie and sharded.get_output_embeddings().weight is not sharded.get_input_embeddings().weight:
                problems.append("decoder no longer tied")
            if not torch.allclose(got.logits, expected.logits, rtol=0, atol=1e-5):
                problems.append("logits differ")
            grads = {n: p.grad for n, p in reference.named_parameters()}
            for name, parameter in sharded.named_parameters():
                name = name.replace("._checkpoint_wrapped_module", "")
                grad = parameter.grad.full_tensor() if hasattr(parameter.grad, "full_tensor") else parameter.grad
                if not torch.allclose(grad, grads[name], rtol=0, atol=1e-5):
                    problems.append(f"gradient of {name} differs")
            if problems:
                failures.append(f"{case} tie={tie}: {problems[:3]}")
    if rank == 0:
        torch.save({"failures": failures, "cases": len(CASES)}, args.out)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["train", "wrap"])
    parser.add_argument("--mode", choices=["fsdp", "ddp", "single"], default="fsdp")
    parser.add_argument("--case", help="comma-separated names of CASES (wrap: default all)")
    parser.add_argument("--tie", action="store_true")
    parser.add_argument("--optimizer", default="adamw")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--checkpoint")
    parser.add_argument("--save-at", type=int, default=0)
    parser.add_argument("--stop-at", type=int, default=0)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--activation-checkpointing", action="store_true")
    parser.add_argument("--gather")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.manual_seed(0)
    if args.mode != "single":
        from accelerate import PartialState

        PartialState(cpu=True)  # the gloo group, and the state accelerate's logging (in save_fsdp_model) wants
    (train if args.command == "train" else check_wrapping)(args)
    if dist.is_initialized():
        dist.barrier()  # both ranks are done (rank 0 has written the results) before either leaves
        dist.destroy_process_group()
        # Leave without the interpreter's teardown: there, torch 2.13's gloo objects still held by the sharded
        # model's device mesh are destroyed late and abort the process ("terminate called without an active
        # exception") in 3 of 89 runs on a loaded 2-core machine, after all the work was done and written.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
