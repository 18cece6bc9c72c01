#!/usr/bin/env bash
# Train an EAGLE head for SmolLM2-135M-Instruct by self-distillation, then decode with it. A short budget shows the
# steps; the shipped head (examples/smollm2/eagle) had hours of the same (examples/smollm2/README.md).
#
#   bash examples/train_head.sh                    # about 15 minutes on 2 CPU cores
#   BUDGET=3600 bash examples/train_head.sh        # longer: better drafts
set -euo pipefail
cd "$(dirname "$0")/.."
BUDGET=${BUDGET:-900}
OUT=${OUT:-runs/my-eagle}
export TOKENIZERS_PARALLELISM=false

# 1. The model answers the project's chat prompts (training/prompts.py); its final hidden states are recorded as it
#    writes (resumable shards). Training never runs the base again.
python -m training.chat_data --model smollm2 --out runs/my-chat-data --time-budget $((BUDGET / 2))

# 2. The head learns the model's own next-token distribution from those features, over an 8192-token draft
#    vocabulary (the tokens the model writes most). Held-out evaluation at the end goes to $OUT/eval.json.
python -m training.heads --model smollm2 --data runs/my-chat-data --kind eagle --draft-vocab-size 8192 \
    --out "$OUT" --time-budget $((BUDGET / 2))

# 3. Decode with it: the same tokens as model.generate, in fewer forwards.
python examples/demo.py --heads "$OUT"
