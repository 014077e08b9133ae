"""The tiny model's data and training, and the quality studies of notebooks 06 and 08.

corpus.py            the generated facts corpus (English and Chinese) and its evaluation prompts
train.py             `python -m kvlib.study.train`: trains the tiny model and writes assets/tiny
gqa_quality.py       quality of MHA converted to GQA, with and without uptraining (notebook 06)
compress_quality.py  quality of the smaller caches: int8 agreement, loss by position in a window (notebook 08)
"""
