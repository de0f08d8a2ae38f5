#!/usr/bin/env bash
# Pretraining arms of the transfer experiment (docs/experiments-transfer.md): DTA-BERT (the demo config: dual
# triangle, no positions) and bidirectional + RoPE at the same size (with ARMS=bidirwd, the latter with weight
# decay 0.1; with ARMS="dta4x bidir4x", both at 4x the body's parameters: 4 layers of 256, 4 heads of 64,
# feed-forward 1024; with ARMS="dta9x bidir9x", at 9x: 4 layers of 384, 6 heads of 64, feed-forward 1536), each at
# every token budget of BUDGETS, as separate runs (each its own warm-up / constant / cool-down schedule), on the
# in-domain corpus of bench/transfer/corpus.py. The arms run side by side, one thread each.
#
#   bash bench/transfer/pretrain.sh            # from the repository root; RUNS=... BUDGETS="..." ARMS="..." to change
set -euo pipefail
RUNS=${RUNS:-runs/transfer}
BUDGETS=${BUDGETS:-"500000 2000000 5000000"}
ARMS=${ARMS:-"dta bidir"}
ENCODERLAB=${ENCODERLAB:-.venv/bin/encoderlab}
# EXTRA: more --set overrides for every arm, split at spaces (bench/transfer/gpu_pretrain.py: bf16, batch size, a
# saved tokenizer)
read -r -a extra <<< "${EXTRA:-}"
common=(--config demo --set data.source="$RUNS/corpus" --set tokenizer.vocab_size=4096 "${extra[@]}")

lane() {  # name, then the model overrides; runs every budget in turn
    local name=$1; shift
    for budget in $BUDGETS; do
        local run_dir="$RUNS/${name}_$budget"
        [[ -f "$run_dir/results.json" ]] && continue  # done in an earlier run of this script
        rm -rf "$run_dir"
        OMP_NUM_THREADS=1 "$ENCODERLAB" pretrain "${common[@]}" "$@" --set train.token_budget="$budget" \
            --set output_dir="$run_dir" > "$RUNS/${name}_$budget.log" 2>&1
        echo "$name $budget done"
    done
}

mkdir -p "$RUNS"
[[ " $ARMS " == *" dta "* ]] && lane dta &
bidir=(--set model.config.attention_type=bidirectional --set model.config.position_embedding_type=rope)
[[ " $ARMS " == *" bidir "* ]] && lane bidir "${bidir[@]}" &
# bidir with AdamW's decoupled weight decay 0.1 (the others use the demo's 0): does keeping the weights small keep
# the body easy to fine-tune? (without it, pretrained weights grow to 5-10x their initial size)
[[ " $ARMS " == *" bidirwd "* ]] && lane bidirwd "${bidir[@]}" --set optimizer.weight_decay=0.1 &
width() {  # the body at a hidden size of $1: heads of 64, feed-forward 4x, the demo's 4 layers
    echo --set model.config.hidden_size="$1" --set model.config.num_attention_heads=$(($1 / 64)) \
        --set model.config.intermediate_size=$((4 * $1))
}
[[ " $ARMS " == *" dta4x "* ]] && lane dta4x $(width 256) &
[[ " $ARMS " == *" bidir4x "* ]] && lane bidir4x "${bidir[@]}" $(width 256) &
[[ " $ARMS " == *" dta9x "* ]] && lane dta9x $(width 384) &
[[ " $ARMS " == *" bidir9x "* ]] && lane bidir9x "${bidir[@]}" $(width 384) &
wait
