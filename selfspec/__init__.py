"""selfspec: exact self-speculative decoding for one Hugging Face causal LM."""
from selfspec.drafters import Draft, DraftContext, Drafter
from selfspec.engine import GenerateOutput, SelfSpecModel
from selfspec.sampling import SamplingConfig
from selfspec.stats import GenerationStats

__all__ = ["Draft", "DraftContext", "Drafter", "GenerateOutput", "GenerationStats", "SamplingConfig", "SelfSpecModel"]
