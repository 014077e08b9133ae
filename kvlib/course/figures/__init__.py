"""The course's figures, one module per notebook, each function returning a closed matplotlib Figure; notebooks
call them through kvlib.course.plotting (plotting.roofline).

attention.py      Notebook 01 (attention by hand)
generation.py     Notebook 02 (generating text)
recompute.py      Notebook 03 (the waste of recomputing)
kv_cache.py       Notebook 04 (the KV cache)
memory_wall.py    Notebook 05 (the memory wall)
gqa.py            Notebook 06 (Grouped-Query Attention)
serving.py        Notebook 07 (serving many requests)
compress.py       Notebook 08 (smaller caches)
fused.py          Notebook 09 (fused attention)
speculative.py    Notebook 10 (speculative decoding)
class_grading.py  docs/instructors.md (grading a class)
style.py          the one style: Okabe-Ito colours, projector-sized fonts, CJK tokens, translated titles
Not here: computing anything, or widgets.
"""
