"""The model and its data, the bottom floor: it imports nothing else of kvlib.

model.py        ModelConfig, the layers, Decoder: one forward pass, with or without a KV cache
cache.py        the cache contract (Cache, CacheBase) and one layer's attention through any cache
weights.py      the shipped tiny model (load_tiny), checked state dicts, transformers conversion
tokenizer.py    the character tokenizer of the tiny model
configs.py      every named configuration: published models (sizes only) and the benchmarks' own
devices.py      published peak FLOP/s, bandwidth and memory type of GPUs (notebook 05's roofline)
facts.py        the figures the notebooks state, each with its source; the check that their markdown states no other
flops.py        FLOPs counted by torch itself (torch.utils.flop_counter), the CPU attention kernel too
paging.py       notebook 07's serving engine below the learner's kvlib/serving.py: blocks, paged view
stream.py       a list whose items are made as they are read (notebook 09's chunks, as its memory is checked)
gguf_export.py  a Decoder written as a GGUF file for llama.cpp (`kvlib bench cache`)
paths.py        where the repository's own files are
progress.py     progress of long work on stderr (tqdm), shown only on a terminal
"""
