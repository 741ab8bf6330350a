"""K policies: choose the draft tokens per step (vocabulary: `policies.types`)."""
