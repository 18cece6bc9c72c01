"""One verify forward over a whole draft tree, through the model's public decoder, and the wrap-time probe for it.

The tree's rows [pending, *tree.tokens] are appended after the cache's contents in one forward. Each row attends
to every cached token and to its own ancestors (itself included), and sits at position `past + depth`, so its
hidden state is the one a plain forward over its path would give. Both go in through `transformers`' public
arguments: a 4D `attention_mask` is used as given by the sdpa and eager attention paths (`masking_utils` returns
a 4D mask unchanged), and `position_ids`. No modeling code is copied. Knows nothing about verification.
"""
from __future__ import annotations

import weakref

import torch
from transformers import DynamicCache

from selfspec.attention_backends import additive_mask, engine_attention_context
from selfspec.cache import KVCache
from selfspec.cache_layer import FULL_ATTENTION_LAYERS
from selfspec.draft_length.verify_cost import prior_verify_cost
from selfspec.kernel.quantized import quantized_weights
from selfspec.target import TargetModel
from selfspec.tree.draft_tree import DraftTree


def tree_attention_mask(tree: DraftTree, past_length: int, dtype: torch.dtype, device) -> torch.Tensor:
    """[1, 1, num_nodes + 1, past_length + num_nodes + 1] additive mask: 0 where attended, finfo(dtype).min elsewhere.

    Additive in the model's dtype because eager attention adds the mask to the scores (sdpa takes the same).
    """
    rows = tree.num_nodes + 1
    attended = torch.ones(rows, past_length + rows, dtype=torch.bool, device=device)
    attended[:, past_length:] = tree.ancestor_mask().to(device)
    return additive_mask(attended, dtype)[None, None]


def tree_forward(target: TargetModel, pending: int, tree: DraftTree, cache: KVCache) -> torch.Tensor:
    """[pending, *tree.tokens] appended after the cache's contents -> [num_nodes + 1, hidden] final hidden states.

    Row 0 is the pending token (the root), row i + 1 node i. The cache grows by num_nodes + 1 entries in row order;
    `tree_cache.keep_path` keeps the accepted path's entries afterwards.
    """
    past = cache.length
    device = target.device
    ids = torch.cat([torch.tensor([int(pending)], device=device), tree.tokens.to(device)])  # [num_nodes + 1]
    positions = past + tree.position_offsets().to(device)  # [num_nodes + 1]
    mask = tree_attention_mask(tree, past, target.dtype, device)
    return target.decode(ids[None], cache.hf_cache, mask, positions[None])[0]


# A probe with siblings at two depths, a deeper branch and a leaf next to it: rows 0..6.
_PROBE_PARENTS = [-1, -1, 0, 0, 2, 1]
_PROBE_PROMPT = 3
# Largest difference allowed between a node's tree-forward state and a plain forward's, relative to the largest
# entry: loose enough for kernels that sum in another order, far tighter than what an ignored mask changes. Measured
# by probing trees against plain forwards: SmolLM2 in bfloat16 on an H200 differs by up to 0.018 (1e-2 refused its trees),
# and by 0.09-2.1 per node were the mask ignored (0.06-0.24 for the 6.8M reference model in float32); float32 by 0.
PROBE_TOLERANCE, PROBE_TOLERANCE_16BIT = 1e-4, 5e-2
# model -> what its probe passed with (attention implementation, sliding window, decoder, dtype, device); a model
# wrapped again is not probed again. Keys hold the model weakly; the values hold no tensors.
_TREE_PROBE_PASSED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


@torch.no_grad()
def check_tree_support(target: TargetModel) -> None:
    """Wrap-time check that a tree forward gives every node the hidden state of a plain forward over its path.

    Raises NotImplementedError, saying what to do, for families whose attention ignores or rejects a custom 4D mask
    (e.g. flash-attention kernels) or whose cache cannot keep a path (sliding-window or recurrent layers).
    """
    name = type(target.model).__name__
    attn = getattr(target.model.config, "_attn_implementation", None)
    sliding = getattr(target.model.config, "sliding_window", None)
    checked = (attn, sliding, id(target.decoder), target.dtype, target.device)
    if _TREE_PROBE_PASSED.get(target.model) == checked:
        return
    with engine_attention_context(target.model):  # (as the engine runs its forwards: int8 products, ordered attention)
        _probe_tree_forward(target, name, attn)
    _TREE_PROBE_PASSED[target.model] = checked


def _probe_tree_forward(target: TargetModel, name: str, attn) -> None:
    cache = target.new_cache()
    if any(type(layer) not in FULL_ATTENTION_LAYERS for layer in cache.hf_cache.layers):
        kinds = sorted({type(layer).__name__ for layer in cache.hf_cache.layers})
        raise NotImplementedError(
            f"tree drafts need full-attention cache layers; {name} uses {kinds}. Use a chain draft (tree_size=None)."
        )
    vocab = target.vocab_size
    prompt = (torch.arange(_PROBE_PROMPT, device=target.device) * 7 + 3) % vocab
    tokens = (torch.arange(len(_PROBE_PARENTS), device=target.device) + 3) % vocab  # siblings differ
    tree = DraftTree(tokens, torch.tensor(_PROBE_PARENTS, device=target.device))
    try:
        target.forward(prompt[:-1], cache)
        got = tree_forward(target, int(prompt[-1]), tree, cache)[:, : target.hidden_size]  # [num_nodes + 1, hidden]
    except (TypeError, ValueError, RuntimeError) as err:
        raise NotImplementedError(
            f"{name} (attn_implementation={attn!r}) rejected a custom 4D attention mask ({err}); tree drafts need "
            "attn_implementation='sdpa' or 'eager'. Use a chain draft (tree_size=None) or reload the model with one."
        ) from err
    refusal = (f"{name} (attn_implementation={attn!r}) does not honour a custom 4D attention mask with position ids: "
               "a tree forward {how}. Tree drafts need attn_implementation='sdpa' or 'eager'; use a chain draft "
               "(tree_size=None) otherwise.")
    if got.shape[0] != tree.num_nodes + 1:
        raise NotImplementedError(refusal.format(how=f"gave {got.shape[0]} states for {tree.num_nodes + 1} tokens"))
    tolerance = PROBE_TOLERANCE_16BIT if got.dtype in (torch.float16, torch.bfloat16) else PROBE_TOLERANCE
    # One plain causal forward over every root-to-leaf path, as a batch, checks every row of the tree (the root
    # included). Paths are right-padded to the longest: in a causal forward a row never sees what follows it.
    paths = [tree.path_to(leaf) for leaf in range(tree.num_nodes) if not tree.children[leaf + 1]]
    longest = max(len(path) for path in paths)
    ids = torch.stack([torch.cat([prompt, tokens[path], prompt[:1].repeat(longest - len(path))]) for path in paths])
    # (through the target's own forward, as decoding computes it: over int8 products the kernel's layers)
    expected = target.decode(ids, DynamicCache(config=target.model.config))[:, len(prompt) - 1:, : target.hidden_size]
    for path, path_states in zip(paths, expected):
        for row, state in zip([0] + [node + 1 for node in path], path_states):
            difference = float((got[row] - state).abs().max() / state.abs().max().clamp_min(1.0))
            if difference > tolerance:
                raise NotImplementedError(refusal.format(
                    how=f"differs from a plain forward over the same path (by {difference:.3g} of the largest "
                    f"entry; rounding is allowed {tolerance:g})"
                ))


# "auto" tree size on an accelerator: the most nodes whose verify forward costs at most this many one-token decodes on
# the prior curve (47 on an H200, where trees were measured: SmolLM2's EAGLE tree of 47 2.16x of generate,
# its chain 1.22x). A choice, not yet a measurement: a step that verifies N nodes must then accept about one more
# token than a plain step to pay. The prior, not the learned curve, so that one device always drafts the same tree
# shape. On a CPU without the few-row kernel (verification through F.linear: 1.5-2.4
# decodes for 1-16 drafts) "auto" drafts chains: trees were not measured to pay there.
AUTO_TREE_VERIFY_COST = 2.0
MAX_TREE_SIZE = 64
# "auto" on a CPU whose few-row products run through selfspec's kernel (selfspec/kernel/few_row_linear.py), measured:
# SmolLM2 with its EAGLE head on the AMD EPYC, greedy, trees of 6 / 10 / 16 / 24 nodes at 1.49x / 1.66x / 1.53x /
# 1.55x of generate (the chain 1.54x), sampled 1.32x / 1.48x / 1.33x / 1.20x (the chain 1.62x)
# (3 prompts x 2 repeats, 96 tokens): 10 the best tree in both modes; sampled, the chain was faster in that
# sweep but not in the benchmark's table (tree of 10 1.56x, chain 1.49x). Wider trees verify fewer tokens per
# forward there: "auto" prices a tree d levels deep at its most nodes, min(N, 4 + 16 (d - 1)), so with N >= 16 it
# mostly drafts one level. With cheaper tree drafting, the same sweep: greedy 6 / 10 / 16 at 1.72x / 1.61x / 1.52x
# (chain 1.45x), sampled 1.43x / 1.46x / 1.38x (chain 1.50x): 6 and 10 within the noise of each other; 10 kept.
AUTO_TREE_SIZE_FEW_ROW_KERNEL = 10
# ... and "auto" there keeps only the nodes whose cumulative draft probability exceeds this (`DraftContext.
# min_node_probability`): each node verified costs ~0.03 decodes there (the kernel's curve from 4 to 10 nodes), and
# the EAGLE head's draft probabilities are about its acceptance rates at every depth
# (accepted 1.1-1.3x p), so a node of probability p buys about p
# tokens, worth p / 1.7 decodes at 1.7x. Measured (Intel Xeon, SmolLM2 EAGLE greedy, trees of 10,
# medians of 9-12 paired runs): floors 0 / 0.03 / 0.06 at 1.62x / 1.66x / 1.59x
# of generate (9.1 / 7.4 / 4.5 nodes per step), then 0 / 0.02 / 0.03 at 1.65x / 1.72x / 1.68x (9.3 / 8.7 / 7.5 nodes;
# tokens per forward 2.54 / 2.55 / 2.45); trees of 16 with floors 0 / 0.03: 1.50x / 1.63x.
AUTO_MIN_NODE_PROBABILITY_FEW_ROW_KERNEL = 0.02


def resolve_tree_size(tree_size, device, few_row_kernel: bool = False) -> int:
    """None or 0 -> 0 (chains); an int N >= 1 -> N; "auto" -> on a CPU with the few-row kernel the size measured best
    there, on an accelerator the node budget its prior curve affords, on a CPU without the kernel 0 (chains)."""
    if tree_size is None:
        return 0
    if tree_size == "auto":
        if _kernel_cpu(device, few_row_kernel):
            return AUTO_TREE_SIZE_FEW_ROW_KERNEL
        if torch.device(device).type == "cpu":
            return 0
        cost = prior_verify_cost(torch.device(device))
        return max(n for n in range(1, MAX_TREE_SIZE + 1) if n == 1 or cost(n) <= AUTO_TREE_VERIFY_COST)
    if isinstance(tree_size, bool) or not isinstance(tree_size, int) or tree_size < 0:
        raise ValueError(f'tree_size must be None, an integer >= 0 (0 = chains) or "auto", got {tree_size!r}')
    return tree_size


def choose_tree_size(tree_size, drafter, target: TargetModel, few_row_kernel: bool = False) -> tuple[int, str | None]:
    """A wrapper's node budget per step (0: chains) and, when "auto" chose chains, why.

    An int N is checked (`check_tree_drafting` refuses, saying what to do, where trees cannot be verified). "auto" is
    a tree only where one can pay and be verified: a device where trees were measured to pay (`resolve_tree_size`), a
    drafter whose trees were measured to pay (`auto_trees`: EAGLE), a model whose attention honours a custom 4D mask
    (`check_tree_support`); chains elsewhere (Medusa, n-gram, early exit, speculation off, a user's drafter that does
    not set `auto_trees`, a flash-attention model, a CPU without the few-row kernel). Medusa's heads guess each
    position alone, and their trees measured within noise of their chains on SmolLM2 (1.15x / 1.31x greedy
    / sampled against 1.13x / 1.18x; in a second run 1.14x / 1.20x against 1.18x / 1.10x) while random Medusa heads as
    trees lost more than as chains on the reference model (0.92x against 0.95x of speculation off, sampled): an int `tree_size` still gives them trees."""
    size = resolve_tree_size(tree_size, target.device, few_row_kernel)
    if tree_size != "auto":
        if size:
            check_tree_drafting(drafter, target)
        return size, None
    if not size:
        return 0, "trees were not measured to pay on a CPU without selfspec's few-row kernel"
    if not getattr(drafter, "auto_trees", False):
        return 0, (f"{type(drafter).__name__} drafts chains unless given a tree size (auto_trees is not set: its trees "
                   "were not measured to pay)")
    if quantized_weights(target.model):
        return 0, QUANTIZED_CHAINS
    try:
        check_tree_support(target)
    except NotImplementedError as err:
        return 0, str(err)
    except Exception as err:  # a family whose tree forward fails otherwise: "auto" must not break what chains run
        return 0, (f"a tree forward of {type(target.model).__name__} failed ({type(err).__name__}: {err}); "
                   "tree_size=N would raise it")
    return size, None


# With a GGUF file's blocks kept quantized, a decode reads a sixth of the bytes and a tree's extra rows cost
# relatively more: on SmolLM2 Q4_1 with the shipped EAGLE head (python -m selfspec.bench --model smollm2, one thread,
# AVX2 CPU) trees of 10 gave 1.21x / 1.09x / 1.09x of speculation off (greedy / sampled / seeded) at a verify cost of
# 1.95 decodes for 10 nodes, chains 1.39x / 1.20x / 1.17x.
QUANTIZED_CHAINS = ("the model's weights are kept as quantized GGUF blocks, where trees were measured slower than "
                    "chains (each verified node costs relatively more); tree_size=N still drafts trees")


def resolve_min_node_probability(tree_size, device, few_row_kernel: bool = False) -> float:
    """The cumulative draft probability a tree's node must exceed to be verified: for "auto" trees on a CPU with the
    few-row kernel, where each node verified costs a few hundredths of a decode, the measured floor; else 0.0 (the N
    most probable nodes, whatever their probability: on an accelerator nodes are nearly free)."""
    if tree_size == "auto" and _kernel_cpu(device, few_row_kernel):
        return AUTO_MIN_NODE_PROBABILITY_FEW_ROW_KERNEL
    return 0.0


def _kernel_cpu(device, few_row_kernel: bool) -> bool:
    """A CPU whose few-row products run through selfspec's kernel: where "auto" trees' settings were measured."""
    return bool(few_row_kernel) and torch.device(device).type == "cpu"


def check_tree_drafting(drafter, target: TargetModel) -> None:
    """Wrap-time refusals for tree drafts: early exit (its shared work has no tree path) and models whose attention
    does not honour a custom 4D mask (`check_tree_support`)."""
    from selfspec.drafters.early_exit import EarlyExitDrafter

    if isinstance(drafter, EarlyExitDrafter):
        raise ValueError(
            "tree_size cannot be combined with drafter='early_exit': its drafts share their first layers' work with "
            "verification, which only a chain can reuse. Use tree_size=None, or drafter='medusa' or 'eagle' for trees"
        )
    check_tree_support(target)
