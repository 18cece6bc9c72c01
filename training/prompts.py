"""Chat prompts for self-distillation and for held-out evaluation, written for this project (no download).

Training prompts are every combination of a request template and a topic, in three sets: "topics" (explain,
summarise, write about a subject), "everyday" (practical how-to and advice about everyday activities and objects,
written because the first set's heads drafted markedly worse on the benchmark's everyday questions than on
held-out replies of their own set) and "questions" (requests phrased as people type them, on a third set of
topics, for more and more varied self-distillation data). Evaluation prompts are the benchmark's hand-written
questions, whose topics appear in no training prompt and whose openings no template shares
(`tests/training/test_prompts.py`). Knows nothing about models.
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

EVERYDAY_TEMPLATES = (
    "How does {t} actually work?",
    "I'm new to {t}. Where should I start?",
    "What are the most common mistakes people make with {t}?",
    "Give me a checklist for {t}.",
    "Write a funny rhyme about {t}.",
    "What are some cheap ways to get into {t}?",
    "Explain {t} to me like I'm a complete beginner.",
    "My friend wants to try {t}. What advice should I give them?",
    "What tools or equipment do I need for {t}?",
    "Write a short encouraging note to someone struggling with {t}.",
    "What is a good daily routine for {t}?",
    "Plan a relaxed Saturday around {t}.",
    "What safety tips should I keep in mind for {t}?",
    "How long does it take to get good at {t}?",
    "Write the opening of a blog post about {t}.",
    "What questions should I ask an expert in {t}?",
    "Tell me a fun fact about {t} and explain why it is true.",
    "How has {t} changed over the last fifty years?",
    "Give me a short list of pros and cons of {t}.",
    "Describe a typical day for someone who works with {t}.",
    "What is the science behind {t}?",
    "Write a two-line joke about {t}.",
    "How can children learn about {t} at home?",
    "What are three myths about {t}?",
)

EVERYDAY_TOPICS = (
    "knitting", "growing tomatoes", "learning to swim", "sourdough starters", "ironing shirts", "running a marathon",
    "composting", "home insurance", "washing machines", "electric kettles", "public transport", "hiking boots",
    "learning Spanish", "budgeting apps", "painting a room", "fixing a flat tire", "job interviews", "houseplants",
    "dog training", "birdwatching", "skateboarding", "woodworking", "making soup", "taking notes in class",
    "smartphone batteries", "thermostats", "umbrellas", "sunscreen", "yoga", "grilling vegetables",
    "moving to a new city", "writing a resume", "podcasts", "board games", "baking cookies", "traffic lights",
    "lighthouses", "elevators", "hot air balloons", "sailing", "fishing", "ice skating", "snowboarding", "pottery",
    "calligraphy", "stargazing", "tying knots", "sewing on buttons", "crossword puzzles", "magic tricks",
    "saving for retirement", "renting an apartment", "first aid kits", "cleaning windows", "recording music at home",
    "learning to drive", "email etiquette", "washing dishes", "organizing a closet", "microwave ovens",
)

QUESTION_TEMPLATES = (
    "Can you explain how {t} works, step by step?",
    "What's the best way to learn about {t} quickly?",
    "Write an upbeat radio announcement about {t}.",
    "I keep hearing about {t}. What is it, in plain words?",
    "Compare {t} today with how it looked when it first appeared.",
    "Give me a simple plan for getting started with {t}.",
    "Why do people find {t} so interesting?",
    "What are five surprising things about {t}?",
    "Write a four-line song chorus about {t}.",
    "How would a teacher introduce {t} to a class?",
    "What goes wrong most often with {t}, and how do I avoid it?",
    "Summarize what everyone should know about {t} in one paragraph.",
    "Describe {t} from the point of view of a curious child.",
    "What would happen if {t} disappeared tomorrow?",
    "Write a short speech celebrating {t}.",
    "How do experts measure or test {t}?",
    "Give me a numbered list of tips about {t}.",
    "Write a short story for kids about {t}.",
    "What are the biggest open questions about {t}?",
    "How can I explain {t} to my grandparents?",
    "What is one simple experiment or activity that shows how {t} works?",
    "Write a thank-you note to the people behind {t}.",
    "What vocabulary should I know to talk about {t}?",
    "Is {t} worth learning about? Give me honest reasons.",
    "Make a short study guide about {t}.",
    "Write a dialogue between a student and a teacher about {t}.",
    "What are the stages or parts of {t}?",
    "How is {t} different today from a hundred years ago?",
)

QUESTION_TOPICS = (
    "hurricanes", "lightning", "rainbows", "the northern lights", "earthworms", "octopuses", "whales", "ants",
    "mushrooms", "bamboo", "tornadoes", "caves", "sand dunes", "waterfalls", "the human skeleton", "eyesight",
    "hearing", "digestion", "muscles", "blood types", "memory", "habits", "negotiation", "leadership styles",
    "first impressions", "procrastination", "kindness", "curiosity", "bridges", "skyscrapers", "canals",
    "the postal service", "maps", "compasses", "clocks", "calendars", "coins", "taxes", "banks", "insurance",
    "spreadsheets", "databases", "operating systems", "web browsers", "passwords", "email", "search engines",
    "3D printing", "drones", "satellites", "telescopes", "microscopes", "magnets", "electricity", "sound waves",
    "friction", "rust", "glass making", "paper making", "cheese making",
)

PROMPT_SETS = {
    "topics": (TRAIN_TEMPLATES, TRAIN_TOPICS),
    "everyday": (EVERYDAY_TEMPLATES, EVERYDAY_TOPICS),
    "questions": (QUESTION_TEMPLATES, QUESTION_TOPICS),
}

# Held out: the benchmark's chat prompts (selfspec/bench/prompts.py); none of their topics is a training topic.
EVAL_PROMPTS = CHAT_PROMPTS


def train_prompts(seed: int = 0, prompt_set: str = "topics") -> list[str]:
    """Every template x topic of one set, in a fixed shuffled order (so a time-budgeted run covers topics evenly)."""
    if prompt_set not in PROMPT_SETS:
        raise ValueError(f"prompt_set: one of {sorted(PROMPT_SETS)}, got {prompt_set!r}")
    templates, topics = PROMPT_SETS[prompt_set]
    prompts = [template.format(t=topic) for topic in topics for template in templates]
    random.Random(seed).shuffle(prompts)
    return prompts


def eval_prompts() -> list[str]:
    return list(EVAL_PROMPTS)


# What the held-out questions are about, as lowercase stems: a prompt written by the model itself
# (training/self_prompts.py) that contains one is not trained on.
EVAL_TOPIC_STEMS = (
    "piano", "submarine", "new job", "refrigerator", "fridge", "virus", "bacteri", "pancake", "leaves", "autumn",
    "handwriting", "butterfl", "caterpillar", "team leader", "airplane", "aeroplane", "aircraft", "limerick",
    "grocer", "compiler", "glacier", "camping",
)


def is_held_out(prompt: str) -> bool:
    """Whether a prompt touches a held-out question: one of its topics, or its opening (three words or more)."""
    lowered = " ".join(prompt.lower().split())
    if any(stem in lowered for stem in EVAL_TOPIC_STEMS):
        return True
    return any(lowered.startswith(" ".join(q.lower().split()[:3])) for q in EVAL_PROMPTS)
