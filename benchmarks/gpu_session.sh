#!/bin/bash
# One visit to the GPU machine: the kernel tests there, then benchmarks/gpu_engine.py (parity, kernel
# profile, speed), then `strata bench ab` strata against itself (the token gate, end to end).
#   bash benchmarks/gpu_session.sh [gpu_engine.py arguments]
# SKIP_TESTS=1 / SKIP_AB=1 leave out the first / last part. Needs the gguf wheel in .whl (the machine has no gguf); writes logs under $OUT.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/gguf*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/strata-out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
git log -1 --format='commit %h %s' 2>/dev/null
tests="tests/test_kernels_quant_matvec.py tests/test_kernels_quant_matmul.py tests/test_kernels_fused.py
    tests/test_kernels_paged_attention.py tests/test_kernels_paged_prefill_attention.py tests/test_kernels_dequant_packed.py
    tests/test_model_kernel_path.py"
[ -n "${SKIP_TESTS:-}" ] || timeout 120 python3 -m pytest -q --noconftest -p no:cacheprovider $tests >"$OUT/pytest.txt" 2>&1
[ -n "${SKIP_TESTS:-}" ] || echo "kernel tests: $(tail -1 "$OUT/pytest.txt")"
[ -n "${SKIP_TESTS:-}" ] || grep -E "^(FAILED|ERROR)" "$OUT/pytest.txt" | head -20
python3 benchmarks/gpu_engine.py --profile 0.5b,7b "$@" 2>&1 | grep -v Warning | tee "$OUT/engine.txt"
model=/tmp/strata-synth/qwen2.5-0.5b.gguf
[ -f $model ] || python3 -m strata.cli synth qwen2.5-0.5b $model
[ -n "${SKIP_AB:-}" ] || timeout 150 python3 -m strata.cli bench ab strata strata --device cuda --model $model -p 512 -n 128 \
    --pairs 2 --out "$OUT/ab" 2>&1 | tail -12
