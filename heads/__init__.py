"""Drafting heads for selfspec and their checkpoint formats."""
from heads.exit_adapter import ExitAdapter, ExitAdapterConfig
from heads.medusa import BaseIdentity, MedusaConfig, MedusaHeads

__all__ = ["BaseIdentity", "ExitAdapter", "ExitAdapterConfig", "MedusaConfig", "MedusaHeads"]
