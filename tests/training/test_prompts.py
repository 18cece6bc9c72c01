"""The chat prompts heads are trained on and the held-out ones the benchmark measures on never overlap."""
from training import prompts


def test_training_and_evaluation_prompts_are_disjoint_down_to_their_topics():
    train = prompts.train_prompts()
    evaluation = prompts.eval_prompts()
    assert len(train) == len(set(train)) == len(prompts.TRAIN_TEMPLATES) * len(prompts.TRAIN_TOPICS)
    assert not set(train) & set(evaluation)
    for question in evaluation:
        lowered = question.lower()
        shared = [topic for topic in prompts.TRAIN_TOPICS if topic.lower() in lowered]
        assert not shared, f"held-out prompt {question!r} mentions training topics {shared}"


def test_the_order_is_a_fixed_shuffle():
    assert prompts.train_prompts(0) == prompts.train_prompts(0) != prompts.train_prompts(1)
    assert sorted(prompts.train_prompts(0)) == sorted(prompts.train_prompts(1))
