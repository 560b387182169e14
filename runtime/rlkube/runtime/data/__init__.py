"""Training data: sources and formats, tokenizers, packing, length bucketing, the step sampler, prefetch."""
