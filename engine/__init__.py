"""servelab engine: the torch-free scheduler core (sequence, batch, block manager,
scheduler, recorder) plus the paged-attention inference engine (torch)."""
