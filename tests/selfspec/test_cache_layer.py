"""The append-in-place cache layer: the same keys, values and forward outputs as transformers' DynamicLayer, bit for
bit, through prefill, blocks, rollbacks and a batch's rows leaving; a copy of the cache only when its spare columns
run out; storage bounded by the longest length reached plus the spare columns."""
import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from selfspec.cache_layer import SPARE_COLUMNS, AppendInPlaceLayer, append_in_place
from tests.conftest import column_bytes, random_prompt, tiny_model


def run_script(model, cache, seed=0):
    """Prefill 2 rows, then 60 blocks of 1-5 tokens each followed by a rollback of 0..block tokens, a row leaving
    half-way: every forward's last hidden states, and the final keys and values."""
    g = torch.Generator().manual_seed(seed)
    outputs = []
    ids = torch.randint(3, 90, (2, 9), generator=g)
    outputs.append(model.model(input_ids=ids, cache=cache, use_cache=True).last_hidden_state)
    for step in range(60):
        if step == 30:
            cache.batch_select_indices(torch.tensor([1]))
        block = int(torch.randint(1, 6, (1,), generator=g))
        ids = torch.randint(3, 90, (cache.layers[0].keys.shape[0], block), generator=g)
        length = cache.get_seq_length()
        positions = torch.arange(length, length + block)[None].expand(ids.shape[0], -1)
        outputs.append(model.model(input_ids=ids, position_ids=positions, cache=cache,
                                   use_cache=True).last_hidden_state)
        cache.crop(-int(torch.randint(0, block + 1, (1,), generator=g)))  # (crop(-n) removes n)
    return outputs, [(layer.keys, layer.values) for layer in cache.layers]


def test_same_bits_as_dynamic_layer():
    model = tiny_model("llama", dtype=torch.float32)
    plain = DynamicCache(config=model.config)
    in_place = append_in_place(DynamicCache(config=model.config))
    assert all(type(layer) is AppendInPlaceLayer for layer in in_place.layers)
    assert all(type(layer) is DynamicLayer for layer in plain.layers)
    with torch.no_grad():
        expected, expected_kv = run_script(model, plain)
        got, got_kv = run_script(model, in_place)
    assert len(got) == len(expected) == 61
    assert all(torch.equal(a, b) for a, b in zip(got, expected))
    assert all(torch.equal(k, k2) and torch.equal(v, v2) for (k, v), (k2, v2) in zip(got_kv, expected_kv))


def test_a_copy_only_when_the_spare_columns_run_out_and_storage_stays_bounded():
    model = tiny_model("llama")
    cache = append_in_place(DynamicCache(config=model.config))
    layer = cache.layers[0]
    buffers, peak_excess = set(), 0.0
    with torch.no_grad():
        model(random_prompt(8), cache=cache, use_cache=True)
        for step in range(300):  # one kept token and 4 rejected ones per step
            length = cache.get_seq_length()
            block = random_prompt(5, seed=step)
            model(block, position_ids=torch.arange(length, length + 5)[None], cache=cache, use_cache=True)
            cache.crop(-4)
            buffers.add(layer._key_buffer.data_ptr())
            total = sum(t.untyped_storage().nbytes() for lay in cache.layers for t in (lay.keys, lay.values))
            peak_excess = max(peak_excess, total / column_bytes(model) - cache.get_seq_length())
    assert cache.get_seq_length() == 308
    assert len(buffers) <= 308 // SPARE_COLUMNS + 1  # DynamicLayer copies the whole cache every step: 300 times
    assert peak_excess <= 5 + SPARE_COLUMNS  # one block's slack and the spare columns: nothing of the rejections


def test_keys_replaced_from_outside_are_copied_into_a_new_buffer():
    """Someone assigns a layer's keys and values (not views of its buffers): the next block still appends to them."""
    layer = AppendInPlaceLayer()
    first = torch.randn(1, 2, 3, 4)
    layer.update(first, first + 1)
    replaced = torch.randn(1, 2, 5, 4)
    layer.keys, layer.values = replaced, replaced + 1
    block = torch.randn(1, 2, 2, 4)
    keys, values = layer.update(block, block + 1)
    assert torch.equal(keys, torch.cat([replaced, block], dim=2))
    assert torch.equal(values, torch.cat([replaced + 1, block + 1], dim=2))
