#!/bin/bash
# Fill .whl/ (or $1) with what the lent GPU's image lacks for the GPU check (benchmarks/gpu/run.sh): torchtitan 0.2.2
# (torch 2.11's torchtitan, the image's torch) and its pure-Python needs, the plugin's own needs, and this plugin as a
# wheel; for the image's Python 3.12 on x86_64 manylinux. The device tool carries at most 64 MiB a call: this stops
# (exit 3) above 60 MiB. Run on a machine with the package index: `bash benchmarks/gpu/wheels.sh`, then carry .whl.
set -eu
DEST=${1:-.whl}
PY=${PYTHON:-python3}
rm -rf "$DEST" && mkdir -p "$DEST"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform any -d "$DEST" \
  torchtitan==0.2.2 torchdata datasets dill multiprocess tyro docstring_parser tomli pydantic pydantic_core \
  annotated_types typing_inspection typing_extensions typeguard ruamel.yaml google-re2 2>&1 | grep -v "^WARNING: Location" || true
"$PY" -m pip wheel -q --no-deps -w "$DEST" . 2>&1 | grep -v "^WARNING: Location" || true
ls "$DEST"/pytest_simplefsdp-*.whl "$DEST"/torchtitan-0.2.2-*.whl >/dev/null || { echo "wheels missing in $DEST"; exit 2; }
mib=$(( $(du -cb "$DEST"/*.whl | tail -1 | cut -f1) / 1048576 ))
echo "$(ls "$DEST"/*.whl | wc -l) wheels, $mib MiB in $DEST"
[ "$mib" -le 60 ] || { echo "over 60 MiB: the device tool carries at most 64 MiB a call"; exit 3; }
