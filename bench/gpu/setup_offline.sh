# Sourced on a GPU machine whose pip cannot fetch, before the commands of bench/gpu/README.md:
#
#   . bench/gpu/setup_offline.sh && python3 bench/gpu/check.py ...
#
# Installs the wheels bench/gpu/prepare.sh downloaded into .whl/ into $SITE (default /tmp/site; put first on
# PYTHONPATH, so the machine's own torch, transformers and accelerate stay and only what it lacks is added), then
# encoderlab from this tree without dependencies, and prints the GPU and the versions the scripts will run with.
SITE=${SITE:-/tmp/site}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl \
    || return 1
export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . || return 1
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 HF_EVALUATE_OFFLINE=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader || true
python3 -c "import datasets, evaluate, encoderlab, torch, transformers; print('torch', torch.__version__, \
'transformers', transformers.__version__, 'datasets', datasets.__version__, 'evaluate', evaluate.__version__)" \
    || return 1
