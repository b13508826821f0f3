#!/usr/bin/env bash
# Fetch, on a machine with PyPI access, the wheels the GPU machine lacks (it has torch but no network, no orjson,
# no nvtx, no perfetto): CPython 3.12, manylinux x86_64, into .gpu-wheels/ (git-ignored). The device run gets the
# folder as a carried path (carry: [".gpu-wheels"]) and tests/gpu/device_check.sh installs from it offline.
# perfetto (pure Python) decodes merged traces for check_trace; its generated protos need a protobuf runtime at
# least as new as the one they were generated with, so a protobuf wheel comes too, installed there only when the
# machine's own protobuf is too old for them.
#
#   bash tests/gpu/wheels.sh            # PY_VERSION=3.12 by default
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST=.gpu-wheels
PY_VERSION=${PY_VERSION:-3.12}
mkdir -p "$DEST"
# orjson and nvtx publish manylinux_2_17 wheels (also tagged manylinux2014); newer releases may publish only
# manylinux_2_28 ones, so several platform tags are offered (the GPU machine's glibc is recent).
PLATFORMS=(--platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64)
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version "$PY_VERSION" --implementation cp \
  "${PLATFORMS[@]}" --dest "$DEST" "orjson>=3.9" "nvtx>=0.2.10" "perfetto>=0.10" "protobuf>=6.31.1,<8"
ls -l "$DEST"
for pkg in orjson nvtx protobuf; do  # protobuf's wheels are cp39-abi3
  ls "$DEST"/"$pkg"-*cp*manylinux*x86_64*.whl >/dev/null 2>&1 \
    || { echo "wheels.sh: no cp${PY_VERSION/./} manylinux x86_64 wheel for $pkg in $DEST" >&2; exit 1; }
done
ls "$DEST"/perfetto-*-py3-none-any.whl >/dev/null 2>&1 \
  || { echo "wheels.sh: no perfetto wheel in $DEST" >&2; exit 1; }
du -sh "$DEST"
