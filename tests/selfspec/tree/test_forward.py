"""The tree verify forward and its cache step on tiny float64 models: every node's hidden state equals a plain
forward over its path; keep_path leaves the cache a plain forward over the accepted path would; memory stays bounded."""
import pytest
import torch
from transformers import AttentionInterface, AutoModelForCausalLM
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from selfspec.cache_layer import SPARE_COLUMNS
from selfspec.target import TargetModel
from selfspec.tree.draft_tree import DraftTree
from selfspec.tree.cache import keep_path, path_offsets
from selfspec.tree.forward import check_tree_support, tree_attention_mask, tree_forward
from tests.conftest import VOCAB, column_bytes, random_prompt, tiny_config, tiny_model

FAMILIES = ["llama", "qwen2", "gpt2", "mistral"]
# root -> {0, 1, 2}; 0 -> {3, 4}; 3 -> {5}; 5 -> {6}; 1 -> {7}; 4 -> {8}: depths up to 4, siblings at three levels
PARENTS = [-1, -1, -1, 0, 0, 3, 5, 1, 4]


def wrapped(family, attn="sdpa", **kwargs):
    model = tiny_model(family, **kwargs)
    model.set_attn_implementation(attn)
    assert model.config._attn_implementation == attn  # the path this test names is the one taken
    return TargetModel(model)


def draft_tree(seed=0, parents=PARENTS):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randperm(VOCAB - 3, generator=g)[: len(parents)] + 3  # distinct, so any siblings are DISTINCT
    return DraftTree(tokens, torch.tensor(parents))


@torch.no_grad()
def plain_last_hidden(target, ids):
    return target.decoder(input_ids=ids[None], use_cache=False).last_hidden_state[0, -1]


def test_mask_attends_the_past_and_the_ancestors_only():
    t = DraftTree(torch.tensor([5, 6, 7]), torch.tensor([-1, -1, 0]))
    mask = tree_attention_mask(t, past_length=2, dtype=torch.float64, device="cpu")
    attended = (mask[0, 0] == 0).int().tolist()
    assert mask.shape == (1, 1, 4, 6)
    assert attended == [[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 0, 0], [1, 1, 1, 0, 1, 0], [1, 1, 1, 1, 0, 1]]
    assert mask.min() == torch.finfo(torch.float64).min


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("family", FAMILIES)
@torch.no_grad()
def test_tree_forward_equals_a_plain_forward_over_each_path(family, attn):
    target = wrapped(family, attn)
    prompt = random_prompt(7, seed=3)[0]
    tree = draft_tree()
    cache = target.new_cache()
    target.forward(prompt[:-1], cache)
    hidden = tree_forward(target, int(prompt[-1]), tree, cache)  # [num_nodes + 1, hidden]
    assert hidden.shape[0] == tree.num_nodes + 1 and cache.length == prompt.shape[0] - 1 + tree.num_nodes + 1
    # Llama-style eager attention takes its softmax in float32 even in a float64 model: rows of other lengths round
    # differently there (measured 2.4e-7), while a masked-out score contributes exactly 0 in either path.
    atol = 1e-6 if attn == "eager" and family != "gpt2" else 1e-9
    for node in range(-1, tree.num_nodes):
        expected = plain_last_hidden(target, torch.cat([prompt, tree.tokens[tree.path_to(node)]]))
        torch.testing.assert_close(hidden[node + 1], expected, rtol=0, atol=atol)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("family", FAMILIES)
def test_probe_accepts_families_that_honour_a_custom_mask(family, attn):
    check_tree_support(wrapped(family, attn))


def causal_only_attention(module, query, key, value, attention_mask, **kwargs):
    """Like a flash-attention kernel: knows only bottom-right causal masking, ignores the mask it is given."""
    q_len, kv_len = query.shape[-2], key.shape[-2]
    causal = torch.ones(q_len, kv_len, dtype=torch.bool).tril(kv_len - q_len)
    return sdpa_attention_forward(module, query, key, value, causal[None, None], **kwargs)


def test_probe_refuses_attention_that_ignores_the_custom_mask():
    AttentionInterface.register("causal_only_for_test", causal_only_attention)
    target = wrapped("llama", "causal_only_for_test")
    with pytest.raises(NotImplementedError, match="does not honour a custom 4D attention mask.*'sdpa' or 'eager'"):
        check_tree_support(target)


def test_probe_refuses_a_tree_forward_that_returns_the_wrong_number_of_states(monkeypatch):
    """Checked before any state is compared, so the refusal says what is wrong. Catches (planted): the count checked
    beside the first row's difference, which refused with "differs ... by 0 of the largest entry"."""
    import selfspec.tree.forward as module

    real = module.tree_forward
    monkeypatch.setattr(module, "tree_forward", lambda *args: real(*args)[:-2])
    with pytest.raises(NotImplementedError, match=r"gave 5 states for 7 tokens.*'sdpa' or 'eager'"):
        check_tree_support(wrapped("llama", "sdpa"))


def test_probe_runs_once_per_model_and_again_when_attention_changes():
    """A wrapper built per call does not re-probe; switching the attention implementation does. Catches (planted):
    the memo removed; the memo keyed on the model alone (a later switch to a mask-ignoring kernel goes unnoticed)."""
    AttentionInterface.register("causal_only_for_test", causal_only_attention)
    target = wrapped("llama", "sdpa")
    calls = []
    target.decoder.register_forward_hook(lambda module, args, output: calls.append(1))
    check_tree_support(target)
    probed = len(calls)
    check_tree_support(TargetModel(target.model))
    assert probed > 0 and len(calls) == probed
    target.model.config._attn_implementation = "causal_only_for_test"
    with pytest.raises(NotImplementedError, match="does not honour a custom 4D attention mask"):
        check_tree_support(target)


def test_probe_refuses_sliding_window_caches():
    config = tiny_config("mistral")
    config.sliding_window = 4
    torch.manual_seed(0)
    target = TargetModel(AutoModelForCausalLM.from_config(config).to(torch.float64).eval())
    with pytest.raises(NotImplementedError, match="full-attention cache layers"):
        check_tree_support(target)


def layer_kv(cache):
    return [(layer.keys, layer.values) for layer in cache.hf_cache.layers]


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("accepted", [(), (0,), (2,), (1, 7), (0, 4, 8), (0, 3, 5, 6)])
@torch.no_grad()
def test_keep_path_leaves_the_cache_of_a_plain_forward_over_the_path(family, accepted):
    target = wrapped(family)
    prompt = random_prompt(6, seed=4)[0]
    tree = draft_tree(seed=1)
    assert tree.path_to(accepted[-1] if accepted else -1) == list(accepted)
    path_tokens = tree.tokens[list(accepted)]

    cache = target.new_cache()
    target.forward(prompt[:-1], cache)
    committed = cache.length
    tree_forward(target, int(prompt[-1]), tree, cache)
    keep_path(cache, committed, path_offsets(accepted))
    assert cache.length == prompt.shape[0] + len(accepted)

    direct = target.new_cache()
    target.forward(torch.cat([prompt, path_tokens]), direct)
    for (k1, v1), (k2, v2) in zip(layer_kv(cache), layer_kv(direct)):
        torch.testing.assert_close(k1, k2, rtol=0, atol=1e-9)
        torch.testing.assert_close(v1, v2, rtol=0, atol=1e-9)
    # The next forward reads the moved entries: its logits equal a plain forward's.
    following = torch.tensor([17, 18])
    got = target.logits(target.forward(following, cache))
    expected = target.model(torch.cat([prompt, path_tokens, following])[None]).logits[0, -2:]
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-9)


def test_keep_path_rejects_bad_offsets():
    target = wrapped("llama")
    cache = target.new_cache()
    target.forward(random_prompt(4)[0], cache)
    with pytest.raises(ValueError, match="increasing"):
        keep_path(cache, 2, [0, 2, 1])
    with pytest.raises(ValueError, match="runs past"):
        keep_path(cache, 2, [0, 5])


@torch.no_grad()
def test_300_tree_steps_keep_memory_bounded_by_the_committed_length():
    target = wrapped("qwen2", max_positions=1024)
    g = torch.Generator().manual_seed(5)
    cache = target.new_cache()
    prompt = random_prompt(8, seed=5)[0]
    target.forward(prompt[:-1], cache)
    pending, committed_tokens = int(prompt[-1]), prompt.shape[0] - 1
    sizes = []
    for step in range(300):
        tree = draft_tree(seed=step)
        committed = cache.length
        assert committed == committed_tokens
        tree_forward(target, pending, tree, cache)
        # a random path of the tree: up to 2 accepted nodes, so the sequence grows slowly but rejections are many
        node, accepted = -1, []
        while tree.children[node + 1] and len(accepted) < 2 and torch.rand(1, generator=g) < 0.6:
            children = tree.children[node + 1]
            node = children[int(torch.randint(len(children), (1,), generator=g))]
            accepted.append(node)
        keep_path(cache, committed, path_offsets(accepted))
        committed_tokens += 1 + len(accepted)
        pending = int(torch.randint(3, VOCAB, (1,), generator=g))
        sizes.append((cache.nbytes(), cache.length))
    per_token = column_bytes(target.model)
    # Storage is what the committed tokens plus one tree's rows need, and the in-place layers' spare columns: nothing
    # of the ~2000 rejected rows.
    assert all(nbytes <= (length + len(PARENTS) + 1 + SPARE_COLUMNS) * per_token for nbytes, length in sizes)
    assert sizes[-1][1] == committed_tokens and committed_tokens > 400


def tree_around(truth, g):
    """A tree that holds a prefix of the greedy continuation `truth` on one branch, among wrong siblings."""
    tokens, parents = [], []

    def add(token, parent):
        tokens.append(int(token))
        parents.append(parent)
        return len(tokens) - 1

    parent, depth_right = -1, int(torch.randint(0, len(truth) + 1, (1,), generator=g))
    for depth, right in enumerate(truth):
        wrong = [t for t in torch.randperm(VOCAB - 3, generator=g)[:3].add(3).tolist() if t != int(right)][:2]
        siblings = wrong + ([int(right)] if depth < depth_right else [])
        order = torch.randperm(len(siblings), generator=g).tolist()
        nodes = {siblings[i]: add(siblings[i], parent) for i in order}
        if depth >= depth_right:
            break
        parent = nodes[int(right)]
    return DraftTree(torch.tensor(tokens, dtype=torch.long), torch.tensor(parents, dtype=torch.long))


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@torch.no_grad()
def test_greedy_decoding_with_tree_drafts_equals_generate(family):
    """The pieces in the order the decode loop will call them: tree forward, verify, keep_path, feed back."""
    from selfspec.tree.verifier import verify_tree_greedy

    target = wrapped(family)
    prompt = random_prompt(8, seed=6)
    num_new = 40
    expected = target.model.generate(prompt, max_new_tokens=num_new, do_sample=False, eos_token_id=None,
                                     attention_mask=torch.ones_like(prompt))[0].tolist()
    g = torch.Generator().manual_seed(0)
    cache = target.new_cache()
    target.forward(prompt[0, :-1], cache)
    out, pending, accepted_total = prompt[0].tolist(), int(prompt[0, -1]), 0
    while len(out) < len(expected):
        tree = tree_around(torch.tensor(expected[len(out) : len(out) + 3]), g)
        committed = cache.length
        hidden = tree_forward(target, pending, tree, cache)  # [num_nodes + 1, hidden]
        verdict = verify_tree_greedy(tree, target.logits(hidden))
        keep_path(cache, committed, path_offsets(verdict.accepted_nodes))
        out += tree.tokens[list(verdict.accepted_nodes)].tolist() + [verdict.next_token]
        pending, accepted_total = verdict.next_token, accepted_total + verdict.num_accepted
        assert cache.length == len(out) - 1
    assert out[: len(expected)] == expected
    assert accepted_total > 10  # drafts were accepted, often off the first sibling
