"""Model shapes the GPU benchmarks build from a config (random init: speed does not depend on weights)."""

SHAPES = {
    # Qwen2.5-1.5B's config.json, minus the weights
    "qwen1.5b": dict(model_type="qwen2", vocab_size=151936, hidden_size=1536, intermediate_size=8960,
                     num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                     max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6,
                     tie_word_embeddings=True),
    # Llama-3.2-1B's config.json, minus the weights (head dim 64, 8 KV heads, 128k vocabulary)
    "llama1b": dict(model_type="llama", vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                    num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                    max_position_embeddings=131072, rope_theta=500000.0, rms_norm_eps=1e-5,
                    rope_scaling={"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                  "original_max_position_embeddings": 8192, "rope_type": "llama3"},
                    tie_word_embeddings=True),
    # Qwen2.5-3B's config.json, minus the weights (36 layers, 2 KV heads, tied 152k vocabulary)
    "qwen3b": dict(model_type="qwen2", vocab_size=151936, hidden_size=2048, intermediate_size=11008,
                   num_hidden_layers=36, num_attention_heads=16, num_key_value_heads=2,
                   max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6,
                   tie_word_embeddings=True),
    # Qwen2.5-7B's config.json, minus the weights (untied 152k vocabulary)
    "qwen7b": dict(model_type="qwen2", vocab_size=152064, hidden_size=3584, intermediate_size=18944,
                   num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                   max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6,
                   tie_word_embeddings=False),
    "tiny": dict(model_type="qwen2", vocab_size=259, hidden_size=64, intermediate_size=128,
                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 max_position_embeddings=4096, tie_word_embeddings=True),
}
