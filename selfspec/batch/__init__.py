"""Several prompts decoded together, each exactly as alone: the batch decode loop (`decode`), its ragged KV cache
(`cache`) and what it returns (`output`)."""
