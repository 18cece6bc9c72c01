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


@pytest.mark.parametrize("prompt_set", sorted(prompts.PROMPT_SETS))
def test_no_template_opens_the_way_a_held_out_prompt_does(prompt_set):
    # A template whose fixed opening (three words or more) begins a benchmark question would teach the heads that
    # question's phrasing: the held-out prompts must be held out in form as well as in topic.
    templates, _ = prompts.PROMPT_SETS[prompt_set]
    for template in templates:
        opening = template.split("{t}")[0]
        if len(opening.split()) < 3:
            continue
        starts = [q for q in prompts.eval_prompts() if q.lower().startswith(opening.lower())]
        assert not starts, f"template {template!r} opens as held-out {starts}"


def test_the_sets_share_no_prompt():
    sets = {name: set(prompts.train_prompts(prompt_set=name)) for name in prompts.PROMPT_SETS}
    for name, train in sets.items():
        for other, other_train in sets.items():
            assert name == other or not train & other_train


def test_the_order_is_a_fixed_shuffle():
    assert prompts.train_prompts(0) == prompts.train_prompts(0) != prompts.train_prompts(1)
    assert sorted(prompts.train_prompts(0)) == sorted(prompts.train_prompts(1))


def test_an_unknown_set_is_refused():
    with pytest.raises(ValueError, match="everyday"):
        prompts.train_prompts(prompt_set="news")


def test_every_held_out_question_is_caught_by_its_topic_and_by_its_opening():
    for question in prompts.eval_prompts():
        assert prompts.is_held_out(question)
        # its topic: a stem of EVAL_TOPIC_STEMS, whatever the phrasing around it
        topics = [stem for stem in prompts.EVAL_TOPIC_STEMS if stem in question.lower()]
        assert topics and prompts.is_held_out("Tell me about " + topics[0] + " please"), question
        # its opening alone, the rest replaced
        assert prompts.is_held_out(" ".join(question.split()[:3]) + " something unrelated entirely"), question


def test_prompts_on_other_topics_pass():
    for prompt in ("Can you give me some information on the different types of fungi?",
                   "I'm planning a community garden. Can you suggest a plan?",
                   "Which protagonist works best in a creative writing story?"):
        assert not prompts.is_held_out(prompt), prompt
