"""Helpers for statistical exactness tests: the exact law of a short continuation by enumeration, and a
chi-square comparison of engine samples against it. Shared by every drafter's sampling test."""
from __future__ import annotations

import itertools

import torch
from scipy.stats import chisquare

from selfspec.sampling import SamplingConfig, logits_to_probs


@torch.no_grad()
def exact_continuation_law(
    model, prompt: torch.Tensor, num_new: int, sampling: SamplingConfig, ends=None
) -> dict[tuple, float]:
    """P(x_1..x_n | prompt) under `sampling`, for every continuation, from full (cache-free) forwards.

    ends(continuation) -> True where generation stops early (an EOS, a completed stop string): such a continuation
    is final, shorter than num_new.
    """
    vocab = model.get_output_embeddings().weight.shape[0]
    open_, final = {(): 1.0}, {}
    for _ in range(num_new):
        if not open_:
            break
        prefixes = list(open_)
        batch = torch.stack([torch.cat([prompt[0], prompt.new_tensor(p)]) for p in prefixes])  # [n, len]
        probs = logits_to_probs(model(batch).logits[:, -1], sampling)  # [n, vocab]
        grown = {
            p + (t,): open_[p] * float(probs[i, t])
            for i, p in enumerate(prefixes)
            for t in range(vocab)
            if probs[i, t] > 0
        }
        open_ = {}
        for continuation, mass in grown.items():
            (final if ends is not None and ends(continuation) else open_)[continuation] = mass
    return {**final, **open_}


def law_pvalue(samples: list[tuple], law: dict[tuple, float]) -> float:
    """Chi-square p-value of `samples` against `law`; outcomes expected < 5 times are pooled into one cell."""
    n = len(samples)
    total = sum(law.values())  # 1 up to rounding (float32 probabilities of a half-precision model)
    law = {outcome: p / total for outcome, p in law.items()}
    counts: dict[tuple, int] = {}
    for s in samples:
        assert s in law, f"sampled {s}, which has probability 0 under the model"
        counts[s] = counts.get(s, 0) + 1
    observed, expected, pooled_obs, pooled_exp = [], [], 0, 0.0
    for outcome, p in law.items():
        if p * n >= 5:
            observed.append(counts.get(outcome, 0))
            expected.append(p * n)
        else:
            pooled_obs += counts.get(outcome, 0)
            pooled_exp += p * n
    if pooled_exp > 0:
        observed.append(pooled_obs)
        expected.append(pooled_exp)
    return float(chisquare(observed, expected).pvalue)


def all_sequences(vocab: int, length: int):
    return list(itertools.product(range(vocab), repeat=length))


LAW_VOCAB = 4  # a 4-token vocabulary: the law of a 4-token continuation has at most 256 outcomes


def law_model(seed: int = 0):
    """A tiny float64 Llama over LAW_VOCAB tokens whose next-token distributions are far from uniform (so drafts
    matter): the model every law test enumerates."""
    from tests.conftest import tiny_model

    model = tiny_model("llama", seed=seed, vocab_size=LAW_VOCAB, hidden=16, num_layers=1)
    with torch.no_grad():
        model.lm_head.weight.mul_(6.0)
    return model


def randomized_medusa(model, seed: int = 1, num_heads: int = 3):
    """Medusa heads pushed off the identity by noise: right at times, wrong at others."""
    from heads import MedusaHeads

    heads = MedusaHeads.for_model(model, num_heads=num_heads)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in heads.parameters():
            p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype))
    return heads
