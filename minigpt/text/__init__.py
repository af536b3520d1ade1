"""Texts and tokens: strict UTF-8 reads (reading.py), which files a run trains on (sources.py), several
files joined (folders.py), the tokenizers (tokenizer.py), the token cache (token_cache.py) and a
corpus with its batches (corpus.py).
"""
