"""Train-step time of each family at two source trees of encoderlab, interleaved in fresh processes, to check that
a refactor does not slow the models down. Not part of `make bench` (it needs a second checkout).

    git worktree add /tmp/old <rev>
    OMP_NUM_THREADS=2 python bench/compare_revisions.py /tmp/old . --rounds 2

Each round runs every family once per tree, alternating which tree goes first; a run prints the fastest and the
median of 5 timed AdamW steps (batch 8 x 256 tokens, one row padded) after a warm-up step.
"""

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

STEP_SCRIPT = r"""
import sys, time, torch
sys.path.insert(0, sys.argv[1])
from encoderlab import (DSTGNeoBERTConfig, DSTGNeoBERTForMaskedLM, DTABertConfig, DTABertForMaskedLM, HOMAConfig,
                        HOMAForMaskedLM)
torch.manual_seed(0)
family = sys.argv[2]
if family == "dta":
    model = DTABertForMaskedLM(DTABertConfig(vocab_size=4096, hidden_size=384, num_hidden_layers=4,
        num_attention_heads=3, intermediate_size=1536, attention_type="dual_triangle",
        position_embedding_type="none", max_position_embeddings=512))
elif family == "homa":
    model = HOMAForMaskedLM(HOMAConfig(vocab_size=33, hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=512, attention_type="homa", max_position_embeddings=512))
else:
    model = DSTGNeoBERTForMaskedLM(DSTGNeoBERTConfig(preset="dstg", vocab_size=4096, hidden_size=384,
        num_hidden_layers=4, num_attention_heads=6, intermediate_size=1024, max_position_embeddings=512))
ids = torch.randint(5, model.config.vocab_size, (8, 256))
mask = torch.ones_like(ids)
mask[1, 200:] = 0
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
def step():
    model(input_ids=ids, attention_mask=mask, labels=ids).loss.backward()
    optimizer.step()
    optimizer.zero_grad()
step()
times = []
for _ in range(5):
    start = time.perf_counter()
    step()
    times.append(time.perf_counter() - start)
print(min(times), sorted(times)[2])
"""

FAMILIES = ("dta", "homa", "dstg")


def time_step(tree: Path, family: str) -> tuple[float, float]:
    result = subprocess.run(
        [sys.executable, "-c", STEP_SCRIPT, str(tree), family], capture_output=True, text=True, check=True
    )
    best, median = map(float, result.stdout.split())
    return best, median


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    trees = {"old": args.old.resolve(), "new": args.new.resolve()}
    times = {(name, family): [] for name in trees for family in FAMILIES}
    for round_index in range(args.rounds):
        for family in FAMILIES:
            order = list(trees) if round_index % 2 == 0 else list(reversed(trees))
            for name in order:
                times[name, family].append(time_step(trees[name], family))
    print("| family | old best / median s | new best / median s | new / old (best) |")
    print("|---|---|---|---|")
    for family in FAMILIES:
        old_best = min(best for best, _ in times["old", family])
        new_best = min(best for best, _ in times["new", family])
        old_median = statistics.median(median for _, median in times["old", family])
        new_median = statistics.median(median for _, median in times["new", family])
        print(
            f"| {family} | {old_best:.3f} / {old_median:.3f} | {new_best:.3f} / {new_median:.3f} "
            f"| {new_best / old_best:.2f}x |"
        )


if __name__ == "__main__":
    main()
