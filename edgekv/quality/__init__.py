"""quality: ``edgekv quality``'s perplexity and KL-divergence runs against the f16 KV cache."""
