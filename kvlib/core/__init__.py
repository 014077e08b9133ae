"""The model and its data, importing nothing of the learner's.

model.py      ModelConfig, the layers, Decoder: one forward pass, with or without a KV cache
cache.py      the cache contract (Cache, CacheBase) and one layer's attention through any cache
weights.py    the shipped tiny model (load_tiny), checked state dicts, transformers conversion
tokenizer.py  the character tokenizer of the tiny model
configs.py    every named configuration: published models (sizes only) and the benchmarks' own
devices.py    published peak FLOP/s and bandwidth of GPUs (notebook 05's roofline)
"""
