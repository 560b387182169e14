"""Model shapes the GPU benchmarks build from a config (random init: speed does not depend on weights)."""

SHAPES = {
    # Qwen2.5-1.5B's config.json, minus the weights
    "qwen1.5b": dict(model_type="qwen2", vocab_size=151936, hidden_size=1536, intermediate_size=8960,
                     num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                     max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6,
                     tie_word_embeddings=True),
    "tiny": dict(model_type="qwen2", vocab_size=259, hidden_size=64, intermediate_size=128,
                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 max_position_embeddings=4096, tie_word_embeddings=True),
}
