from model.config import PRESETS, GPTConfig, preset
from model.gpt import GPT, KVCache

__all__ = ["GPT", "GPTConfig", "KVCache", "PRESETS", "preset"]
