#!/usr/bin/env bash
# Install on the device what part N-1 of tools/device_wheels.py's packing completes (call N of a warm machine,
# carry [".whl-device/partN-1"]; out/ is git-ignored and kept while the machine is warm). Call 1 installs the base
# tar (fla, transformers) whole; every call keeps its slice of the extras' tar; the last part (it holds
# extra.sha256) joins the slices, checks the tar's SHA-256 and installs the extras (duckdb, ray). Wheels go to
# out/site: run with PYTHONPATH=$PWD/out/site:$PWD. Exits 2 when an install or the checksum fails.
set -uo pipefail
n=${1:?usage: bash tools/device_install.sh N (the call, from 1)}
part=.whl-device/part$((n - 1))
[ -d "$part" ] || { echo "$part is not here: carry it with this call"; exit 2; }
pip_in() { python3 -m pip install -q --no-index --no-deps --no-compile --target out/site "$@"; }
mkdir -p out/wheels out/site out/blob out/extra
if [ -f "$part/base.tar" ]; then
  tar xf "$part/base.tar" -C out/wheels && pip_in out/wheels/*.whl || { echo "install of $part/base.tar failed"; exit 2; }
fi
cp "$part"/extra.part* out/blob/ 2>/dev/null
if [ -f "$part/extra.sha256" ]; then
  cat out/blob/extra.part* >out/extra.tar && sha256sum -c "$part/extra.sha256" \
    && tar xf out/extra.tar -C out/extra && pip_in out/extra/*.whl || { echo "extras did not install"; exit 2; }
fi
exit 0
