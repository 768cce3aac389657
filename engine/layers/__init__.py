"""Model building blocks: attention backends, rotary embedding, norms, linear layers, sampler."""
