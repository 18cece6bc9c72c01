"""How far a tree forward's hidden states are from plain forwards over each node's path, and how far they would be
if the 4D mask were ignored (a causal forward over all nodes): the margin `tree_forward.check_tree_support` needs.

    python3 examples/gpu/tree_probe.py smollm2 bfloat16 cuda [nocudnn]
"""
import sys

import torch

import selfspec.tree.forward as tf
from selfspec.loading import load_model
from selfspec.target import TargetModel
from selfspec.tree.draft_tree import DraftTree

name, dtype, device = sys.argv[1], getattr(torch, sys.argv[2]), torch.device(sys.argv[3])
if "nocudnn" in sys.argv[4:]:
    torch.backends.cuda.enable_cudnn_sdp(False)
target = TargetModel(load_model(name, dtype=dtype, device=device))
cache, vocab = target.new_cache(), target.vocab_size
prompt = (torch.arange(tf._PROBE_PROMPT, device=device) * 7 + 3) % vocab
tokens = (torch.arange(len(tf._PROBE_PARENTS), device=device) + 3) % vocab
tree = DraftTree(tokens, torch.tensor(tf._PROBE_PARENTS, device=device))
with torch.no_grad():
    target.forward(prompt[:-1], cache)
    got = tf.tree_forward(target, int(prompt[-1]), tree, cache)
    causal = target.decoder(input_ids=torch.cat([prompt, tokens])[None], use_cache=False).last_hidden_state[0, 2:]
    for row in range(tree.num_nodes + 1):
        ids = torch.cat([prompt, tokens[tree.path_to(row - 1)]])
        expected = target.decoder(input_ids=ids[None], use_cache=False).last_hidden_state[0, -1]
        scale = expected.abs().max().clamp_min(1.0)
        print(f"{sys.argv[2:]} row {row}: tree {float((got[row] - expected).abs().max() / scale):.4f}, "
              f"mask ignored {float((causal[row] - expected).abs().max() / scale):.4f}", flush=True)
