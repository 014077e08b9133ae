"""Measuring this machine, importing no learner module at import time (the benchmarks run the
learner's code, looked up when they run).

timing.py          warm-up, repeats, medians, interleaved rounds, the environment record
machine.py         memory bandwidth, matmul FLOP/s, the step time of a random-weight model
ops.py             the aten calls a forward dispatches (notebook 03: the fixed cost of a step)
bench_cache.py     `kvlib bench cache` (notebook 04): tokens/s without a cache, with kvlib's, and the peers'
bench_memory.py    `kvlib bench memory` (notebook 05): bandwidth, FLOP/s, a decode step predicted and timed
bench_gqa.py       `kvlib bench gqa` (notebook 06): a decode step at long context against n_kv_heads
bench_serve.py     `kvlib bench serve` (notebook 07): static against continuous batching at equal KV memory
bench_compress.py  `kvlib bench compress` (notebook 08): the smaller caches, in bytes and in time
bench_fused.py     `kvlib bench fused` (notebook 09): peak memory naive vs tiled, causal FLOPs, int8 decode 4 ways
bench_spec.py      `kvlib bench spec` (notebook 10): speculative decoding against gamma, predicted and measured
compiled.py        kvlib's model decoding through torch.compile on a CPU (a way of `kvlib bench cache`)
peers.py           the engines `kvlib bench cache` compares kvlib with: transformers, llama.cpp
llama_child.py     llama.cpp in a child process of its own, so that its crash is a row, not the benchmark's end
"""
