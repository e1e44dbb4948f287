"""The models the kit runs without a download: the zoo's configs, tokenizer and seeded weights
(:mod:`~kit.zoo.write`, :mod:`~kit.zoo.configs`, :mod:`~kit.zoo.weights`) and the tiny PyTorch models with their
trainers (:mod:`kit.zoo.tiny`).

May import :mod:`kit.core` only; training never imports vLLM.
"""
