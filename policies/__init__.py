"""K policies: choose the number of draft tokens per step (see `policies.types` for the vocabulary)."""
