#!/usr/bin/env bash
# selfspec on a GPU, in about 5 minutes (at most 7.5): (1) the cost of verifying k tokens against decoding one,
# k = 1..64, on a 1B-class Llama with random weights in bfloat16; (2) the benchmark on the shipped reference model
# in bfloat16, chains and trees of 47 nodes (the defaults, and --chains, --tree-size 47), then (3) in float32. Results (8 files) go to $OUT (default ./gpu-check):
#   gpu_check.log  verify_cost.json  bench-bfloat16.{json,md,png}  bench-float32.{json,md,png}
#
#   bash examples/gpu_check.sh                  # from anywhere; OUT=/some/dir bash examples/gpu_check.sh
#
# Uses the machine's own torch (CUDA) and transformers; installs nothing from a registry. selfspec is run from this
# checkout (PYTHONPATH), not installed. If that machine's transformers is older than the one selfspec is tested with
# (5.24; e.g. an image with 5.17), carry the wheel: on a machine with a registry, from the repository root,
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 -d .whl transformers==5.24.0
# and every wheel in .whl/ is put first on the path here (the wheels' own dependencies must already be there).
# The benchmark's "same tokens as generate" column is the exactness check under whatever versions ran.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-check}
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_check.log") 2>&1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=1
started=$(date +%s)
stamp() { echo "=== $(( $(date +%s) - started ))s: $*"; }

if compgen -G ".whl/*.whl" >/dev/null; then
    stamp "installing the carried wheels: $(ls .whl)"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/selfspec-site .whl/*.whl \
        && export PYTHONPATH="/tmp/selfspec-site:$PYTHONPATH"
fi
nvidia-smi -L || true
python3 - <<'EOF' || { echo "gpu_check: no CUDA device visible to torch; nothing to measure"; exit 1; }
import platform, torch, transformers
print(f"python {platform.python_version()}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
      f"transformers {transformers.__version__}")
assert torch.cuda.is_available()
print(torch.cuda.get_device_name())
EOF

stamp "1/3 verify cost, 1B-class random Llama, bfloat16"
timeout 80 python3 examples/verify_cost.py --device cuda --dtype bfloat16 --json "$OUT/verify_cost.json" \
    || echo "gpu_check: verify cost failed or timed out (exit $?)"

# 3 held-out prompts x 2 rounds x 64 tokens; every selfspec drafter also at a fixed k = 3 (in bfloat16 on an
# H200 "auto" hardly drafted where k = 3 ran 1.57x); the sweep (k = 0..6) and the useless-drafts check on 1 prompt;
# without transformers' early exit (slow, and not ours). Each run writes its JSON and table after every phase, and stops
# after --time-limit seconds, so a timeout still leaves the phases that finished. (89 s on this project's CPU without --fixed-k.)
for dtype in bfloat16 float32; do
    stamp "$([ $dtype = bfloat16 ] && echo 2/3 || echo 3/3) benchmark, reference model, $dtype"
    timeout 180 python3 -m selfspec.bench --device cuda --dtype $dtype --chains --tree-size 47 --num-prompts 3 --repeats 2 \
        --max-new-tokens 64 --sweep-max 6 --sweep-prompts 1 --useless-prompts 1 --fixed-k 3 --skip "transformers early exit" \
        --time-limit 150 --out "$OUT/bench-$dtype" \
        || echo "gpu_check: benchmark ($dtype) failed or timed out (exit $?)"
done
stamp "done"
