from model.config import PRESETS, GPTConfig, preset
from model.gpt import GPT
from model.kv_cache import KVCache

__all__ = ["GPT", "GPTConfig", "KVCache", "PRESETS", "preset"]
