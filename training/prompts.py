"""Chat prompts for self-distillation and for held-out evaluation, written for this project (no download).

Training prompts are every combination of a request template and a topic; evaluation prompts are the benchmark's
hand-written questions, whose topics appear in no training prompt (`tests/training/test_prompts.py` checks that no
training topic occurs in an evaluation prompt). Knows nothing about models.
"""
from __future__ import annotations

import random

from selfspec.bench.prompts import CHAT_PROMPTS

TRAIN_TEMPLATES = (
    "Explain {t} in simple terms.",
    "What is {t}?",
    "Give me three interesting facts about {t}.",
    "Write a short paragraph about {t}.",
    "Why is {t} important?",
    "How would you describe {t} to a ten-year-old?",
    "What are the main advantages and disadvantages of {t}?",
    "Write a short poem about {t}.",
    "Summarize the history of {t} in a few sentences.",
    "List five questions a student might ask about {t}.",
    "What are common misconceptions about {t}?",
    "Give a step-by-step introduction to {t}.",
    "Write a friendly email to a colleague recommending they learn about {t}.",
    "How does {t} affect everyday life?",
    "What should a beginner know about {t}?",
    "Compare {t} with something similar and explain the difference.",
    "Write a haiku about {t}.",
    "Tell me a short story that involves {t}.",
    "What careers are related to {t}?",
    "Give me a quick quiz with answers about {t}.",
    "What are the key terms someone should learn about {t}?",
    "Describe the future of {t}.",
    "Can you give me some tips related to {t}?",
    "Write a tweet about {t}.",
    "Explain {t} using an analogy.",
    "What problems does {t} solve?",
    "Write a short dialogue between two friends discussing {t}.",
    "What books or resources would help me learn about {t}?",
    "Describe {t} in exactly three sentences.",
    "What are the ethical questions around {t}?",
    "Give an example of {t} in practice.",
    "Write a product description inspired by {t}.",
)

TRAIN_TOPICS = (
    "photosynthesis", "black holes", "the water cycle", "machine learning", "the Roman Empire", "volcanoes",
    "climate change", "the stock market", "vaccines", "renewable energy", "the human heart", "plate tectonics",
    "democracy", "the internet", "recycling", "honeybees", "the moon landing", "coffee", "meditation",
    "electric cars", "the French Revolution", "DNA", "rainforests", "chess", "jazz music", "the Olympic Games",
    "bread baking", "sleep", "gravity", "the printing press", "coral reefs", "cryptography", "solar panels",
    "the immune system", "inflation", "origami", "dinosaurs", "the Great Wall of China", "earthquakes",
    "social media", "public libraries", "gardening", "the periodic table", "bicycles", "friendship",
    "time management", "the Amazon river", "penguins", "nuclear fusion", "the Renaissance", "tea ceremonies",
    "robots", "weather forecasting", "the ocean tides", "microbes", "video games", "the Silk Road", "mathematics",
    "public speaking", "birds migration", "batteries", "architecture", "the human brain", "deserts",
    "programming in Python", "world languages", "mountain climbing", "chocolate", "trains", "the solar system",
    "exercise", "photography", "volunteering", "antibiotics", "the Industrial Revolution", "cloud computing",
    "elephants", "minimalism", "wind turbines", "ancient Egypt",
)

# Held out: the benchmark's chat prompts (selfspec/bench/prompts.py); none of their topics is a training topic.
EVAL_PROMPTS = CHAT_PROMPTS


def train_prompts(seed: int = 0) -> list[str]:
    """Every template x topic, in a fixed shuffled order (so a time-budgeted run covers topics evenly)."""
    prompts = [template.format(t=topic) for topic in TRAIN_TOPICS for template in TRAIN_TEMPLATES]
    random.Random(seed).shuffle(prompts)
    return prompts


def eval_prompts() -> list[str]:
    return list(EVAL_PROMPTS)
