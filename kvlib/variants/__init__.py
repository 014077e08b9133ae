"""The other ways the benchmarks and studies compare with the learner's: notebook 06's attention ways,
notebook 08's int8 and rolling caches. They run the learner's functions, looked up when they run.

gqa_attention.py  causal, materialised, grouped, SDPA and split-K attention (ATTENTION), decode_bytes
compressed.py     Int8KVCache: int8 keys per channel in groups, values per token (the rolling cache,
                  SinkCache, is the learner's own: kvlib/compress.py)
"""
