#!/usr/bin/env bash
# Prepares, on this (CPU) machine, what a GPU run of bench/gpu/*.py brings along to the device machine, which has
# no network: the wheels of `datasets`, `evaluate` and what they need beyond the device's image, in .whl/, and a
# trimmed copy of ../shared/data in .gpu_data/. Both folders are ignored by git and travel with `carry`; the
# working tree plus both must stay under the device tool's 64 MiB, which this script checks.
#
#   bash bench/gpu/prepare.sh            # from the repository root; PYTHON=... picks the pip that downloads
#
# The device image (2026-11) has torch 2.11, transformers 5.17, accelerate, tokenizers, safetensors, peft, pyarrow,
# pandas, xxhash, aiohttp, requests, tqdm, huggingface-hub (1.33) and fsspec, but not datasets, evaluate, dill or
# multiprocess. datasets 5.0.1, not this machine's 5.2: its bounds (pyarrow >= 21, huggingface-hub < 2) fit the image,
# whose pyarrow version is not known here (5.2 needs >= 24). fsspec comes along too, pinned inside datasets' bounds.
# tokenizers 0.23.3 replaces the image's 0.23.2, which drops a document's overflowing windows (every pretraining
# document would be cut to its first window; encoderlab now refuses that version).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"

PYTHON=${PYTHON:-.venv/bin/python}
SHARED=${SHARED:-../shared/data}
LIMIT_MIB=64
WHEELS=${WHEELS:-"datasets==5.0.1 evaluate==0.4.6 dill==0.4.1 multiprocess==0.70.19 fsspec==2026.6.0 tokenizers==0.23.3"}

# Both folders stay out of git (and out of the tree the device tool sends, except through `carry`).
for folder in /.whl/ /.gpu_data/; do
    git check-ignore -q "${folder#/}" || echo "$folder" >> .git/info/exclude
done

rm -rf .whl .gpu_data
# shellcheck disable=SC2086
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
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

# What travels: tracked and untracked-not-ignored files, plus the two carried folders.
tree_bytes=$(git ls-files -z -co --exclude-standard | xargs -0 du -cb 2>/dev/null | awk 'END {print $1}')
carried_bytes=$(du -cb .whl .gpu_data | awk 'END {print $1}')
total_mib=$(( (tree_bytes + carried_bytes) / 1048576 ))
echo "wheels: $(ls .whl | tr '\n' ' ')"
echo "tree $(( tree_bytes / 1048576 )) MiB + .whl and .gpu_data $(( carried_bytes / 1048576 )) MiB = $total_mib MiB" \
     "(limit $LIMIT_MIB MiB)"
if (( total_mib >= LIMIT_MIB )); then
    echo "too large for the device tool: remove untracked files or trim .gpu_data" >&2
    exit 1
fi
echo "ready: run the commands of bench/gpu/README.md with carry [\".whl\", \".gpu_data\"]"
