"""What llama.cpp knows about GGUF metadata and architectures: key names and the architecture sets.

The metadata keys llama.cpp reads (src/llama-arch.cpp LLM_KV_NAMES), every architecture name its vendored tree
knows, and the sets ``llama_model::create_memory`` and src/llama-arch.cpp sort them into.  Pure tables; the rules
that read them are :mod:`edgekv.core.archrules` and :mod:`edgekv.core.arch`.
"""

from __future__ import annotations

from gguf import Keys

from edgekv.core.shape import (
    MEMORY_DSA,
    MEMORY_DSA_ISWA,
    MEMORY_DSV4,
    MEMORY_HYBRID_IDX,
    MEMORY_MSA,
)

LLAMA_MAX_LAYERS = 512   # src/llama-hparams.h

# Metadata keys: gguf-py's constants (the same spelling as llama.cpp's src/llama-arch.cpp LLM_KV_NAMES), with an
# {arch} placeholder; the three gguf 0.19 does not define are spelled out.
K_ARCH = Keys.General.ARCHITECTURE
K_NAME = Keys.General.NAME
K_CONTEXT_LENGTH = Keys.LLM.CONTEXT_LENGTH
K_EMBEDDING_LENGTH = Keys.LLM.EMBEDDING_LENGTH
K_BLOCK_COUNT = Keys.LLM.BLOCK_COUNT
K_NEXTN = Keys.LLM.NEXTN_PREDICT_LAYERS
K_FF = Keys.LLM.FEED_FORWARD_LENGTH
K_VOCAB_SIZE = Keys.LLM.VOCAB_SIZE
K_HEAD_COUNT = Keys.Attention.HEAD_COUNT
K_HEAD_COUNT_KV = Keys.Attention.HEAD_COUNT_KV
K_KEY_LENGTH = Keys.Attention.KEY_LENGTH
K_VALUE_LENGTH = Keys.Attention.VALUE_LENGTH
K_KEY_LENGTH_SWA = Keys.Attention.KEY_LENGTH_SWA
K_VALUE_LENGTH_SWA = Keys.Attention.VALUE_LENGTH_SWA
K_KEY_LENGTH_MLA = Keys.Attention.KEY_LENGTH_MLA
K_VALUE_LENGTH_MLA = Keys.Attention.VALUE_LENGTH_MLA
K_KV_LORA_RANK = Keys.Attention.KV_LORA_RANK
K_CAUSAL = Keys.Attention.CAUSAL
K_SLIDING_WINDOW = Keys.Attention.SLIDING_WINDOW
K_SLIDING_WINDOW_PATTERN = Keys.Attention.SLIDING_WINDOW_PATTERN
K_SHARED_KV_LAYERS = Keys.Attention.SHARED_KV_LAYERS
K_RECURRENT_LAYERS = "{arch}.attention.recurrent_layers"   # not in gguf.Keys (gguf 0.19)
K_FULL_ATTENTION_INTERVAL = Keys.LLM.FULL_ATTENTION_INTERVAL
K_INDEXER_TOP_K = "{arch}.attention.indexer.top_k"   # not in gguf.Keys (gguf 0.19)
K_INDEXER_KEY_LENGTH = "{arch}.attention.indexer.key_length"   # not in gguf.Keys (gguf 0.19)
K_INDEXER_TYPES = "{arch}.attention.indexer.types"   # not in gguf.Keys (gguf 0.19)
K_INDEXER_KPOOL = "{arch}.attention.indexer.kpool"   # not in gguf.Keys (gguf 0.19)
K_COMPRESS_RATIOS = "{arch}.attention.compress_ratios"   # not in gguf.Keys (gguf 0.19)
K_LEADING_DENSE = Keys.LLM.LEADING_DENSE_BLOCK_COUNT
K_NUM_LOOPS = "{arch}.num_loops"   # not in gguf.Keys (gguf 0.19)
K_SSM_CONV_KERNEL = Keys.SSM.CONV_KERNEL
K_SSM_INNER_SIZE = Keys.SSM.INNER_SIZE
K_SSM_STATE_SIZE = Keys.SSM.STATE_SIZE
K_SSM_GROUP_COUNT = Keys.SSM.GROUP_COUNT
K_WKV_HEAD_SIZE = Keys.WKV.HEAD_SIZE
K_TOKEN_SHIFT_COUNT = Keys.LLM.TOKEN_SHIFT_COUNT
K_SHORTCONV_L_CACHE = Keys.ShortConv.L_CACHE
K_KDA_HEAD_DIM = Keys.KDA.HEAD_DIM
K_TOKENS = Keys.Tokenizer.LIST

# Every architecture name llama.cpp 0.3.36's vendored tree knows (src/llama-arch.cpp LLM_ARCH_NAMES).
LLAMA_ARCHITECTURES: frozenset[str] = frozenset({
    "clip", "llama", "llama4", "deci", "falcon", "grok", "gpt2", "gptj", "gptneox", "mpt", "baichuan",
    "starcoder", "refact", "bert", "modern-bert", "nomic-bert", "nomic-bert-moe", "neo-bert", "jina-bert-v2",
    "jina-bert-v3", "eurobert", "bloom", "stablelm", "qwen", "qwen2", "qwen2moe", "qwen2vl", "qwen3",
    "qwen3moe", "qwen3next", "qwen3vl", "qwen3vlmoe", "qwen35", "qwen35moe", "qwen4exp", "phi2", "phi3",
    "phimoe", "plamo", "plamo2", "plamo3", "codeshell", "orion", "internlm2", "minicpm", "minicpm3", "gemma",
    "gemma2", "gemma3", "gemma3n", "gemma4", "gemma4-assistant", "gemma-embedding", "starcoder2", "mamba",
    "mamba2", "maple", "jamba", "falcon-h1", "xverse", "command-r", "cohere2", "cohere2moe", "dbrx", "olmo",
    "olmo2", "olmoe", "muse-glimmer", "openelm", "arctic", "deepseek", "deepseek2", "deepseek2-ocr",
    "deepseek32", "deepseek4", "chatglm", "glm4", "glm4moe", "glm-dsa", "bitnet", "t5", "t5encoder", "jais",
    "jais2", "nemotron", "nemotron_h", "nemotron_h_moe", "exaone", "exaone4", "exaone-moe", "rwkv6",
    "rwkv6qwen2", "rwkv7", "arwkv7", "granite", "granitemoe", "granitehybrid", "graniteswitch", "granite_swa",
    "chameleon", "wavtokenizer-dec", "plm", "bailingmoe", "bailingmoe2", "bailingmoe3", "dots1", "dots3note",
    "arcee", "afmoe", "laguna", "ernie4_5", "ernie4_5-moe", "hunyuan-moe", "hunyuan-dense", "hunyuan_vl",
    "hy_v3", "hy_v4", "smollm3", "gpt-oss", "lfm2", "lfm2moe", "dream", "smallthinker", "llada", "llada-moe",
    "seed_oss", "grovemoe", "apertus", "minimax-01", "hrm_text", "minimax-m2", "minimax-m3", "cogvlm", "rnd1",
    "pangu-embedded", "mistral3", "eagle3", "dflash", "mistral4", "paddleocr", "mimo2", "step35", "spark2_5",
    "llama-embed", "maincoder", "kimi-linear", "kimi-k3", "glm5-next", "talkie", "mellum", "nanbeige",
    "qwen3tts", "pockettts",
})

# create_memory(): res = nullptr (src/llama-model.cpp:2358-2374)
NO_CACHE_ARCHS = frozenset({
    "bert", "jina-bert-v2", "jina-bert-v3", "nomic-bert", "nomic-bert-moe", "neo-bert", "eurobert",
    "wavtokenizer-dec", "modern-bert", "gemma-embedding", "dream", "llada", "llada-moe", "rnd1",
})

# llm_arch_is_recurrent / llm_arch_is_hybrid / llm_arch_supports_rs_rollback (src/llama-arch.cpp:1071-1140)
RECURRENT_ARCHS = frozenset({"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"})
HYBRID_ARCHS = frozenset({
    "jamba", "falcon-h1", "plamo2", "granitehybrid", "lfm2", "lfm2moe", "nemotron_h", "nemotron_h_moe",
    "qwen3next", "kimi-linear", "bailingmoe3", "kimi-k3", "glm5-next", "qwen35", "qwen35moe", "qwen4exp",
    "deepseek4", "minimax-01",
})
RS_ROLLBACK_ARCHS = frozenset({
    "kimi-k3", "qwen35", "qwen35moe", "qwen4exp", "deepseek4", "glm5-next", "nemotron_h", "nemotron_h_moe",
    "lfm2", "lfm2moe", "bailingmoe3",
})

# Caches with their own layout that edgekv does not model: measure them, don't guess.
UNSUPPORTED_CACHES: dict[str, str] = {
    "clip": "a vision/audio encoder (mmproj), not a text model with a KV cache",
    "gemma4-assistant": "draft model that shares its target's KV cache (needs the target context)",
    "dflash": "draft model whose cache depends on its target",
}

# create_memory() builds its own cache class for these (src/llama-model.cpp:2376-2630, 2684-2740)
SPECIAL_MEMORY: dict[str, str] = {
    "deepseek32": MEMORY_DSA,        # llama_kv_cache_dsa (2397-2450)
    "glm-dsa": MEMORY_DSA,
    "dots3note": MEMORY_DSA_ISWA,    # llama_kv_cache_dsa_iswa (2540-2590)
    "minimax-m3": MEMORY_MSA,        # llama_kv_cache_msa (2376-2396)
    "deepseek4": MEMORY_DSV4,        # llama_kv_cache_dsv4 (2591-2630)
    "glm5-next": MEMORY_HYBRID_IDX,  # llama_memory_hybrid_idx (2451-2493)
}


def key(template: str, arch: str) -> str:
    return template.replace("{arch}", arch)

