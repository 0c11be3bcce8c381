"""Package vllm_sim (under construction)."""
