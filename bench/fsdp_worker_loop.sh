#!/usr/bin/env bash
# Repeats the FSDP2 worker run of tests/test_fsdp.py's resume test (2 gloo processes, DTA-BERT, Muon, a sharded
# checkpoint at step 2) and counts the runs that did not exit 0: how an abort of that test's worker at exit was
# measured (before the worker ended with os._exit(0): 3 aborts at exit and 1 failure mid-run in 89 runs; after it:
# none in 120 + 24).
# Run two at once (or beside other work) to load the 2-core machine as CI does.
#
#   bash bench/fsdp_worker_loop.sh 60            # from the repository root; prints "failed F of N"
set -uo pipefail
RUNS=${1:-30}
LOGS=$(mktemp -d)
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false PYTHONFAULTHANDLER=1
failed=0
for i in $(seq 1 "$RUNS"); do
    if ! .venv/bin/torchrun --standalone --nproc_per_node 2 tests/fsdp_worker.py train --mode fsdp \
            --case dta-unet-value-embeddings --tie --optimizer muon --steps 4 --save-at 2 \
            --checkpoint "$LOGS/run$i" --out "$LOGS/run$i.pt" > /dev/null 2> "$LOGS/run$i.err"; then
        failed=$((failed + 1))
        echo "run $i failed: $(grep -m1 -E 'terminate|Fatal|Error' "$LOGS/run$i.err")"
    fi
    rm -rf "$LOGS/run$i"
done
echo "failed $failed of $RUNS (logs in $LOGS)"
