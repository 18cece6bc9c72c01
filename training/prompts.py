"""Chat prompts for self-distillation and for held-out evaluation, written for this project (no download).

Training prompts are every combination of a request template and a topic; evaluation prompts are hand-written
questions whose topics appear in no training prompt (`tests/training/test_prompts.py` checks the two sets share
no prompt and no topic word list entry). Knows nothing about models.
"""
from __future__ import annotations

import random

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

# Held out: none of these topics (nor these phrasings) is in a training prompt.
EVAL_PROMPTS = (
    "What are the benefits of learning to play the piano as an adult?",
    "How do submarines dive and surface?",
    "Write a short motivational message for someone starting a new job.",
    "Explain how a refrigerator keeps food cold.",
    "What is the difference between a virus and a bacterium?",
    "Give me a simple recipe for pancakes.",
    "Why do leaves change color in autumn?",
    "How can I improve my handwriting?",
    "Describe the life cycle of a butterfly.",
    "What makes a good team leader?",
    "How do airplanes stay in the air?",
    "Write a limerick about a cat who loves cheese.",
    "What are some ways to save money on groceries?",
    "Explain what a compiler does.",
    "How do glaciers shape the landscape?",
    "What should I pack for a weekend camping trip?",
)


def train_prompts(seed: int = 0) -> list[str]:
    """Every template x topic, in a fixed shuffled order (so a time-budgeted run covers topics evenly)."""
    prompts = [template.format(t=topic) for topic in TRAIN_TOPICS for template in TRAIN_TEMPLATES]
    random.Random(seed).shuffle(prompts)
    return prompts


def eval_prompts() -> list[str]:
    return list(EVAL_PROMPTS)
