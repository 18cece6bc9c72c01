"""The sampling transforms equal `transformers`' own warpers, element for element, including ties."""
import math

import pytest
import torch
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from selfspec.sampling import ARGMAX_BLOCK, SamplingConfig, greedy_tokens, logits_to_probs, warp_logits

SETTINGS = [
    dict(temperature=1.0),
    dict(temperature=0.7),
    dict(temperature=1.3, top_k=5),
    dict(top_k=1),
    dict(top_k=200),  # larger than the vocabulary
    dict(top_p=0.9),
    dict(top_p=0.05),  # keeps only the best token
    dict(temperature=0.7, top_p=0.9),
    dict(temperature=0.8, top_k=20, top_p=0.6),
]


def transformers_warp(scores, temperature=1.0, top_k=None, top_p=None):
    """The chain `generate(do_sample=True)` builds, in its order, on float32 logits."""
    scores = scores.float()
    if temperature != 1.0:
        scores = TemperatureLogitsWarper(temperature)(None, scores)
    if top_k:
        scores = TopKLogitsWarper(top_k)(None, scores)
    if top_p is not None and top_p < 1.0:
        scores = TopPLogitsWarper(top_p)(None, scores)
    return scores


@pytest.mark.parametrize("settings", SETTINGS)
def test_warpers_equal_transformers(settings):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 100, generator=g) * 3
    logits[0, :10] = 5.0  # a block of ties at the top
    logits[1, 50:] = -2.0  # a block of ties in the tail
    ours = warp_logits(logits, SamplingConfig(do_sample=True, **settings))
    theirs = transformers_warp(logits, **settings)
    assert torch.equal(torch.isinf(ours), torch.isinf(theirs))
    assert torch.allclose(ours[~torch.isinf(ours)], theirs[~torch.isinf(theirs)])
    probs = logits_to_probs(logits, SamplingConfig(do_sample=True, **settings))
    assert torch.allclose(probs.sum(-1), torch.ones(6))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_top_p_equals_transformers_on_many_rows_and_sorts_only_for_ties_at_its_boundary(dtype, monkeypatch):
    """Top-p finds its boundary from the sorted values alone; only a tie straddling the boundary needs the sort with
    indices (which of the tied tokens goes is the sort's order, as in `transformers`). Continuous logits: the same
    mask as TopPLogitsWarper and no torch.sort; logits rounded to halves (ties everywhere): the same mask, with the
    sort where a tie straddles. Catches (planted): `<` for `<=` at the boundary; the fallback dropped (the tied rows'
    masks differ)."""
    g = torch.Generator().manual_seed(1)
    sorts = []
    sort = torch.sort

    def counted(*args, **kwargs):
        sorts.append(1)
        return sort(*args, **kwargs)

    monkeypatch.setattr(torch, "sort", counted)
    for rounded in (False, True):
        logits = (torch.randn(300, 3000, generator=g) * 2).to(dtype)
        if rounded:
            logits = (logits * 2).round() / 2
        for top_p in (0.3, 0.9, 0.99):
            sorts.clear()
            ours = warp_logits(logits, SamplingConfig(do_sample=True, top_p=top_p))
            used_sort = bool(sorts)
            theirs = TopPLogitsWarper(top_p)(None, logits.clone())
            assert torch.equal(torch.isinf(ours), torch.isinf(theirs)), (rounded, top_p)
            assert used_sort == rounded, (rounded, top_p)  # ties at the boundary happen only in rounded logits


def test_top_k_keeps_ties_at_the_cut():
    logits = torch.tensor([[3.0, 2.0, 2.0, 2.0, 1.0]])
    kept = ~torch.isinf(warp_logits(logits, SamplingConfig(do_sample=True, top_k=2)))
    assert kept.tolist() == [[True, True, True, True, False]]


def test_probabilities_are_float32_or_wider():
    for dtype, expected in [(torch.bfloat16, torch.float32), (torch.float16, torch.float32),
                            (torch.float32, torch.float32), (torch.float64, torch.float64)]:
        logits = torch.randn(2, 10).to(dtype)
        assert logits_to_probs(logits, SamplingConfig(do_sample=True, top_p=0.9)).dtype == expected
        assert logits_to_probs(logits, SamplingConfig()).dtype == expected


def test_greedy_is_float32_argmax_first_index_on_ties():
    logits = torch.tensor([[0.0, 2.0, 2.0, 1.0]], dtype=torch.float64)
    assert greedy_tokens(logits).tolist() == [1]
    # Two float64 values that round to the same float32: `generate` sees a tie and picks the first.
    close = torch.tensor([[1.0, 1.0 + 1e-12]], dtype=torch.float64)
    assert greedy_tokens(close).tolist() == [0]
    onehot = logits_to_probs(logits, SamplingConfig())
    assert onehot.tolist() == [[0.0, 1.0, 0.0, 0.0]]


def test_greedy_on_wide_rows_is_float32_argmax_first_index_on_ties():
    """Rows wide enough for `blocked_argmax` (on a CPU): the ids `torch.argmax` gives, with ties inside a block and
    across blocks, NaNs (argmax takes the first), rows of -inf, a width that is not a multiple of the block, float64
    values tied in float32, and no rows at all. Catches (planted): the last block holding the maximum (amax's
    argmax on reversed blocks), padding with 0 instead of -inf, the block's max index without the block's offset."""
    generator = torch.Generator().manual_seed(0)
    for trial in range(400):
        width = int(torch.randint(2 * ARGMAX_BLOCK, 5 * ARGMAX_BLOCK, (1,), generator=generator))
        logits = torch.randint(-3, 4, (4, width), generator=generator).to(torch.float64)  # ties everywhere
        column = int(torch.randint(0, width, (1,), generator=generator))
        if trial % 4 == 1:
            logits[0, column] = math.nan
        elif trial % 4 == 2:
            logits[1] = -math.inf
            logits[2] = -3.0 - torch.rand(width, generator=generator, dtype=torch.float64)  # all below the padding's 0
        elif trial % 4 == 3:
            logits[3, column] = 3.0 + 1e-12  # rounds to 3.0 in float32: a tie, not a new maximum
        assert torch.equal(greedy_tokens(logits), logits.float().argmax(dim=-1)), trial
    assert torch.equal(greedy_tokens(logits[:0]), logits[:0].float().argmax(dim=-1))
    assert torch.equal(greedy_tokens(logits[None]), logits.float().argmax(dim=-1)[None])  # leading dimensions kept
    assert greedy_tokens(logits[0]).shape == ()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(temperature=0.0), "temperature"),
        (dict(temperature=-1.0), "temperature"),
        (dict(temperature=math.inf), "temperature"),
        (dict(temperature=math.nan), "temperature"),
        (dict(top_k=-1), "top_k"),
        (dict(top_k=2.5), "top_k"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(do_sample="yes"), "do_sample"),
    ],
)
def test_invalid_settings_raise_clear_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingConfig(**{"do_sample": True, **kwargs})


@pytest.mark.parametrize("sampling", [
    SamplingConfig(do_sample=True, temperature=0.7, top_p=0.9),
    SamplingConfig(do_sample=True, top_k=20),
    SamplingConfig(do_sample=True, temperature=1.3, top_k=50, top_p=0.8),
    SamplingConfig(do_sample=False),
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_warped_rows_equal_the_batched_transform_row_by_row(sampling, dtype):
    """Planted bug caught: WarpedRows warping with temperature only (top-p dropped) differs at the cut."""
    from selfspec.sampling import WarpedRows

    logits = (torch.randn(5, 3000, generator=torch.Generator().manual_seed(1)) * 4).to(dtype)
    batched = logits_to_probs(logits, sampling)
    rows = WarpedRows(logits, sampling)
    assert rows.dtype == batched.dtype and len(rows) == 5 and rows.num_warped == 0
    for i in (3, 0, 3):
        assert torch.equal(rows[i], batched[i])
    assert rows.num_warped == 2  # computed once each, only when read


def test_sample_from_follows_the_probabilities_and_never_draws_a_zero():
    """sample_from (inverse CDF in float64) against its law: 60,000 draws from rows with zeros and an unnormalised
    row, chi-square per row; a zero-mass token is never drawn; the same generator state gives the same tokens; the
    leading shape is kept. Catches (planted): u scaled by the first cumulative instead of the total; off-by-one
    tokens. (searchsorted with right=False differs only when u is exactly 0, a 2^-53 event: not caught, not a bug
    that shows.)"""
    from scipy.stats import chisquare

    from selfspec.sampling import sample_from

    probs = torch.tensor([[0.0, 0.5, 0.0, 0.25, 0.25, 0.0],
                          [0.1, 0.0, 0.0, 0.0, 0.0, 0.9],
                          [2.0, 1.0, 0.0, 1.0, 0.0, 0.0]])  # the last row is unnormalised (total 4)
    g = torch.Generator().manual_seed(0)
    draws = torch.stack([sample_from(probs, g) for _ in range(20_000)])  # [n, 3]
    for row in range(3):
        counts = torch.bincount(draws[:, row], minlength=6).double()
        law = probs[row].double() / probs[row].double().sum()
        assert counts[law == 0].sum() == 0, row
        nonzero = law > 0
        assert chisquare(counts[nonzero], law[nonzero] * counts.sum()).pvalue > 1e-4, row
    a, b = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    assert torch.equal(sample_from(probs, a), sample_from(probs, b))
    assert sample_from(probs[None].expand(2, 3, 6), g).shape == (2, 3)


def test_sample_from_takes_the_last_positive_token_when_u_rounds_up(monkeypatch):
    """u * total rounded up to the total: no cumulative exceeds it; the last token of positive mass is taken, not an
    index past the vocabulary or a zero-mass token."""
    ones = torch.ones(1, 1, dtype=torch.float64)
    monkeypatch.setattr(torch, "rand", lambda *args, **kwargs: ones)  # u = 1: the total itself
    from selfspec.sampling import sample_from

    assert sample_from(torch.tensor([0.3, 0.7, 0.0, 0.0]), None).item() == 1


@pytest.mark.parametrize("bad", [[0.0, 0.0, 0.0], [0.5, float("nan"), 0.5], [0.5, float("inf"), 0.1], [0.8, -0.1, 0.3]])
def test_sample_from_refuses_probabilities_that_are_not_a_law(bad):
    """A zero, NaN or infinite total, or a negative entry, is an error (as torch.multinomial's), never a token."""
    from selfspec.sampling import sample_from

    with pytest.raises(ValueError, match="sample_from"):
        sample_from(torch.tensor([[0.2, 0.3, 0.5], bad]), None)
