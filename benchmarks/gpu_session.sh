#!/bin/bash
# One visit to the GPU machine, in stages (each one's log goes under $OUT):
#   1. the kernel tests compiled there                                   (SKIP_TESTS=1 leaves it out)
#   2. benchmarks/gpu_engine.py: parity, kernel profile, speed            (SKIP_ENGINE=1)
#   3. `strata bench ab strata strata --device cuda`: the token gate      (SKIP_AB=1)
#   4. benchmarks/gpu_matvec_graph.py: matvec tiles timed in graphs       (MATVEC_SWEEP=1 adds it)
#   4h. benchmarks/gpu_attention_graph.py (runs before 4a): paged decode attention configs in graphs
#      (ATTN_SWEEP=1 adds it, ATTN_ARGS to it, ATTN_TIMEOUT, default 300 s)
#   4a. benchmarks/gpu_q4k_rows.py: the row-interleaved Q4_K kernel against the planar default in
#      graphs (ROWS_SWEEP=1 adds it, ROWS_ARGS to it; about 5 minutes for the 7B's shapes)
#   4b. Q4_K layouts on the 7B: `bench ab strata:q4k_layout=blocks strata:q4k_layout=planar` (LAYOUT_A
#      and LAYOUT_B name others, e.g. planar and rows), decode b1, decode of 8 sequences, prefill
#      2,048, (asked for) 64 sequences (LAYOUT_AB=1 adds it; about 3 minutes)
#   4c. int8 x for Q6_K, Q8_0, Q5_0 end to end: `bench ab strata strata:int8_x=...`, decode b1 on
#      the 7B (Q4_K+Q6_K) and the 0.5B (all four types) (INT8_AB=1 adds it; about 2 minutes)
#   4d. any `strata bench ab` pairs: AB_CASES="name:args;name:args" (MODEL7, MODEL15 and MODEL05 in the
#      args stand for the synthetic 7B, 1.5B and 0.5B files; a strata@REV arm needs this tree's .git: `carry` refuses
#      .git, so copy it here as .gitcopy, carry that, and start the command with `rm -rf .git && mv
#      .gitcopy .git` (the machine has a .git of another commit; never `git checkout` there)
#   4e. Nsight Compute on single kernels: NCU_CASES="ncu_matvec.py args;..." (NCU_SECTIONS, ncu's
#      section options, replace the default: speed of light, occupancy,
#      warp stalls; full reports in $OUT/ncu.txt)
#   4f. a prefill's kernels against its wall time on the 0.5B and 7B: `gpu_engine.py --profile-prefill`
#      and prefill_host.py (PREFILL_HOST=1 adds it; PREFILL_TOKENS, default 512)
#   4g. gpu_matmul.py once per Q4_K layout (MATMUL_LAYOUTS="planar rows", MATMUL_ARGS to it)
#   5. the CUDA llama.cpp peer: build, llama-bench, bench ab vs strata    (PEER=1 adds it; carry .peer)
#      The build (~5.5 min) starts first, in the background, and stage 5 waits for it; diag.py shows
#      in which process states llama-cpp-python loads the model (the bench's llamacpp arm still
#      crashes on the GPU: benchmarks/RESULTS.md, 2026-12-04).
#   bash benchmarks/gpu_session.sh [gpu_engine.py arguments]
# PYTEST_K (a -k expression, e.g. "int8 or planar"), TESTS (test files in place of the list below:
# the whole list takes more than one 10-minute call since the prefill graphs) and TESTS_TIMEOUT
# narrow stage 1; LAYOUT_CASES picks stage
# 4b's cases (default "b1 b8 prefill"); MATVEC_ARGS goes to stage 4.
# Needs the gguf wheel in .whl (the machine has no gguf). Stages 4 and 5 take about 4 and 8 minutes:
# give them their own call (SKIP_TESTS=1 SKIP_ENGINE=1 SKIP_AB=1 MATVEC_SWEEP=1 ...).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/gguf*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/strata-out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
git log -1 --format='commit %h %s' 2>/dev/null
if [ -n "${PEER:-}" ]; then
    JOBS=${PEER_JOBS:-12} bash benchmarks/llamacpp_cuda/build.sh >"$OUT/peer_build.txt" 2>&1 &
    peer_build=$!
fi
tests=${TESTS:-"tests/test_kernels_quant_matvec.py tests/test_kernels_quant_matmul.py tests/test_kernels_fused.py
    tests/test_kernels_paged_attention.py tests/test_kernels_paged_prefill_attention.py
    tests/test_kernels_dequant_packed.py tests/test_model_kernel_path.py tests/test_act_in_quant.py
    tests/test_quant_in_norm.py tests/test_kernels_matvec_variants.py tests/test_decode_settings.py
    tests/test_concurrent_projections.py tests/test_dense_copy.py
    tests/test_cuda_graphs_bound.py tests/test_widen_to_stack.py
    tests/test_kernels_q4k_rows.py tests/test_kernels_q6k_rows.py tests/test_prefill_graphs.py
    tests/test_attention_graph_replays.py tests/test_rows_preload.py"}
if [ -z "${SKIP_TESTS:-}" ]; then
    timeout ${TESTS_TIMEOUT:-150} python3 -m pytest -q --noconftest -p no:cacheprovider $tests ${PYTEST_K:+-k "$PYTEST_K"} \
        >"$OUT/pytest.txt" 2>&1
    echo "kernel tests: $(tail -1 "$OUT/pytest.txt")"
    grep -E "^(FAILED|ERROR)" "$OUT/pytest.txt" | head -20
fi
[ -n "${SKIP_ENGINE:-}" ] || python3 benchmarks/gpu_engine.py --profile 0.5b,7b "$@" 2>&1 | grep -v Warning | tee "$OUT/engine.txt"
model=/tmp/strata-synth/qwen2.5-0.5b.gguf
[ -f $model ] || { mkdir -p /tmp/strata-synth && python3 -m strata.cli synth qwen2.5-0.5b $model; }
[ -n "${SKIP_AB:-}" ] || timeout 150 python3 -m strata.cli bench ab strata strata --device cuda --model $model \
    -p 512 -n 128 --pairs 2 --out "$OUT/ab" 2>&1 | tail -12
[ -z "${MATVEC_SWEEP:-}" ] || timeout 300 python3 benchmarks/gpu_matvec_graph.py ${MATVEC_ARGS:-} 2>&1 |
    tee "$OUT/matvec.txt" | tail -24
[ -z "${ATTN_SWEEP:-}" ] || timeout ${ATTN_TIMEOUT:-300} python3 benchmarks/gpu_attention_graph.py ${ATTN_ARGS:-} \
    --out "$OUT" 2>&1 | tee "$OUT/attention.txt" | grep -v " us$" | tail -14
[ -z "${ROWS_SWEEP:-}" ] || timeout 420 python3 benchmarks/gpu_q4k_rows.py ${ROWS_ARGS:---models 7b} 2>&1 |
    tee "$OUT/rows.txt" | grep -v "^7b\|^1.5b" | tail -12
if [ -n "${LAYOUT_AB:-}" ]; then
    [ -f /tmp/strata-synth/qwen2.5-7b.gguf ] || python3 -m strata.cli synth qwen2.5-7b /tmp/strata-synth/qwen2.5-7b.gguf >/dev/null
    layouts="strata:q4k_layout=${LAYOUT_A:-blocks} strata:q4k_layout=${LAYOUT_B:-planar}"
    pair="$layouts --device cuda --model /tmp/strata-synth/qwen2.5-7b.gguf"
    for case in "b1:-p 512 -n 128" "b8:-b 8 -p 128 -n 64" "prefill:--mode prefill -p 2048" \
        "b64:-b 64 -p 128 -n 64"; do
        [[ " ${LAYOUT_CASES:-b1 b8 prefill} " == *" ${case%%:*} "* ]] || continue
        echo "== 7B Q4_K layouts ${LAYOUT_A:-blocks} -> ${LAYOUT_B:-planar}, ${case%%:*}"
        timeout 150 python3 -m strata.cli bench ab $pair --gate self --pairs 2 ${case#*:} --out /tmp/ab_layout \
            2>&1 | grep -E "tok_s|gate"
        cp /tmp/ab_layout/summary.json "$OUT/ab_layout_${case%%:*}.json"
    done
fi
if [ -n "${INT8_AB:-}" ]; then
    [ -f /tmp/strata-synth/qwen2.5-7b.gguf ] || python3 -m strata.cli synth qwen2.5-7b /tmp/strata-synth/qwen2.5-7b.gguf >/dev/null
    for case in "7b:Q4_K+Q6_K" "0.5b:Q4_K+Q6_K+Q8_0+Q5_0"; do
        echo "== int8 x ${case#*:} on the ${case%%:*}, decode b1"
        timeout 150 python3 -m strata.cli bench ab strata "strata:int8_x=${case#*:}" --device cuda \
            --model "/tmp/strata-synth/qwen2.5-${case%%:*}.gguf" --gate self --pairs 3 -p 512 -n 128 \
            --out /tmp/ab_int8 2>&1 | grep -E "tok_s|gate"
        cp /tmp/ab_int8/summary.json "$OUT/ab_int8_${case%%:*}.json"
    done
fi
if [ -n "${AB_CASES:-}" ]; then
    [[ "$AB_CASES" != *MODEL7* ]] || [ -f /tmp/strata-synth/qwen2.5-7b.gguf ] ||
        python3 -m strata.cli synth qwen2.5-7b /tmp/strata-synth/qwen2.5-7b.gguf >/dev/null
    [ -d .git ] && echo "git: $(git log -1 --format=%h)" || echo "no .git here: strata@REV arms will fail"
    [[ "$AB_CASES" != *MODEL15* ]] || [ -f /tmp/strata-synth/qwen2.5-1.5b.gguf ] ||
        python3 -m strata.cli synth qwen2.5-1.5b /tmp/strata-synth/qwen2.5-1.5b.gguf >/dev/null
    IFS=';' read -ra cases <<<"$AB_CASES"
    for case in "${cases[@]}"; do
        args=${case#*:}; args=${args//MODEL7//tmp/strata-synth/qwen2.5-7b.gguf}; args=${args//MODEL05/$model}
        args=${args//MODEL15//tmp/strata-synth/qwen2.5-1.5b.gguf}
        echo "== ${case%%:*}: bench ab $args"
        rm -rf /tmp/ab_case  # a failed case leaves no summary, not the previous case's
        timeout 200 python3 -m strata.cli bench ab $args --device cuda --out /tmp/ab_case 2>&1 | grep -E "tok_s|gate|rror"
        cp /tmp/ab_case/summary.json "$OUT/ab_${case%%:*}.json" 2>/dev/null
        cp /tmp/ab_case/runs.json "$OUT/ab_${case%%:*}_runs.json" 2>/dev/null  # each run's times, for outliers
    done
fi
if [ -n "${NCU_CASES:-}" ]; then
    IFS=';' read -ra cases <<<"$NCU_CASES"
    for case in "${cases[@]}"; do
        echo "== ncu: $case" | tee -a "$OUT/ncu.txt"
        timeout 120 ncu --clock-control none -k regex:'matvec|matmul' --launch-skip 3 --launch-count 1 \
            ${NCU_SECTIONS:---section SpeedOfLight --section Occupancy --section WarpStateStats --section \
            LaunchStats --section MemoryWorkloadAnalysis} python3 benchmarks/ncu_matvec.py $case >>"$OUT/ncu.txt" 2>&1
        grep -E "^  [a-z_0-9]+|Duration|DRAM Throughput|Memory Throughput|Compute \(SM\)|Registers Per|Achieved Occ|Theoretical Occ|Stall" \
            "$OUT/ncu.txt" | tail -n +1 | grep -v "^==" | tail -14
    done
fi
if [ -n "${PREFILL_HOST:-}" ]; then
    # A prefill's kernels (eager profile) against its wall time (prefill_host.py), 0.5B and 7B.
    for short in 0.5b 7b; do
        path=/tmp/strata-synth/qwen2.5-$short.gguf
        [ -f $path ] || python3 -m strata.cli synth qwen2.5-$short $path >/dev/null
        timeout 200 python3 benchmarks/gpu_engine.py --skip-parity --layouts "" --profile $short \
            --profile-prefill ${PREFILL_TOKENS:-512} 2>&1 | grep -v Warn | head -6
        timeout 200 python3 benchmarks/prefill_host.py $path -p ${PREFILL_TOKENS:-512} >"$OUT/host_$short.txt" 2>&1
        grep -A12 "prefill of" "$OUT/host_$short.txt" | cut -c1-150
    done
fi
if [ -n "${MATMUL_LAYOUTS:-}" ]; then
    # gpu_matmul.py under each Q4_K layout named, e.g. MATMUL_LAYOUTS="planar rows"
    # MATMUL_ARGS="--types Q4_K --shapes 7b --batches 16,64".
    for layout in $MATMUL_LAYOUTS; do
        echo "== gpu_matmul.py, STRATA_Q4K_LAYOUT=$layout"
        STRATA_Q4K_LAYOUT=$layout timeout 200 python3 benchmarks/gpu_matmul.py ${MATMUL_ARGS:-} 2>&1 |
            tee "$OUT/matmul_$layout.txt" | grep -E "^\||checks"
    done
fi
if [ -n "${PEER:-}" ]; then
    wait $peer_build || { tail -20 "$OUT/peer_build.txt"; exit 1; }
    tail -5 "$OUT/peer_build.txt"
    for l in /tmp/site/llama_cpp/lib/lib{ggml-cuda,ggml-base,llama}.so; do
        echo "$l: exports $(nm -D --defined-only "$l" | c++filt | grep -c 'std::') std:: symbols;" \
            "$(nm -D --defined-only "$l" | c++filt | grep -c 'codecvt') of codecvt; $(ldd "$l" | grep stdc++)"
    done
    timeout 200 python3 benchmarks/llamacpp_cuda/diag.py $model --gdb 2>&1 | tee "$OUT/peer_diag.txt"
    /tmp/llama-build/bin/llama-bench -m $model -p 512,2048 -n 128 -fa 1 -ngl 99 -r 3 2>&1 | tee "$OUT/llama_bench.txt"
    # The ab folder holds many files; $OUT gets its summary and the peer's log only.
    timeout 200 python3 -m strata.cli bench ab strata llamacpp --device cuda --model $model -p 512 -n 128 \
        --pairs 2 --out /tmp/ab_llamacpp 2>&1 | tail -12
    cp /tmp/ab_llamacpp/summary.json "$OUT/ab_llamacpp_summary.json" 2>/dev/null
    tail -c 20000 /tmp/ab_llamacpp/logs/B.log >"$OUT/ab_llamacpp_B.log" 2>/dev/null
fi
