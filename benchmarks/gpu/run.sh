#!/bin/bash
# The GPU check of a development session, run from the repository root on a CUDA host (the device tool's lent
# H200: `bash benchmarks/gpu/run.sh`, with .whl/ carried). Prints the machine, what the plugin says of the 4-GPU
# profile there, whether torchtitan 0.3.0 trains on this torch at all (torchrun alone, one GPU), then runs the
# one-GPU profile (h200x1.yaml) through the plugin: the smoke cells first, then the rest while time is left.
# Wheels in .whl/ (torchtitan 0.3.0 and its pure-Python needs, this plugin) go to /tmp/site when present.
set -u
export PYTHONUNBUFFERED=1
REPO=$(pwd)
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
W=$(mktemp -d /tmp/gpu-work.XXXX)
nvidia-smi -L
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'devices', torch.cuda.device_count())"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
  export PYTHONPATH=/tmp/site
fi
cd "$W"
python3 "$REPO/fixtures/assets.py" "$W/assets" >/dev/null
echo "== 1. the plugin on the 4-GPU profile (dry run)"
timeout 60 python3 -m pytest -p no:cacheprovider --simplefsdp-matrix --simplefsdp-profile=h100x4 \
  --simplefsdp-dry-run -q 2>&1 | tail -8
echo "== 2. torchtitan alone: graph_trainer llama3, one GPU, 10 steps"
start=$(date +%s)
timeout 150 torchrun --nproc-per-node=1 -m torchtitan.train --module graph_trainer.llama3 \
  --config graph_trainer_llama3_debugmodel --training.steps 10 --hf_assets_path "$W/assets/tokenizer" \
  --dataloader.dataset_path "$W/assets/c4_test" --dump_folder "$W/bare" > "$OUT/bare.log" 2>&1
echo "exit $? in $(( $(date +%s) - start )) s"; grep -E "step: *(1|10) |Error|error" "$OUT/bare.log" | tail -8
echo "== 3. the one-GPU profile through the plugin: smoke, then the rest"
for selection in "smoke" "not smoke"; do
  timeout ${PART_LIMIT:-170} python3 -m pytest -p no:cacheprovider --simplefsdp-matrix \
    --simplefsdp-matrix-file="$REPO/benchmarks/gpu/h200x1.yaml" -m "$selection" -rA 2>&1 | tee -a "$OUT/plugin.log" | tail -40
done
cp -r "$W/.simplefsdp/runs" "$OUT/runs" 2>/dev/null
(cd "$OUT" && tar czf runs.tgz runs && rm -rf runs)
