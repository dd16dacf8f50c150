#!/usr/bin/env bash
# The default test suite on a machine with a CUDA GPU. There `auto` picks the GPU, so the tests run the
# engine, the trainer (NCCL), the weight sync and supervised training on CUDA, paths that `make test` on
# a CPU machine never reaches. PY (default python3) needs the project's requirements, or their wheels in
# .whl (a lent machine with no index: they are installed under /tmp/site); vivace itself is installed
# (editable) only where PY cannot import it.
#
#   PY=.venv/bin/python scripts/gpu_tests.sh     # logs and junit.xml under $OUT (default runs/gpu_tests)
#   WORKERS=8 scripts/gpu_tests.sh -k engine
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/gpu_tests}
PY=${PY:-python3}
mkdir -p "$OUT"
if [ -d .whl ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || { echo "could not install the wheels in .whl"; exit 1; }
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
"$PY" -c "import vivace" 2>/dev/null || "$PY" -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null \
    || { echo "could not install vivace"; exit 1; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available())" | tee -a "$OUT/gpu.txt"
"$PY" -m pytest -q -n "${WORKERS:-12}" --dist worksteal -p no:cacheprovider \
    --junitxml "$OUT/junit.xml" -rfE "$@" 2>&1 | tee "$OUT/pytest.log"
