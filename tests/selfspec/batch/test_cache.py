"""The ragged cache: each row's committed entries equal a single sequence's written directly, whatever was appended and
rejected in between; the mask and positions are exactly each row's own; finished rows leave; memory stays bounded."""
import pytest
import torch

from selfspec.batch.decode import _forward_block, _pad
from selfspec.batch.cache import RaggedCache
from selfspec.cache_layer import SPARE_COLUMNS
from selfspec.target import TargetModel
from tests.conftest import column_bytes, random_prompt, tiny_model


def row_entries(cache: RaggedCache, row: int):
    """[(keys, values)] per layer: row `row`'s committed entries [heads, length, dim]."""
    length = int(cache.lengths[row])
    return [(layer.keys[row, :, :length], layer.values[row, :, :length]) for layer in cache.hf_cache.layers]


def alone_entries(target, ids):
    cache = target.new_cache()
    target.forward(ids, cache)
    return [(layer.keys[0], layer.values[0]) for layer in cache.hf_cache.layers]


def assert_rows_equal_alone(target, cache, sequences):
    for row, ids in enumerate(sequences):
        assert int(cache.lengths[row]) == ids.shape[0]
        for (k, v), (k_alone, v_alone) in zip(row_entries(cache, row), alone_entries(target, ids)):
            torch.testing.assert_close(k, k_alone, rtol=0, atol=1e-10)
            torch.testing.assert_close(v, v_alone, rtol=0, atol=1e-10)


@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2"])
def test_appended_blocks_kept_in_part_equal_each_row_written_alone(family):
    """Prompts of 3, 9 and 6 tokens; then three blocks per row of different widths where only a prefix is kept (the
    rest is 'rejected'); every row's entries equal a plain forward over what it kept."""
    target = TargetModel(tiny_model(family))
    prompts = [random_prompt(n, seed=n)[0] for n in (3, 9, 6)]
    cache = RaggedCache(target.model, len(prompts), target.device)
    _forward_block(target, cache, _pad(prompts))
    cache.commit(torch.tensor([p.shape[0] for p in prompts]))
    assert cache.width == 9
    assert_rows_equal_alone(target, cache, prompts)
    sequences = list(prompts)
    g = torch.Generator().manual_seed(0)
    for kept in ([1, 3, 2], [4, 1, 1], [2, 2, 5]):
        blocks = [torch.randint(3, 90, (k + int(torch.randint(0, 3, (1,), generator=g)),), generator=g) for k in kept]
        _forward_block(target, cache, _pad(blocks))
        cache.commit(torch.tensor(kept))
        sequences = [torch.cat([s, b[:k]]) for s, b, k in zip(sequences, blocks, kept)]
        assert cache.width == max(s.shape[0] for s in sequences)
        assert_rows_equal_alone(target, cache, sequences)


def test_block_mask_and_positions_are_each_rows_own():
    target = TargetModel(tiny_model("llama"))
    cache = RaggedCache(target.model, 2, target.device)
    _forward_block(target, cache, _pad([random_prompt(2)[0], random_prompt(4)[0]]))
    cache.commit(torch.tensor([2, 4]))
    attended = cache.block_mask(3, torch.float64)[:, 0] == 0  # [2, 3, 4 + 3]
    expected = torch.tensor([
        [[1, 1, 0, 0, 1, 0, 0], [1, 1, 0, 0, 1, 1, 0], [1, 1, 0, 0, 1, 1, 1]],  # row 0: 2 committed, stale columns 2, 3
        [[1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1, 1]],
    ], dtype=torch.bool)
    assert torch.equal(attended, expected)
    assert torch.equal(cache.block_positions(3), torch.tensor([[2, 3, 4], [4, 5, 6]]))
    assert cache.block_mask(1, torch.float32).min() == torch.finfo(torch.float32).min


def test_select_drops_rows_and_crops_to_the_widest_left():
    target = TargetModel(tiny_model("llama"))
    prompts = [random_prompt(n, seed=n)[0] for n in (5, 11, 7)]
    cache = RaggedCache(target.model, 3, target.device)
    _forward_block(target, cache, _pad(prompts))
    cache.commit(torch.tensor([5, 11, 7]))
    cache.select(torch.tensor([2, 0]))
    assert cache.batch_size == 2 and cache.width == 7
    assert all(layer.keys.shape[:3] == (2, layer.keys.shape[1], 7) for layer in cache.hf_cache.layers)
    assert_rows_equal_alone(target, cache, [prompts[2], prompts[0]])


def test_memory_stays_bounded_over_many_rejections():
    """300 blocks of 6 where only the first entry is kept (a pending token, every draft rejected): storage stays
    within one block of the committed width, never grows with what was rejected."""
    target = TargetModel(tiny_model("llama"))
    cache = RaggedCache(target.model, 2, target.device)
    _forward_block(target, cache, _pad([random_prompt(4)[0], random_prompt(8)[0]]))
    cache.commit(torch.tensor([4, 8]))
    per_column = column_bytes(target.model, batch_size=2)  # bytes of one column of every row and layer
    peak_excess = 0.0
    for step in range(300):
        _forward_block(target, cache, torch.full((2, 6), 5 + step % 50))
        cache.commit(torch.tensor([1, 1]))
        peak_excess = max(peak_excess, cache.nbytes() / per_column - cache.width)
    assert cache.width == 308
    assert peak_excess <= 6 + SPARE_COLUMNS  # the cropped block's slack and the in-place layers' spare columns


def test_sliding_window_families_are_refused():
    model = tiny_model("mistral")
    model.config.sliding_window = 4
    model.config.layer_types = ["sliding_attention"] * model.config.num_hidden_layers
    with pytest.raises(NotImplementedError, match="full-attention"):
        RaggedCache(model, 2, "cpu")


def test_rollback_cuts_rows_back_to_shorter_lengths():
    """Entries committed on guesses (a drafter's) are cut: each row back to its own length, cropped to the widest;
    rolling a row forward is refused."""
    target = TargetModel(tiny_model("llama"))
    prompts = [random_prompt(n, seed=n)[0] for n in (5, 11, 7)]
    cache = RaggedCache(target.model, 3, target.device)
    _forward_block(target, cache, _pad(prompts))
    cache.commit(torch.tensor([5, 11, 7]))
    _forward_block(target, cache, torch.full((3, 3), 9))
    cache.commit(torch.tensor([3, 1, 2]))
    cache.rollback(torch.tensor([5, 10, 7]))
    assert cache.width == 10 and all(layer.keys.shape[2] == 10 for layer in cache.hf_cache.layers)
    assert_rows_equal_alone(target, cache, [prompts[0], prompts[1][:10], prompts[2]])
    with pytest.raises(ValueError, match="forward"):
        cache.rollback(torch.tensor([6, 10, 7]))


def test_a_config_builds_the_cache_of_another_module():
    from heads.eagle import EagleHead

    model = tiny_model("llama", num_layers=2)
    head = EagleHead.for_model(model)
    cache = RaggedCache(head, 2, "cpu", config=head.layer_config)
    assert len(cache.hf_cache.layers) == head.config.num_layers == 1
