#!/usr/bin/env bash
# Prepares, on a machine with network and the data beside the repository (../shared/data), what a GPU machine
# without either needs to run bench/gpu/*.py and bench/transfer/gpu_pretrain.py: in .whl/, the wheels of `datasets`,
# `evaluate` and what they need beyond the GPU machine's own packages; in .gpu_data/, a trimmed copy of the data the
# scripts read. Both folders are ignored by git; copy them with the repository (bench/gpu/README.md, "Set-up").
#
#   bash bench/gpu/prepare.sh    # from the repository root; PYTHON=... picks the pip that downloads, WHEELS=... the
#                                # wheels, PYTHON_VERSION=... the GPU machine's Python (default 3.12)
#
# The default wheels fit the GPU machines used so far (2026-11: torch 2.11, transformers 5.17, accelerate,
# tokenizers, safetensors, peft, pyarrow, pandas, xxhash, aiohttp, requests, tqdm, huggingface-hub 1.33 and fsspec
# installed; datasets, evaluate, dill and multiprocess not). datasets 5.0.1, not 5.2: its bounds (pyarrow >= 21,
# huggingface-hub < 2) fit such a machine, whose pyarrow version may be older than 5.2's >= 24. fsspec comes along,
# pinned inside datasets' bounds. tokenizers 0.23.3 replaces 0.23.2, which drops a document's overflowing windows
# (every pretraining document would be cut to its first window; encoderlab refuses that version).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"

PYTHON=${PYTHON:-.venv/bin/python}
PYTHON_VERSION=${PYTHON_VERSION:-3.12}
SHARED=${SHARED:-../shared/data}
WHEELS=${WHEELS:-"datasets==5.0.1 evaluate==0.4.6 dill==0.4.1 multiprocess==0.70.19 fsspec==2026.6.0 tokenizers==0.23.3"}

rm -rf .whl .gpu_data
# shellcheck disable=SC2086
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYTHON_VERSION" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl $WHEELS

mkdir -p .gpu_data/proteins .gpu_data/text .gpu_data/glue .gpu_data/tape
cp "$SHARED/proteins/uniprot_sample_20k.fasta.gz" .gpu_data/proteins/
cp "$SHARED/text/wikitext2_test.txt" .gpu_data/text/
for task in CoLA SST-2 MRPC STS-B RTE; do
    mkdir -p ".gpu_data/glue/$task"
    cp "$SHARED/glue/$task/train.tsv" "$SHARED/glue/$task/dev.tsv" ".gpu_data/glue/$task/"
done
# TAPE, every split whole: experiments.py's HOMA parts train Table 2 on them (check.py's fine-tuning reads the first
# 2,000 secondary-structure chains). Secondary structure as plain CSV (9 MB, read in place); fluorescence and
# stability (17 MB) gzipped to 2.5 MB, unpacked by experiments.py into its scratch folder.
cp -r "$SHARED/tape/secondary_structure" .gpu_data/tape/
for task in fluorescence stability; do
    mkdir -p ".gpu_data/tape/$task"
    for split in train valid test; do
        gzip -9 -c "$SHARED/tape/$task/$split.csv" > ".gpu_data/tape/$task/$split.csv.gz"
    done
done
chmod -R u+w .gpu_data

# What to copy: the tracked and untracked-not-ignored files of the tree, plus the two folders.
tree_bytes=$(git ls-files -z -co --exclude-standard | xargs -0 du -cb 2>/dev/null | awk 'END {print $1}')
prepared_bytes=$(du -cb .whl .gpu_data | awk 'END {print $1}')
echo "wheels: $(ls .whl | tr '\n' ' ')"
echo "to copy: the tree $(( tree_bytes / 1048576 )) MiB + .whl and .gpu_data $(( prepared_bytes / 1048576 )) MiB"
echo "ready: on the GPU machine, source bench/gpu/setup_offline.sh, then run the queue of bench/gpu/README.md"
