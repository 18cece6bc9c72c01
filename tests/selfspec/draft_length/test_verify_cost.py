"""The verify-cost curve: learned from scripted step timings, kept on disk per model/device/dtype/threads, never
measured up front (the first call of a process pays no measuring pause), and a broken cache file is ignored."""
import json

import pytest
import torch

import selfspec.draft_length.verify_cost as verify_cost
from selfspec import SelfSpecModel
from selfspec.draft_length.verify_cost import LearnedVerifyCost, VerifyCost, cache_dir, cost_key, prior_verify_cost
from selfspec.target import TargetModel
from tests.conftest import random_prompt, repetitive_prompt, tiny_model

CPU = torch.device("cpu")


def test_learned_curve_recovers_scripted_timings():
    start = prior_verify_cost(CPU)
    learned = LearnedVerifyCost(start)
    for step in range(300):
        k = step % 9
        learned.observe(k, 0.002 * (1 + 0.25 * (start(k) - 1)))  # a flatter device than the prior assumes
    assert learned.decode_seconds == pytest.approx(0.002, rel=0.03)
    assert learned.scale == pytest.approx(0.25, rel=0.15)  # the ridge towards the start curve biases it a little
    assert learned(0) == 1.0 and learned(8) == pytest.approx(1 + 0.25 * (start(8) - 1), rel=0.03)


def test_one_k_only_keeps_the_start_shape_and_learns_the_scale_of_a_decode():
    start = prior_verify_cost(CPU)
    learned = LearnedVerifyCost(start)
    for _ in range(50):
        learned.observe(3, 0.003)
    assert learned.scale == pytest.approx(1.0, abs=1e-6)
    assert learned.decode_seconds == pytest.approx(0.003 / start(3), rel=1e-6)


def test_one_stalled_forward_is_learned_as_at_most_a_few_times_its_prediction():
    """A GPU loads each new shape's kernels on its first forward (tens of decodes, once per process): after 30 steady
    forwards, one verify at k = 3 taking 40 decodes moves the curve by little, and it is back within 5 % in 50 steps.
    Catches (planted): no clipping (the curve at k = 8 more than doubles)."""
    start = prior_verify_cost(CPU)
    learned = LearnedVerifyCost(start)
    for step in range(30):
        learned.observe(step % 9, 0.002 * start(step % 9))
    learned.observe(3, 0.002 * 40)
    assert learned(8) < 1.5 * start(8)
    for step in range(50):
        learned.observe(step % 9, 0.002 * start(step % 9))
    assert learned(8) == pytest.approx(start(8), rel=0.05)


def test_a_cost_cliff_is_learned_and_kept():
    """SmolLM2 on one CPU thread: verifying 1 / 2 / 3 / 4 drafts costs 1.10 / 1.18 / 1.64 / 1.73 decodes,
    a jump at k = 3 that no rescaled smooth curve holds (the fit alone put k = 3 at 1.09 and "auto" drafted 3 where 2
    was 1.3x faster). Each k's own residual brings the curve to the measured costs; saved and reloaded, the next
    process starts from that shape. Catches (planted): no per-k residual (k = 3 within 10 % of k = 2)."""
    measured = [1.0, 1.10, 1.18, 1.64, 1.73]
    learned = LearnedVerifyCost(prior_verify_cost(CPU))
    for step in range(100):
        k = step % 5
        learned.observe(k, 0.05 * measured[k])
    # (within a few percent: each residual is shrunk a little towards the fit, which the cliff bends)
    assert [learned(k) for k in range(5)] == pytest.approx(measured, rel=0.06)
    assert learned(3) > 1.3 * learned(2)
    reloaded = LearnedVerifyCost(learned.snapshot())
    assert [reloaded(k) for k in range(5)] == pytest.approx([learned(k) for k in range(5)], rel=0.02)


def test_a_price_raised_by_noise_comes_back_when_its_k_goes_untimed():
    """Timed while another process ran, SmolLM2's tree curve priced 8 nodes at 3.16 decodes (they cost
    ~1.3-1.6); a chain's "auto" that then never drafts that many never times it again. A k that goes untimed is priced
    more and more by the fit (`stale_decay`): raised by three slow timings, k = 8 comes back within 10 % of its cost
    in 200 timings of k <= 4. Catches (planted): no ageing (stale_decay=1, still > 1.5x)."""
    for ageing, comes_back in (({}, True), ({"stale_decay": 1.0}, False)):  # the default, none
        start = prior_verify_cost(CPU)
        learned = LearnedVerifyCost(start, **ageing)
        for step in range(90):
            learned.observe(step % 9, 0.002 * start(step % 9))
        for _ in range(3):
            learned.observe(8, 3 * 0.002 * start(8))
        assert learned(8) > 1.5 * start(8)
        for step in range(200):
            learned.observe(step % 5, 0.002 * start(step % 5))
        assert (learned(8) == pytest.approx(start(8), rel=0.1)) is comes_back
        assert [learned(k) for k in range(5)] == pytest.approx([start(k) for k in range(5)], rel=0.05)


def test_the_next_process_prices_each_timed_k_as_kept_and_the_rest_by_their_line():
    """A kept curve is split: the line through its timed prices (weighted by their counts) is the fit's start, and
    each timed price is remembered as evidence worth a few timings, so the next process prices it as kept; an untimed
    k is priced by the line, not by a kept kink; and this process's timings average with the kept evidence."""
    kept = VerifyCost((1.0, 1.1, 1.2, 1.8, 1.9, 2.5, 2.6, 2.7, 2.8), 0.01, (30, 10, 10, 10, 10, 0, 0, 0, 0))
    target = TargetModel(tiny_model("llama", seed=1))
    path = verify_cost.cache_dir() / "verify_cost" / f"{cost_key(target)}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"relative": list(kept.relative), "decode_seconds": 0.01, "timed": list(kept.timed)}))
    curve = verify_cost.learned_verify_cost(target)
    assert [curve(k) for k in range(5)] == pytest.approx(kept.relative[:5], rel=1e-6)
    slope = curve.start(1) - 1.0
    assert curve.start(2) == pytest.approx(1.0 + 2 * slope)  # a line
    assert curve(5) == pytest.approx(1.0 + 5 * slope, rel=1e-6) and curve(5) < 2.5  # untimed: the line, not 2.5
    assert curve.timed[:5] == list(kept.timed[:5])
    curve.observe(0, 0.01)
    curve.observe(3, 0.01 * 1.2)  # k = 3 is now as cheap as k = 2: the kept 1.8 moves towards it, not all the way
    assert 1.2 < curve(3) < 1.8


def test_a_tree_curve_prices_every_node_count_up_to_its_budget():
    """A tree of 12 nodes verifies up to 12 tokens: each count keeps its own price, where a curve of k <= 8
    extrapolated 9-12 from its last two prices (8 at 3.16 after 7 at 1.79 put 10 nodes at 5.9 decodes)."""
    from heads.medusa import MedusaHeads

    model = tiny_model("llama", seed=1)
    tree = SelfSpecModel(model, heads=MedusaHeads.for_model(model, num_heads=3), tree_size=12)
    assert tree.tree_size == 12 and tree.verify_cost().size == 13
    assert SelfSpecModel(model, drafter="ngram").verify_cost().size == verify_cost.MAX_DRAFT_TOKENS + 1


def test_a_batch_curve_keeps_each_total_it_timed():
    """A batch's curve is indexed by its padded forward's tokens - 1, far past k = 8: with the few-row kernel a CPU's
    cost is nearly flat up to 16 rows and jumps after (batch 8 at width 2, 24 rows, left the kernel). The
    totals a batch timed (7, 15, 23) keep their own costs, saved and reloaded with how often each was timed.
    Catches (planted): residuals kept only for k <= 8 (the jump read as a line through the totals); the batch's
    curve kept non-decreasing (15 priced at the line's 14, 1.5); residuals kept in units of the fit's intercept (it
    fell ~15x as the line through 7 .. 23 was learned, and the early residuals were read at the new unit)."""
    measured = {7: 1.0, 15: 1.1, 23: 2.6}
    target = TargetModel(tiny_model("llama"))
    learned = verify_cost.learned_batch_verify_cost(target, prior_verify_cost(CPU))
    for step in range(150):
        n = (7, 15, 23)[step % 3]
        learned.observe(n, 0.01 * measured[n])
    relative = {n: learned(n) / learned(7) for n in measured}
    assert relative == pytest.approx(measured, rel=0.06)
    assert learned.knows(23) and not learned.knows(31)
    learned.save()
    reloaded = verify_cost.learned_batch_verify_cost(target, prior_verify_cost(CPU))  # as the next process finds it
    assert reloaded.knows(23) and {n: reloaded(n) / reloaded(7) for n in measured} == pytest.approx(relative, rel=0.02)
    assert reloaded.path == learned.path != verify_cost.learned_verify_cost(target).path


def test_a_kept_batch_price_holds_until_timed_here_and_the_timing_replaces_it():
    """A kept batch curve whose total 15 was timed at 3.35 decodes by an earlier batch (16 rows, at a cost
    this device no longer shows) beside totals 7 and 31 on a line of 0.06 a token. The next process prices 15 as
    kept until it times 15; its first timing (1.9 where 7 costs 1.42) replaces the kept price rather than averaging
    with it, and does not move the price of 31, which it did not time.
    Catches (planted): the kept curve taken whole as the start (after the timing 31 priced at 1.26x of 7,
    not 2.01x: the kink at 15 bent the fit); the kept price kept after a timing here (15 at 2.36x of 7)."""
    relative = [1 + 0.06 * k for k in range(verify_cost.BATCH_CURVE_SIZE)]
    relative[15] = 3.35
    timed = [0] * verify_cost.BATCH_CURVE_SIZE
    timed[7] = timed[15] = timed[31] = 100
    curve = verify_cost.batch_cost_curve(VerifyCost(tuple(relative), 0.01, tuple(timed)))
    assert [curve(k) for k in (7, 15, 31)] == pytest.approx([1.42, 3.35, 2.86])  # as kept
    assert curve.knows(15) and curve.knows(31) and not curve.knows(23)
    for _ in range(3):
        curve.observe(7, 0.0142)
    curve.observe(15, 0.019)
    assert curve(15) / curve(7) == pytest.approx(1.9 / 1.42, rel=0.05)
    assert curve(31) / curve(7) == pytest.approx(2.86 / 1.42, rel=0.05)


def test_the_prior_is_concave_and_steeper_on_a_cpu():
    cpu, gpu = prior_verify_cost(CPU), prior_verify_cost(torch.device("cuda"))
    steps = [cpu(k + 1) - cpu(k) for k in range(8)]
    assert all(a >= b for a, b in zip(steps, steps[1:])) and cpu(0) == gpu(0) == 1.0
    assert all(cpu(k) > gpu(k) for k in range(1, 9))


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("SELFSPEC_CACHE_DIR", str(tmp_path / "mine"))
    assert cache_dir() == tmp_path / "mine"
    monkeypatch.delenv("SELFSPEC_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "selfspec"


def test_first_call_measures_nothing_and_the_next_process_starts_from_the_kept_curve(monkeypatch):
    def no_measuring(*args, **kwargs):
        raise AssertionError("auto must not measure the curve up front")

    monkeypatch.setattr(verify_cost, "measure_verify_cost", no_measuring)
    model = tiny_model("llama", seed=1)
    spec = SelfSpecModel(model, drafter="ngram")
    spec.generate(repetitive_prompt(20, seed=2), max_new_tokens=30, eos_token_id=[])  # default: auto
    kept = json.loads(next((cache_dir() / "verify_cost").glob("*.json")).read_text())
    assert kept["relative"] == pytest.approx(list(spec.verify_cost().relative)) and kept["decode_seconds"] > 0
    fresh = SelfSpecModel(model, drafter="ngram").verify_cost()  # as a new process would find it
    assert fresh.decode_seconds == kept["decode_seconds"]
    for k, timed in enumerate(kept["timed"]):  # each timed price as kept (unless a cheaper k above is raised to it)
        if timed:
            assert fresh(k) == pytest.approx(max([kept["relative"][k]] + [fresh(j) for j in range(k)]))


def test_a_fixed_k_never_touches_the_cache():
    SelfSpecModel(tiny_model("llama"), drafter="ngram").generate(random_prompt(), max_new_tokens=5, num_draft_tokens=3)
    assert not (cache_dir() / "verify_cost").exists()


def test_the_key_names_dtype_and_threads():
    key = cost_key(TargetModel(tiny_model("llama", dtype=torch.float64)))
    assert key != cost_key(TargetModel(tiny_model("llama", dtype=torch.float32)))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)
        assert key != cost_key(TargetModel(tiny_model("llama", dtype=torch.float64)))
    finally:
        torch.set_num_threads(threads)
    assert key == cost_key(TargetModel(tiny_model("llama", seed=9)))  # the weights' values do not matter
    assert key != cost_key(TargetModel(tiny_model("llama", dtype=torch.float64)), tree=True)  # trees kept apart
    assert key != cost_key(TargetModel(tiny_model("llama", dtype=torch.float64)), few_row_kernel=True)  # its own
    assert key != cost_key(TargetModel(tiny_model("llama", dtype=torch.float64)), batch=True)  # batches apart


def test_the_key_names_the_kernels_version(monkeypatch):
    """A curve learned with one version of the few-row kernel is not read with another (a faster kernel verifies 8
    drafts for about a decode where a slower one took ~1.3)."""
    import selfspec.kernel.few_row_linear as frl

    target = TargetModel(tiny_model("llama"))
    key, without = cost_key(target, few_row_kernel=True), cost_key(target)
    assert key == cost_key(target, few_row_kernel=True)
    monkeypatch.setattr(frl, "kernel_version", lambda: "another")
    assert cost_key(target, few_row_kernel=True) != key
    assert cost_key(target) == without  # without the kernel: no version in the key


@pytest.mark.usefixtures("needs_kernel")
def test_an_engine_with_the_few_row_kernel_keeps_its_own_curve():
    from selfspec import SelfSpecModel

    model = tiny_model("llama", dtype=torch.float32)
    with_kernel, without = SelfSpecModel(model, drafter="ngram"), SelfSpecModel(model, drafter="ngram",
                                                                                few_row_kernel="off")
    assert with_kernel.verify_cost().path != without.verify_cost().path
    route = "one row" if with_kernel.few_row_linears.one_row else True
    assert with_kernel.verify_cost().path.name == f"{cost_key(with_kernel.target, few_row_kernel=route)}.json"


@pytest.mark.usefixtures("needs_kernel")
@pytest.mark.parametrize("one_row", [False, True])
def test_plain_decodings_route_is_measured_once_per_model_and_kept(monkeypatch, one_row):
    from selfspec import SelfSpecModel
    from selfspec.kernel.few_row_linear import FewRowLinears

    measured = []
    monkeypatch.setattr(FewRowLinears, "one_row_pays", lambda self: measured.append(1) or one_row)
    model = tiny_model("llama", dtype=torch.float32)
    first = SelfSpecModel(model, drafter="ngram")
    assert measured == [1] and first.few_row_linears.one_row == one_row
    second = SelfSpecModel(model, drafter="none")  # as a later wrapper or process finds it: kept, not measured
    assert measured == [1] and second.few_row_linears.one_row == one_row
    path = cache_dir() / "one_row" / f"{cost_key(first.target, few_row_kernel=True)}.json"
    assert json.loads(path.read_text()) == {"one_row": one_row}
    keys = {cost_key(first.target, few_row_kernel=route) for route in (False, True, "one row")}
    assert len(keys) == 3  # each route's verify curve apart: a one-row kernel decode is another unit of cost
    route = "one row" if one_row else True
    assert first.verify_cost().path.name == f"{cost_key(first.target, few_row_kernel=route)}.json"
    for content in ("not json", '{"one_row": 1}', '{"x": true}'):  # unreadable: measured again, and kept again
        path.write_text(content)
        assert SelfSpecModel(model, drafter="none").few_row_linears.one_row == one_row
    assert len(measured) == 4 and json.loads(path.read_text()) == {"one_row": one_row}
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)  # another key: measured for it
        SelfSpecModel(model, drafter="none")
    finally:
        torch.set_num_threads(threads)
    assert len(measured) == 5
    assert SelfSpecModel(model, drafter="none", few_row_kernel="off").few_row_linears is None and len(measured) == 5


@pytest.mark.parametrize("content", ["not json", '{"relative": [2.0, 1.0], "decode_seconds": 1}', '{"x": 1}'])
def test_a_broken_cache_file_falls_back_to_the_prior(content):
    target = TargetModel(tiny_model("llama"))
    path = cache_dir() / "verify_cost" / f"{cost_key(target)}.json"
    path.parent.mkdir(parents=True)
    path.write_text(content)
    assert verify_cost.learned_verify_cost(target).start == prior_verify_cost(CPU)
    assert isinstance(verify_cost.learned_verify_cost(target).start, VerifyCost)


def test_the_key_names_the_attention_path(monkeypatch):
    """A curve learned before the engine read grouped key/value heads in place (masked blocks cheaper on
    CPU) is not read after it."""
    import selfspec.draft_length.verify_cost as vc

    target = TargetModel(tiny_model("llama"))
    key = cost_key(target)
    monkeypatch.setattr(vc, "attention_route", lambda device: "another")
    assert cost_key(target) != key
