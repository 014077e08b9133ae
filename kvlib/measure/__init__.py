"""Measuring this machine, importing no learner module at import time.

timing.py   warm-up, repeats, medians, interleaved rounds, the environment record
machine.py  memory bandwidth, matmul FLOP/s, the step time of a random-weight model
bench.py    `kvlib bench cache | memory | gqa`: the course's benchmarks, as tables or JSON
"""
