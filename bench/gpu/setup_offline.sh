# Sourced at the start of every device run (bench/gpu/README.md): `. bench/gpu/device_setup.sh && python3 ...`.
# Installs the wheels prepare.sh brought along in .whl into /tmp/site (put first on PYTHONPATH, so the image's
# torch, transformers and accelerate stay and only what it lacks is added), then encoderlab from this tree without
# dependencies, and prints the GPU and the versions the scripts will run with.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || return 1
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . || return 1
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 HF_EVALUATE_OFFLINE=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader || true
python3 -c "import datasets, evaluate, encoderlab, torch, transformers; print('torch', torch.__version__, \
'transformers', transformers.__version__, 'datasets', datasets.__version__, 'evaluate', evaluate.__version__)" \
    || return 1
