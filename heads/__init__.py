"""Drafting heads for selfspec and their checkpoint formats."""
from heads.eagle import EagleConfig, EagleHead
from heads.exit_adapter import ExitAdapter, ExitAdapterConfig
from heads.medusa import BaseIdentity, MedusaConfig, MedusaHeads

__all__ = [
    "BaseIdentity", "EagleConfig", "EagleHead", "ExitAdapter", "ExitAdapterConfig", "MedusaConfig", "MedusaHeads",
]
