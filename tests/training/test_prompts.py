"""The chat prompts heads are trained on and the held-out ones the benchmark measures on never overlap."""
import pytest

from training import prompts


@pytest.mark.parametrize("prompt_set", sorted(prompts.PROMPT_SETS))
def test_training_and_evaluation_prompts_are_disjoint_down_to_their_topics(prompt_set):
    templates, topics = prompts.PROMPT_SETS[prompt_set]
    train = prompts.train_prompts(prompt_set=prompt_set)
    evaluation = prompts.eval_prompts()
    assert len(train) == len(set(train)) == len(templates) * len(topics)
    assert not set(train) & set(evaluation)
    for question in evaluation:
        lowered = question.lower()
        shared = [topic for topic in topics if topic.lower() in lowered]
        assert not shared, f"held-out prompt {question!r} mentions training topics {shared}"


def test_the_sets_share_no_prompt():
    assert not set(prompts.train_prompts(prompt_set="topics")) & set(prompts.train_prompts(prompt_set="everyday"))


def test_the_order_is_a_fixed_shuffle():
    assert prompts.train_prompts(0) == prompts.train_prompts(0) != prompts.train_prompts(1)
    assert sorted(prompts.train_prompts(0)) == sorted(prompts.train_prompts(1))


def test_an_unknown_set_is_refused():
    with pytest.raises(ValueError, match="everyday"):
        prompts.train_prompts(prompt_set="news")
