"""The copy-or-unigram floor of a committed MLM sweep, recomputed from its config without its run folders.

For each training seed of the sweep's runs CSV, the run's data is rebuilt as `encoderlab pretrain` builds it today
(tokenizer, split, test windows), the test windows are collated by the seeded evaluation collator, and two numbers
come out: the unigram baseline, which must equal the committed ``unigram_<length>`` cell (then the rebuilt masks
are the masks the models were scored on), and the floor on those masks. A seed whose unigram does not match is
reported as such and its floor is not trusted (the data pipeline changed since the sweep).

Usage:
    python bench/mlm_floor_recompute.py --config mlm_comparison --runs bench/figures/mlm/mlm_runs.csv
    python bench/mlm_floor_recompute.py --config mlm_protein --runs bench/figures/mlm_protein/mlm_runs.csv
    python bench/mlm_floor_recompute.py --config mlm_comparison --set train.seq_len=128 \
        --runs bench/figures/context/routing_text/mlm_runs.csv
"""

import argparse
import csv
import tempfile

from accelerate import PartialState

from encoderlab.training.collator import MLMCollator, special_token_ids_of
from encoderlab.training.metrics import evaluation_floor, unigram_baseline_accuracy
from encoderlab.training.packing import PackedMLMCollator
from encoderlab.training.pretrain import load_run_config, prepare_data
from encoderlab.training.shards import unigram_argmax_of


def seed_floors(config: str, overrides: list[str], seed: int) -> dict:
    with tempfile.TemporaryDirectory() as out:
        run = load_run_config(config, [*overrides, f"train.seed={seed}", f"output_dir={out}"])
        tokenizer, data = prepare_data(run, None, PartialState(cpu=True))
    masking = dict(
        mlm_probability=run.mlm.probability,
        mask_replace_prob=run.mlm.mask_replace_prob,
        random_replace_prob=run.mlm.random_replace_prob,
    )
    collator_class = PackedMLMCollator if run.data.packing == "pack" else MLMCollator
    collator = collator_class(tokenizer, seed=seed, **masking)
    top = unigram_argmax_of(data.info, special_token_ids_of(tokenizer))
    result = {}
    for length, dataset in data.test_sets.items():
        labels = [collator(list(dataset))["labels"].numpy()]
        result[length] = (unigram_baseline_accuracy(top, labels), evaluation_floor(collator, dataset, top))
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="the sweep's bundled run config")
    parser.add_argument("--runs", required=True, help="the sweep's committed runs CSV (seed, unigram_short/long)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="config overrides of the sweep (e.g. train.seq_len=128: only rows of that length)",
    )
    args = parser.parse_args(argv)
    with open(args.runs, newline="") as handle:
        rows = list(csv.DictReader(handle))
    seq_len = load_run_config(args.config, args.overrides).train.seq_len
    committed = {
        int(row["seed"]): {length: float(row[f"unigram_{length}"]) for length in ("short", "long")}
        for row in rows
        if int(row.get("train_len") or seq_len) == seq_len
    }  # rows of this training length
    print("| seed | length | committed unigram | rebuilt unigram | same masks | floor |")
    print("|---|---|---|---|---|---|")
    for seed in sorted(committed):
        for length, (unigram, floor) in seed_floors(args.config, args.overrides, seed).items():
            same = abs(unigram - committed[seed][length]) < 1e-12
            print(
                f"| {seed} | {length} | {committed[seed][length]:.4f} | {unigram:.4f} | {'yes' if same else 'NO'} | "
                f"{floor:.4f} |"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
