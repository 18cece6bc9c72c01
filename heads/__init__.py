"""Drafting heads for selfspec and their checkpoint formats."""
from heads.medusa import BaseIdentity, MedusaConfig, MedusaHeads

__all__ = ["BaseIdentity", "MedusaConfig", "MedusaHeads"]
