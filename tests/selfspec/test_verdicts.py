"""The batched verdicts (`selfspec/verdicts.py`) against the eager verifiers: greedy and keyed equal `verify_greedy` /
`verify_keyed` row by row on random small cases; rejection sampling accepts exactly what `verify_sampled` accepts
with the same uniforms, and its output follows the target's law by enumeration (with planted bugs caught); none of
them reads a tensor on the host (meta tensors, torch.compile with fullgraph=True)."""
import pytest
import torch
from scipy.stats import chisquare

import selfspec.verdicts
from selfspec.sampling import SamplingConfig, keyed_tokens, logits_to_probs, warp_logits
from selfspec.seeded import PositionNoise
from selfspec.verdicts import (PAD, chain_verdicts, greedy_verdicts, keyed_verdicts, rejection_noise,
                               rejection_verdicts)
from selfspec.verifier import accept_greedy, verify_greedy, verify_keyed, verify_sampled
from tests.selfspec.exactness import law_pvalue

WARPINGS = [
    SamplingConfig(do_sample=True),
    SamplingConfig(do_sample=True, temperature=0.7, top_k=3),
    SamplingConfig(do_sample=True, top_p=0.7),
    SamplingConfig(do_sample=True, temperature=1.3, top_k=4, top_p=0.8),
]


def expected_row(num_accepted: int, next_token: int, draft_tokens: list[int], k: int) -> list[int]:
    """One row of the verdict tensor as the eager verifier's verdict writes it."""
    emitted = draft_tokens[:num_accepted] + [next_token]
    return [num_accepted] + emitted + [PAD] * (k + 1 - len(emitted))


def random_chains(g: torch.Generator, target_tokens_of, vocab: int):
    """Random batches: B rows, k draft places, num_drafts per row in 0..k; each row's drafts are the target's tokens
    for a random prefix, then random ids, and its padded places hold the target's tokens (which must never count).
    target_tokens_of(logits [B, k + 1, vocab]) -> [B, k + 1] the target's token at each place. Yields (drafts,
    logits, num_drafts, target tokens)."""
    for trial in range(300):
        B, k = int(torch.randint(1, 5, (1,), generator=g)), int(torch.randint(0, 5, (1,), generator=g))
        logits = torch.randn(B, k + 1, vocab, generator=g, dtype=torch.float64) * 2
        if trial % 3 == 0:  # ties in the logits (argmax and top-k / top-p boundaries)
            logits = logits.round()
        num_drafts = torch.randint(0, k + 1, (B,), generator=g)
        target_tokens = target_tokens_of(logits)  # [B, k + 1]
        drafts = torch.randint(0, vocab, (B, k), generator=g)
        for b in range(B):
            keep = int(torch.randint(0, int(num_drafts[b]) + 1, (1,), generator=g))
            drafts[b, :keep] = target_tokens[b, :keep]
            drafts[b, int(num_drafts[b]):] = target_tokens[b, int(num_drafts[b]):k]  # padding that would match
        yield drafts, logits, num_drafts, target_tokens


class Coverage:
    """The cases a comparison must have met: k = 0, rows with fewer drafts than k, all accepted, none accepted."""

    def __init__(self):
        self.seen = set()

    def add(self, k: int, num_drafts: int, num_accepted: int):
        self.seen |= {"k=0"} if k == 0 else set()
        self.seen |= {"short row"} if num_drafts < k else set()
        if num_drafts > 0:
            self.seen.add("all accepted" if num_accepted == num_drafts else "none accepted" if num_accepted == 0
                          else "some accepted")

    def check(self):
        assert self.seen == {"k=0", "short row", "all accepted", "none accepted", "some accepted"}, self.seen


@pytest.mark.parametrize("vocab", [5, 300])  # 300: a CPU's blocked argmax
def test_greedy_verdicts_equal_the_eager_verifier_row_by_row(vocab):
    g, coverage = torch.Generator().manual_seed(vocab), Coverage()
    for drafts, logits, num_drafts, target_tokens in random_chains(g, lambda l: l.float().argmax(-1), vocab):
        k = drafts.shape[1]
        got = greedy_verdicts(drafts, logits, num_drafts)
        assert got.dtype == torch.int64 and got.shape == (drafts.shape[0], k + 2)
        for b, n in enumerate(num_drafts.tolist()):
            eager = verify_greedy(drafts[b, :n], logits[b, : n + 1])
            assert eager == accept_greedy(drafts[b, :n].tolist(), target_tokens[b, : n + 1].tolist())
            assert got[b].tolist() == expected_row(eager.num_accepted, eager.next_token, drafts[b].tolist(), k)
            coverage.add(k, n, eager.num_accepted)
    coverage.check()


def test_chain_verdicts_by_hand():
    target = torch.tensor([[1, 0, 2, 0], [1, 0, 2, 0], [1, 0, 2, 0], [1, 0, 2, 0]])
    drafts = torch.tensor([[1, 0, 2], [1, 2, 2], [0, 0, 2], [1, 0, 2]])
    got = chain_verdicts(drafts, target, torch.tensor([3, 3, 3, 1]))
    assert got.tolist() == [[3, 1, 0, 2, 0], [1, 1, 0, -1, -1], [0, 1, -1, -1, -1], [1, 1, 0, -1, -1]]
    empty = chain_verdicts(torch.zeros(2, 0, dtype=torch.long), torch.tensor([[4], [5]]), torch.tensor([0, 0]))
    assert empty.tolist() == [[0, 4], [0, 5]]


def keyed_noise_rows(B: int, k: int, vocab: int, g: torch.Generator):
    """Each row's PositionNoise, first position, and [B, k + 1, vocab] noise at its positions."""
    noises = [PositionNoise(int(torch.randint(0, 1000, (1,), generator=g)), vocab, "cpu") for _ in range(B)]
    firsts = torch.randint(0, 50, (B,), generator=g).tolist()
    gumbel = torch.stack([noise.rows(range(first, first + k + 1)) for noise, first in zip(noises, firsts)])
    return noises, firsts, gumbel


@pytest.mark.parametrize("branch_free", [False, True], ids=["cpu-numpy-top-p", "branch-free-top-p"])
@pytest.mark.parametrize("sampling", WARPINGS, ids=lambda s: f"t{s.temperature}-k{s.top_k}-p{s.top_p}")
def test_keyed_verdicts_equal_the_eager_verifier_row_by_row(sampling, branch_free, monkeypatch):
    """branch_free: top-p as on an accelerator or under torch.compile (forced here on the CPU)."""
    if branch_free:
        monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    g, coverage, vocab = torch.Generator().manual_seed(7), Coverage(), 6
    state = {}

    def keyed_targets(logits):  # the eager keyed draw at each place, one position at a time
        B, places = logits.shape[:2]
        state["noise"] = keyed_noise_rows(B, places - 1, vocab, g)
        noises, firsts, _ = state["noise"]
        return torch.tensor([[int(keyed_tokens(logits[b, i], sampling, noises[b], firsts[b] + i)[0])
                              for i in range(places)] for b in range(B)])

    for drafts, logits, num_drafts, _ in random_chains(g, keyed_targets, vocab):
        noises, firsts, gumbel = state["noise"]
        k = drafts.shape[1]
        got = keyed_verdicts(drafts, logits, num_drafts, sampling, gumbel)
        for b, n in enumerate(num_drafts.tolist()):
            eager = verify_keyed(drafts[b, :n], logits[b, : n + 1], sampling, noises[b], firsts[b])
            assert got[b].tolist() == expected_row(eager.num_accepted, eager.next_token, drafts[b].tolist(), k)
            coverage.add(k, n, eager.num_accepted)
    coverage.check()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_branch_free_top_p_equals_warp_logits_also_on_ties_at_the_boundary(dtype):
    """The branch-free top-p (every row by the sort with indices) against `warp_logits`' own, row by row and batched,
    on scores with many ties; ties straddling the top-p boundary were met."""
    g, straddled = torch.Generator().manual_seed(0), 0
    for trial in range(200):
        sampling = SamplingConfig(do_sample=True, top_p=float(torch.rand(1, generator=g)) * 0.9 + 0.05)
        scores = torch.randint(0, 4, (3, 40), generator=g).to(dtype) if trial % 2 else torch.randn(3, 40, generator=g,
                                                                                                     dtype=dtype)
        batched = warp_logits(scores, sampling, branch_free=True)
        assert torch.equal(batched, warp_logits(scores, sampling))
        for row in range(3):
            assert torch.equal(batched[row], warp_logits(scores[row], sampling))
        sorted_scores = scores.sort(dim=-1).values
        removed = (warp_logits(scores, sampling) == -float("inf")).sum(-1)  # [3]
        for row, n in enumerate(removed.tolist()):
            straddled += int(0 < n and sorted_scores[row, n - 1] == sorted_scores[row, n])
    assert straddled > 20


# --- rejection sampling -------------------------------------------------------------------------------------------

def test_rejection_verdicts_accept_what_the_eager_verifier_accepts_with_the_same_uniforms():
    """Row b's uniforms drawn as `verify_sampled` draws them (torch.rand(n) from a generator seeded alike): the same
    drafts accepted, the accepted drafts emitted, and the next token inside the support of the law it comes from."""
    g, coverage, vocab = torch.Generator().manual_seed(3), Coverage(), 5
    sampling = SamplingConfig(do_sample=True, top_k=3)
    for trial in range(300):
        B, k = int(torch.randint(1, 5, (1,), generator=g)), int(torch.randint(0, 4, (1,), generator=g))
        target = logits_to_probs(torch.randn(B, k + 1, vocab, generator=g, dtype=torch.float64), sampling)
        draft_probs = None if trial % 2 else logits_to_probs(torch.randn(B, k, vocab, generator=g,
                                                                         dtype=torch.float64), sampling)
        drafts = (torch.randint(0, vocab, (B, k), generator=g) if draft_probs is None
                  else torch.multinomial(draft_probs.reshape(-1, vocab), 1, generator=g).reshape(B, k))
        num_drafts = torch.randint(0, k + 1, (B,), generator=g)
        uniforms = torch.zeros(B, k, dtype=torch.float64)
        for b, n in enumerate(num_drafts.tolist()):
            seeded = torch.Generator().manual_seed(trial * 10 + b)
            uniforms[b, :n] = torch.rand(n, generator=seeded, dtype=torch.float64)
        _, exponentials = rejection_noise(B, k, vocab, g, "cpu", torch.float64)
        got = rejection_verdicts(drafts, draft_probs, target, num_drafts, uniforms, exponentials)
        for b, n in enumerate(num_drafts.tolist()):
            probs = None if draft_probs is None else draft_probs[b, :n]
            seeded = torch.Generator().manual_seed(trial * 10 + b)  # as above: the same uniforms
            eager = verify_sampled(drafts[b, :n], probs, target[b, : n + 1], seeded)
            accepted = int(got[b, 0])
            assert accepted == eager.num_accepted
            assert got[b, 1 : accepted + 1].tolist() == drafts[b, :accepted].tolist()
            assert (got[b, accepted + 2 :] == PAD).all()
            next_token = int(got[b, accepted + 1])
            if accepted < n:  # recovered: where the target exceeds the draft
                draft_row = torch.zeros(vocab, dtype=torch.float64) if probs is None else probs[accepted]
                if probs is None:
                    draft_row[drafts[b, accepted]] = 1.0
                assert target[b, accepted, next_token] > draft_row[next_token]
            else:  # bonus
                assert target[b, n, next_token] > 0
            coverage.add(k, n, accepted)
    coverage.check()


# A tiny context-dependent "model": the target's and the drafter's law of the next token depend on the previous
# token and the position (mod 2), so a draft changes the rows the target scores after it.
LAW_VOCAB, LAW_LENGTH, LAW_DRAFTS = 3, 3, 2
_law_g = torch.Generator().manual_seed(11)
TARGET_TABLE = (torch.randn(LAW_VOCAB, 2, LAW_VOCAB, generator=_law_g, dtype=torch.float64) * 1.5).softmax(-1)
DRAFT_TABLE = (torch.randn(LAW_VOCAB, 2, LAW_VOCAB, generator=_law_g, dtype=torch.float64) * 1.5).softmax(-1)
PROMPT_TOKEN = 1


def table_rows(table: torch.Tensor, previous: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """[...] previous tokens and positions -> [..., vocab] the table's law of the next token."""
    return table[previous, positions % 2]


def speculative_samples(num_samples: int, point_mass: bool, reported: str = "as drawn", seed: int = 0):
    """num_samples sequences of LAW_LENGTH tokens after PROMPT_TOKEN, all decoded together by speculative steps:
    each row drafts 0..LAW_DRAFTS tokens (random per row and step) from DRAFT_TABLE (sampled; or its argmax, a point
    mass), the target scores the drafted prefix, and one `rejection_verdicts` call decides every row. reported: the
    draft probs the verifier is given for sampled drafts: "as drawn", "none" (point masses) or "sharpened" (the
    square of the law drawn from, renormalised: a drafter warping its report unlike its draw)."""
    g = torch.Generator().manual_seed(seed)
    width = LAW_LENGTH + LAW_DRAFTS + 1
    tokens = torch.full((num_samples, width + 1), -1, dtype=torch.long)
    tokens[:, 0] = PROMPT_TOKEN
    lengths = torch.ones(num_samples, dtype=torch.long)  # tokens held, the prompt's included
    rows = torch.arange(num_samples)
    while bool((lengths <= LAW_LENGTH).any()):
        active = lengths <= LAW_LENGTH  # rows still short of LAW_LENGTH tokens; the others draft nothing and keep still
        num_drafts = torch.randint(0, LAW_DRAFTS + 1, (num_samples,), generator=g) * active
        drafts, draft_probs, previous = [], [], tokens[rows, lengths - 1]
        for i in range(LAW_DRAFTS):  # draft from the draft table, one place at a time, for every row at once
            law = table_rows(DRAFT_TABLE, previous, lengths + i)  # [N, vocab]
            token = law.argmax(-1) if point_mass else torch.multinomial(law, 1, generator=g)[:, 0]
            drafts.append(token)
            draft_probs.append(law)
            previous = token
        drafts = torch.stack(drafts, 1)  # [N, k]
        draft_probs = None if point_mass or reported == "none" else torch.stack(draft_probs, 1)
        if reported == "sharpened":
            draft_probs = draft_probs**2 / (draft_probs**2).sum(-1, keepdim=True)
        context = torch.cat([tokens[rows, lengths - 1][:, None], drafts], 1)  # [N, k + 1] the token before each place
        target = table_rows(TARGET_TABLE, context, lengths[:, None] + torch.arange(LAW_DRAFTS + 1))  # [N, k + 1, V]
        uniforms, exponentials = rejection_noise(num_samples, LAW_DRAFTS, LAW_VOCAB, g, "cpu", torch.float64)
        verdicts = rejection_verdicts(drafts, draft_probs, target, num_drafts, uniforms, exponentials)
        for place in range(LAW_DRAFTS + 1):  # write every row's emitted tokens after its held ones
            token = verdicts[:, 1 + place]
            keep = (token != PAD) & active
            tokens[rows[keep], (lengths + place)[keep]] = token[keep]
        lengths = lengths + (verdicts[:, 0] + 1) * active
    return [tuple(row) for row in tokens[:, 1 : LAW_LENGTH + 1].tolist()]


def exact_law() -> dict[tuple, float]:
    law = {(): 1.0}
    for position in range(1, LAW_LENGTH + 1):
        law = {prefix + (t,): p * float(TARGET_TABLE[(prefix or (PROMPT_TOKEN,))[-1], position % 2, t])
               for prefix, p in law.items() for t in range(LAW_VOCAB)}
    return law


@pytest.mark.parametrize("point_mass, reported", [(False, "as drawn"), (True, "none"), (False, "none")],
                         ids=["sampled-drafts", "point-mass-drafts", "sampled-drafts-verified-as-point-masses"])
def test_rejection_verdicts_follow_the_target_law(point_mass, reported):
    """20,000 sequences of 3 tokens decoded by speculative steps of 0-2 drafts (per row) against the law by
    enumeration (27 outcomes). (Sampled drafts verified as point masses are exact too, only accepted less: accept x
    with probability target[x], else draw from the target without x.)"""
    assert law_pvalue(speculative_samples(20000, point_mass, reported), exact_law()) > 1e-3


@pytest.mark.parametrize("planted", ["recovered from the target", "no max(0, .)", "misreported draft probs"])
def test_the_rejection_law_test_catches_planted_bugs(planted, monkeypatch):
    """Planted: the recovered token drawn from the target row instead of the residual; the residual without its
    max(0, .) (its mass then sums to ~0, so the guard falls back to the target; negative entries alone would never win
    the exponential race); draft probs reported unlike the law the drafts were drawn from (sharpened)."""
    if planted == "recovered from the target":
        monkeypatch.setattr(selfspec.verdicts, "residuals", lambda target_rows, draft_rows: target_rows)
    if planted == "no max(0, .)":
        monkeypatch.setattr(selfspec.verdicts, "residuals", lambda target_rows, draft_rows: target_rows - draft_rows)
    reported = "sharpened" if planted == "misreported draft probs" else "as drawn"
    assert law_pvalue(speculative_samples(20000, False, reported), exact_law()) < 1e-6


def test_first_token_law_by_chi_square_on_hand_made_rows():
    """As `test_verifier.py` checks the eager verifier: draft and target rows by hand, the first emitted token
    follows the target's first row, for sampled and point-mass drafts."""
    draft = torch.tensor([[0.5, 0.3, 0.1, 0.1], [0.25, 0.25, 0.25, 0.25]], dtype=torch.float64)
    target = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.4, 0.3, 0.2, 0.1], [0.7, 0.1, 0.1, 0.1]], dtype=torch.float64)
    n, g = 20000, torch.Generator().manual_seed(0)
    for draft_probs in (draft.expand(n, 2, 4), None):
        drafts = (torch.multinomial(draft, n, replacement=True, generator=g).T if draft_probs is not None
                  else torch.tensor([2, 0]).expand(n, 2))
        uniforms, exponentials = rejection_noise(n, 2, 4, g, "cpu", torch.float64)
        verdicts = rejection_verdicts(drafts, draft_probs, target.expand(n, 3, 4), torch.full((n,), 2), uniforms,
                                      exponentials)
        counts = torch.bincount(verdicts[:, 1], minlength=4).double()
        assert chisquare(counts.numpy(), (target[0] * n).numpy()).pvalue > 1e-3


# --- no host reads --------------------------------------------------------------------------------------------------

def meta_inputs(B=3, k=2, vocab=7):
    drafts = torch.empty(B, k, dtype=torch.long, device="meta")
    logits = torch.empty(B, k + 1, vocab, device="meta")
    num_drafts = torch.empty(B, dtype=torch.long, device="meta")
    return drafts, logits, num_drafts


SEEDED_TOP_P = SamplingConfig(do_sample=True, temperature=0.8, top_k=4, top_p=0.9)


def test_verdicts_run_on_meta_tensors_which_hold_no_values_to_read():
    """The meta device has shapes and no data: a `.item()`, `.tolist()`, `int()`, `bool()` or NumPy conversion on
    it raises. Each verdict runs there whole (so it reads nothing back), and a planted read is caught."""
    drafts, logits, num_drafts = meta_inputs()
    gumbel = torch.empty(3, 3, 7, dtype=torch.float64, device="meta")
    uniforms, exponentials = torch.empty(3, 2, device="meta"), torch.empty(3, 3, 7, device="meta")
    results = [
        greedy_verdicts(drafts, logits, num_drafts),
        keyed_verdicts(drafts, logits, num_drafts, SEEDED_TOP_P, gumbel),
        rejection_verdicts(drafts, None, logits, num_drafts, uniforms, exponentials),
        rejection_verdicts(drafts, logits[:, :2], logits, num_drafts, uniforms, exponentials),
    ]
    assert all(r.device.type == "meta" and r.shape == (3, 4) and r.dtype == torch.int64 for r in results)
    with pytest.raises((RuntimeError, NotImplementedError)):  # the eager verifier reads (tolist): caught
        verify_greedy(drafts[0], logits[0])
    with pytest.raises((RuntimeError, NotImplementedError)):  # top-p's tie check when not branch-free: caught
        warp_logits(logits, SEEDED_TOP_P)


def test_verdicts_compile_whole_with_fullgraph():
    """torch.compile(fullgraph=True, dynamic=False) captures each verdict in one graph (a host read would break the
    graph, which fullgraph turns into an error) and the compiled verdicts equal the eager ones. The "eager" backend:
    the capture is the check (inductor compiled the three in about 35 s on this project's CPU, with the same
    results)."""
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(0)
    B, k, vocab = 3, 2, 7
    drafts, num_drafts = torch.randint(0, vocab, (B, k), generator=g), torch.tensor([2, 0, 1])
    logits = torch.randn(B, k + 1, vocab, generator=g)
    gumbel = torch.randn(B, k + 1, vocab, generator=g, dtype=torch.float64)
    uniforms, exponentials = rejection_noise(B, k, vocab, g, "cpu", torch.float32)
    calls = {
        greedy_verdicts: (drafts, logits, num_drafts),
        (lambda d, l, n, gm: keyed_verdicts(d, l, n, SEEDED_TOP_P, gm)): (drafts, logits, num_drafts, gumbel),
        rejection_verdicts: (drafts, logits[:, :k].softmax(-1), logits.softmax(-1), num_drafts, uniforms, exponentials),
    }
    for function, args in calls.items():
        compiled = torch.compile(function, fullgraph=True, dynamic=False, backend="eager")
        assert torch.equal(compiled(*args), function(*args))
