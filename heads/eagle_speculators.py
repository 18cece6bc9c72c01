"""EAGLE heads and the `speculators` package's format (what vLLM loads for EAGLE-3 drafts): detected, and refused
with the reason, because no selfspec layout computes what that format's model computes.

What the format holds, as read in `speculators` 0.9.0 (`speculators/models/eagle3/config.py`, `core.py`,
`model_definitions.py`): config.json with `speculators_model_type: "eagle3"`, `architectures: ["Eagle3Speculator"]`,
`transformer_layer_config` (the draft layer's own config), `draft_vocab_size`, `eagle_aux_hidden_state_layer_ids`,
`norm_before_fc` / `fc_norm` / `norm_before_residual` / `norm_output`; weights `fc.weight` [H, n H] over the
auxiliary layers only (not the final state), `layers.0.*` whose q/k/v projections read cat(input_layernorm(embed),
hidden_norm(hidden)) (2 H wide), `norm.weight`, and the draft-vocabulary maps `d2t` / `t2d`. Version 0.9.0 registers
no EAGLE-1 model type ("eagle3", "mtp", "peagle", "dflash", "dflash2", "dspark", "xpress" only).

selfspec's EAGLE head fuses [feature; embedding] to H before a standard layer (input norm, H-wide q/k/v), and its
multi-layer fc reads the final state too, so its weights have no exact place in that layout (nor the other way round).
Knows config keys only.
"""
from __future__ import annotations

UNSUPPORTED = (
    "the speculators EAGLE-3 layer reads cat(norm(embedding), norm(feature)) 2H wide in its attention and fuses the "
    "auxiliary layers only, while selfspec's EAGLE heads fuse [feature; embedding] to H before a standard layer (and "
    "an EAGLE-3 head's fc reads the final state too): no selfspec layout computes what that format's model does"
)


def is_speculators_config(raw: dict) -> bool:
    """Whether a config.json was written in the `speculators` format (it names its `speculators_model_type`)."""
    return "speculators_model_type" in raw


def save_speculators(head, directory, model=None) -> None:
    raise NotImplementedError(
        f"EagleHead.save_pretrained(format='speculators') is not supported: {UNSUPPORTED}. To serve a head in vLLM, "
        "train one with `python -m training.heads --kind eagle --eagle-layout eagle1` and save it with format='vllm' "
        "(vLLM's EAGLE-1 draft model)"
    )


def load_speculators(cls, directory, raw: dict, model=None, check_base: bool = True):
    kind = raw.get("speculators_model_type")
    raise NotImplementedError(
        f"{str(directory)!r} is a speculators {kind!r} draft model; selfspec cannot run it: {UNSUPPORTED}. selfspec "
        "loads its own EAGLE heads, published EAGLE-1/2 heads and vLLM EAGLE-1 exports"
    )
