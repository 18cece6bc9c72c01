"""The batched chain verdict on the device: every row's accepted drafts and next token from tensor ops, read once.

Pure functions over tensors, the batched form of `verifier.py` (which stays the oracle they are tested equal to):
no model, no cache, no generator objects (random draws come in as tensors: `rejection_noise` draws them). None of
them reads a tensor on the host: no `.item()`, `.tolist()`, `int(tensor)`, `bool(tensor)`, NumPy, nor a Python loop
over rows or positions, so a step that calls one reads its result once (zero host reads inside;
`tests/selfspec/test_verdicts.py` runs them on the meta device, which has no values to read, and under
`torch.compile(fullgraph=True)`). One exception, where it waits on no device: seeded top-p on CPU tensors keeps
`warp_logits`' NumPy sort and tie check (`keyed_draws`).

Every function returns one int64 tensor [B, k + 2] (k: draft positions, padded):
    [:, 0]       num_accepted, 0..num_drafts[b]
    [:, 1:]      the k + 1 emitted tokens: the accepted drafts, then the recovered (a rejection) or bonus (all
                 accepted) token, then -1 padding; row b emits verdicts[b, 1 : verdicts[b, 0] + 2].
Rows may hold fewer real drafts than k (`num_drafts` [B]): their padded draft positions never accept.
"""
from __future__ import annotations

import torch

from selfspec.sampling import SamplingConfig, greedy_tokens, warp_logits
from selfspec.seeded import NOISE_DTYPE

PAD = -1  # an emitted place after the next token


def chain_verdicts(draft_tokens: torch.Tensor, target_tokens: torch.Tensor, num_drafts: torch.Tensor) -> torch.Tensor:
    """The deterministic verifiers' rule: keep drafts while they equal the target's token at their position; the
    next token is the target's token after them.

    draft_tokens: [B, k] (anything at padded places); target_tokens: [B, k + 1] the target's token at each position
    (greedy: its argmax; seeded: its keyed draw); num_drafts: [B] real drafts per row. -> [B, k + 2] (module doc)."""
    k = draft_tokens.shape[1]
    real = torch.arange(k, device=draft_tokens.device) < num_drafts[:, None]  # [B, k]
    matched = (draft_tokens == target_tokens[:, :k]) & real
    num_accepted = matched.long().cumprod(dim=1).sum(dim=1)  # [B] leading matches
    # Accepted drafts equal the target's tokens, so the emitted tokens are the target's up to num_accepted.
    return _layout(num_accepted, target_tokens, target_tokens)


def greedy_verdicts(draft_tokens: torch.Tensor, target_logits: torch.Tensor, num_drafts: torch.Tensor) -> torch.Tensor:
    """`verify_greedy` for every row: target_logits [B, k + 1, vocab] (position i of row b scores the token after
    its i-th draft), argmax as `generate` takes it (`sampling.greedy_tokens`). -> [B, k + 2]."""
    return chain_verdicts(draft_tokens, greedy_tokens(target_logits), num_drafts)


def keyed_draws(target_logits: torch.Tensor, sampling: SamplingConfig, gumbel: torch.Tensor) -> torch.Tensor:
    """[..., vocab] logits and [..., vocab] float64 Gumbel noise of each row's position (`PositionNoise.rows`) ->
    [...] the keyed draw at each position: argmax(warped logits + noise), as `sampling.keyed_tokens` draws it.

    Top-p decides by tensor ops alone on an accelerator and under torch.compile; on CPU tensors it keeps
    `warp_logits`' NumPy sort (rows of 49,152 scores on this project's CPU: 1.5 ms each, torch.sort with indices
    5.8 ms), whose one tie check reads memory the scores already live in, so it waits on no device."""
    branch_free = target_logits.device.type != "cpu" or torch.compiler.is_compiling()
    warped = warp_logits(target_logits, sampling, branch_free)
    # float32 + float64 adds in float64 (the warped logits widened exactly), as `seeded.add_noise` adds, without a
    # widened copy of the logits
    return (gumbel.to(NOISE_DTYPE) + warped).argmax(dim=-1)


def keyed_verdicts(draft_tokens: torch.Tensor, target_logits: torch.Tensor, num_drafts: torch.Tensor,
                   sampling: SamplingConfig, gumbel: torch.Tensor) -> torch.Tensor:
    """`verify_keyed` for every row: target_logits [B, k + 1, vocab]; gumbel [B, k + 1, vocab] float64, row b's noise
    at the sequence position each place decides (first_position_b + i; anything at padded places). -> [B, k + 2].
    Unlike the eager verifier it warps every position, also those after the first mismatch."""
    return chain_verdicts(draft_tokens, keyed_draws(target_logits, sampling, gumbel), num_drafts)


def rejection_noise(num_rows: int, num_draft_tokens: int, vocab_size: int, generator: torch.Generator | None,
                    device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Every draw `rejection_verdicts` needs, up front: ([B, k] uniforms in [0, 1), [B, k + 1, vocab] standard
    exponentials > 0). Its use of `generator` does not depend on how many drafts are accepted."""
    uniforms = torch.rand(num_rows, num_draft_tokens, generator=generator, device=device, dtype=dtype)
    uniform = torch.rand(num_rows, num_draft_tokens + 1, vocab_size, generator=generator, device=device, dtype=dtype)
    return uniforms, -torch.log(uniform.clamp_min(torch.finfo(dtype).tiny))  # u = 0 would give an exponential of 0


def residuals(target_rows: torch.Tensor, draft_rows: torch.Tensor) -> torch.Tensor:
    """max(0, target - draft): the (unnormalised) law after a rejection. (Tests plant broken versions here.)"""
    return (target_rows - draft_rows).clamp_min(0.0)


def rejection_verdicts(draft_tokens: torch.Tensor, draft_probs: torch.Tensor | None, target_probs: torch.Tensor,
                       num_drafts: torch.Tensor, uniforms: torch.Tensor, exponentials: torch.Tensor) -> torch.Tensor:
    """Speculative sampling for every row, vLLM v1's way: the output has exactly the target's law (the eager
    `verify_sampled`'s rule with other draws; with the same uniforms it accepts exactly the same drafts).

    draft_tokens: [B, k]; draft_probs: [B, k, vocab] the laws they were drawn from, or None (point masses);
    target_probs: [B, k + 1, vocab], warped as the draft side was; num_drafts: [B]; uniforms [B, k] and exponentials
    [B, k + 1, vocab] from `rejection_noise`. -> [B, k + 2].

    Accept draft i when u_i * draft < target (u < p / q without the division). The next token is drawn at every
    position in parallel, as argmax(law / exponential) (a sample of the normalised law: the exponential race): law =
    norm(max(0, target - draft)) at a real draft position (recovered), the target row just after the last real draft
    (bonus); the row of the first rejection, or the bonus row, is then picked."""
    B, k = draft_tokens.shape
    dtype = target_probs.dtype
    real = torch.arange(k, device=draft_tokens.device) < num_drafts[:, None]  # [B, k]
    tokens = torch.where(real, draft_tokens, 0)[..., None]  # [B, k, 1], a valid id at padded places
    target_rows = target_probs[:, :k]  # [B, k, vocab]
    if draft_probs is None:  # a point mass: q = 1 on its token
        draft_rows = torch.zeros_like(target_rows).scatter_(-1, tokens, 1.0)
    else:
        draft_rows = draft_probs.to(dtype)
    draft_of_draft = draft_rows.gather(-1, tokens)[..., 0]  # [B, k]
    accepted = (uniforms.to(dtype) * draft_of_draft < target_rows.gather(-1, tokens)[..., 0]) & real
    num_accepted = accepted.long().cumprod(dim=1).sum(dim=1)  # [B]
    residual = residuals(target_rows, draft_rows)
    # A rejection has probability sum(residual), so exactly it implies mass > 0; rounding can leave ~0 mass when
    # draft == target, and then the target is the law (`verifier.normalised_or`).
    residual = torch.where(residual.sum(-1, keepdim=True) > torch.finfo(dtype).tiny, residual, target_rows)
    recovered_or_target = torch.cat([residual, target_probs[:, k:]], dim=1)  # [B, k + 1, vocab]
    recovering = torch.cat([real, real.new_zeros(B, 1)], dim=1)[..., None]  # [B, k + 1, 1]
    laws = torch.where(recovering, recovered_or_target, target_probs)  # (no need to normalise: argmax is scale-free)
    next_tokens = (laws / exponentials.to(dtype)).argmax(dim=-1)  # [B, k + 1]
    return _layout(num_accepted, torch.cat([draft_tokens, draft_tokens.new_full((B, 1), PAD)], dim=1), next_tokens)


def _layout(num_accepted: torch.Tensor, accepted_tokens: torch.Tensor, next_tokens: torch.Tensor) -> torch.Tensor:
    """[B] num_accepted, [B, k + 1] tokens to take before it and [B, k + 1] the next token at each place ->
    [B, k + 2] the verdict tensor (module doc)."""
    places = torch.arange(accepted_tokens.shape[1], device=accepted_tokens.device)[None, :]  # [1, k + 1]
    cut = num_accepted[:, None]
    emitted = torch.where(places < cut, accepted_tokens, torch.where(places == cut, next_tokens, PAD))
    return torch.cat([num_accepted[:, None], emitted.long()], dim=1)
