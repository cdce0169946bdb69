from model.config import GPTConfig, PRESETS, preset
from model.gpt import GPT, KVCache

__all__ = ["GPT", "GPTConfig", "KVCache", "PRESETS", "preset"]
