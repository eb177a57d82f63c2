"""Integrations with other libraries: :mod:`attn_ref.integrations.transformers` (Hugging Face
transformers)."""
