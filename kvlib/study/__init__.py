"""The tiny model's data and training, and the GQA conversion study of notebook 06.

corpus.py       the generated facts corpus (English and Chinese) and its evaluation prompts
train.py        `python -m kvlib.study.train`: trains the tiny model and writes assets/tiny
gqa_quality.py  quality of MHA converted to GQA, with and without uptraining
"""
