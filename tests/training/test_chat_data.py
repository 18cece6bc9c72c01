"""training.chat_data: replies written by selfspec's batched generate drafting with an EAGLE head are exactly the
base's greedy replies, and one forward records the final state and feature layers of prompt + reply."""
import torch

from selfspec import SelfSpecModel
from selfspec.target import TargetModel
from tests.conftest import random_prompt, tiny_model
from tests.selfspec.exercised import assert_exercised
from tests.selfspec.drafters.test_eagle import sharp, trained_head
from training.chat_data import answer_batch_drafted, record_features


def test_drafted_replies_are_the_bases_greedy_replies_and_their_features_are_recorded():
    model = sharp(tiny_model(num_layers=4))
    spec = SelfSpecModel(model, heads=trained_head(model))
    prompts = [random_prompt(n, seed=s)[0].tolist() for s, n in ((0, 6), (1, 9), (2, 4))]
    eos = {int(random_prompt(1, seed=9)[0, 0])}
    records, stats = answer_batch_drafted(spec, prompts, 20, greedy=True, seed=0, eos=eos)
    assert_exercised([stats], what="replies drafted by an EAGLE head")
    for prompt, record in zip(prompts, records):
        plain = model.generate(torch.tensor([prompt]), max_new_tokens=20, do_sample=False, eos_token_id=sorted(eos),
                               pad_token_id=0)[0].tolist()
        reply = plain[len(prompt):]
        end = next((i + 1 for i, token in enumerate(reply) if token in eos), len(reply))
        assert record["ids"].tolist() == prompt + reply[:end] and record["reply_start"] == len(prompt)
    target = TargetModel(model)
    target.set_feature_layers((1, 3))
    record_features(target, records)
    for record in records:
        out = model.get_decoder()(input_ids=record["ids"][None].long(), output_hidden_states=True)
        expected = torch.cat([out.last_hidden_state, out.hidden_states[1], out.hidden_states[3]], -1)[0, :-1]
        torch.testing.assert_close(record["hidden"].double(), expected.to(torch.float16).double())
        assert record["hidden"].dtype == torch.float16
