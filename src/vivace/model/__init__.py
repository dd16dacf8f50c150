"""Policy models: Hugging Face causal LMs (Qwen3-MoE family), their checkpoints and the reference tokenizer."""
