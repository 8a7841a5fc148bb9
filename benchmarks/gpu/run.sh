#!/bin/bash
# The GPU check of a development session, in one device call of at most 8 minutes. Run from the repository root:
#   on the lent GPU:  bash benchmarks/gpu/run.sh          (with .whl/ carried: benchmarks/gpu/wheels.sh fills it)
#   its rehearsal:    CPU_REHEARSAL=1 bash benchmarks/gpu/run.sh   (the same steps with no CUDA: CI runs it,
#                     tests/test_gpu_check.py, so it cannot rot between lent devices)
# Steps: install what the image lacks from the carried wheels; print the machine and versions; run the one-GPU
# profile of the installed torchtitan's target as real world-1 cells (its compiled cells compared with its eager
# ones: numerics) and write their noise; run the 8-GPU profile's trace tier (one simulated rank on the GPU, inductor
# for real; no numbers measured); summarise. Writes 8 files to $OUT: log.txt (all it printed), world1.json/world1.md
# and trace.json/trace.md (the plugin's JSON and status markdown of each part), noise-world1.yaml (the world-1
# cells' noise file), summary.json (per cell: outcome, losses, peak memory and tokens/s from rank 0's log, Triton
# kernels from its compile trace), runs.tgz (the cells' logs).
# Knobs: OUT, PYTHON, WHEELS (folder of wheels), PART_LIMIT (seconds per part), WORLD1_SELECT (-m), TRACE_SELECT (-k).
set -u
export PYTHONUNBUFFERED=1
REPO=$(pwd)
OUT=$(realpath -m "${OUT:-/tmp/gpu-out}")
PY=${PYTHON:-python3}
WHEELS=$(realpath -m "${WHEELS:-$REPO/.whl}")
REHEARSAL=${CPU_REHEARSAL:-0}
mkdir -p "$OUT"
W=$(mktemp -d /tmp/gpu-work.XXXX)
exec > >(tee "$OUT/log.txt") 2>&1
cd "$W" || exit 2  # never the repository: Python would import the plugin from its folder, not the carried wheel

echo "== 1. the machine"
if [ "$REHEARSAL" = 1 ]; then
  export CUDA_VISIBLE_DEVICES=""  # no GPU is visible to the plugin or the ranks: every part runs on CPU
  echo "CPU rehearsal (CPU_REHEARSAL=1): no CUDA; the same steps on CPU ranks, nothing here is a GPU result"
else
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || { echo "no GPU: nvidia-smi failed"; exit 2; }
fi
echo "cpus $(nproc), memory $(free -g | awk '/Mem:/ {print $2}') GiB, $(uname -sr)"

echo "== 2. what the image lacks, from the carried wheels"
if ls "$WHEELS"/*.whl >/dev/null 2>&1; then
  du -ch "$WHEELS"/*.whl | tail -1
  SITE=$(mktemp -d /tmp/gpu-site.XXXX)  # outside the run's folder: node ids name the shipped profiles as matrix/...
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$WHEELS"/*.whl || exit 2
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
else
  echo "no wheels in $WHEELS: the image's packages only"
fi
"$PY" - <<'EOF' || exit 2
import importlib.metadata as m, sys, torch, pytest_simplefsdp
print("python", sys.version.split()[0], "| torch", torch.__version__, "| cuda", torch.version.cuda,
      "| devices", torch.cuda.device_count(), "|", ", ".join(f"{p} {m.version(p)}" for p in ("triton", "torchtitan")))
print("plugin", m.version("pytest-simplefsdp"), "from", pytest_simplefsdp.__file__)
EOF
case $("$PY" -c "import importlib.metadata as m; print(m.version('torchtitan'))") in
  0.2.*) WORLD1=titan02-h200x1.yaml TRACE=titan02-h100x8 ;;
  *) WORLD1=h200x1.yaml TRACE=h100x8 ;;
esac
if [ "$REHEARSAL" = 1 ]; then  # a CPU copy of the one-GPU profile, at a CPU's size (3 steps of 256 tokens, aot_eager);
  # the trace tier picks CPU and its CPU settings by itself (no GPU visible)
  sed -e 's/^device: cuda/device: cpu/' -e 's/^settings: .*/settings: {steps: 3, seq_len: 256, local_batch_size: 2, seed: 42, compile_backend: aot_eager}/' \
    -e 's/^  backend: \[inductor\]/  backend: [aot_eager]/' -e 's/^  backend: {omit: inductor}/  backend: {omit: aot_eager}/' \
    "$REPO/benchmarks/gpu/$WORLD1" > "$W/$WORLD1"
  M1=$W/$WORLD1 DEFAULT1=smoke DEFAULT2="llama3-dpr2-dp2-tp2-compiled"  # (EP cells read torch 2.11's garbage splits)
else
  M1=$REPO/benchmarks/gpu/$WORLD1 DEFAULT1="smoke or not smoke"
  DEFAULT2="llama3-dpr2-dp2-tp2-compiled or llama3-dp2-tp2-compiled-cp2 or deepseek_v3-dp4-tp2-ep2-eager and not ac_"
fi
PLUGIN=(-p no:cacheprovider --simplefsdp-matrix -rA --simplefsdp-artifacts="$W/runs")

echo "== 3. real world-1 cells: $WORLD1 (-m '${WORLD1_SELECT:-$DEFAULT1}')"
start=$(date +%s)
timeout "${PART_LIMIT:-200}" "$PY" -m pytest "${PLUGIN[@]}" --simplefsdp-matrix-file="$M1" -m "${WORLD1_SELECT:-$DEFAULT1}" \
  --simplefsdp-json="$OUT/world1.json" --simplefsdp-status-md="$OUT/world1.md" | tail -25
echo "part 3: exit ${PIPESTATUS[0]} in $(( $(date +%s) - start )) s"

echo "== 3b. the noise of the world-1 cells (each compared cell's largest relative difference from its baseline)"
# the noise file the GPU profiles' numerics wait for (it names this GPU, driver and CUDA; the trace tier's numbers are
# a simulated rank's, never measured)
"$PY" -m pytest_simplefsdp.report "$OUT/world1.json" --format noise > "$OUT/noise-world1.yaml" && cat "$OUT/noise-world1.yaml"

echo "== 4. the trace tier of $TRACE: one simulated rank per cell (-k '${TRACE_SELECT:-$DEFAULT2}')"
start=$(date +%s)
timeout "${PART_LIMIT:-200}" "$PY" -m pytest "${PLUGIN[@]}" --simplefsdp-profile="$TRACE" --simplefsdp-tier=trace \
  -k "${TRACE_SELECT:-$DEFAULT2}" --simplefsdp-json="$OUT/trace.json" --simplefsdp-status-md="$OUT/trace.md" | tail -25
echo "part 4: exit ${PIPESTATUS[0]} in $(( $(date +%s) - start )) s"

echo "== 5. summary"
"$PY" "$REPO/benchmarks/gpu/summary.py" "$OUT/world1.json" "$OUT/trace.json" > "$OUT/summary.json"
"$PY" -c "
import json
for c in json.load(open('$OUT/summary.json'))['cells']:
    print(f\"{c['part']:<7} {c['id']:<40} {c['status']:<8} {c['device']:<5} loss {c['first_loss']} -> {c['last_loss']}\"
          f\"  peak {c['peak_memory_gib']} GiB  tps {c['tokens_per_s']}  triton kernels {c['triton_kernels']}  wall {c['wall']} s\"
          + (f\"  vs {c['vs']}: lane {c['lane']}, loss rel {c['loss_rel_diff']:.3g}, step-1 grad rel {c['grad_rel_diff_step1']}\" if c['lane'] else ''))"
tar czf "$OUT/runs.tgz" -C "$W" runs 2>/dev/null
cd / && rm -rf "$W" "${SITE:-}"  # (the cells' logs are in runs.tgz)
ls "$OUT"
