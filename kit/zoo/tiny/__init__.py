"""Tiny trained models with MTP layers, built offline, and their checks against vLLM.

``tiny-mimo`` (MiMo, 1.6 M parameters), ``tiny-deepseek-v3-trained`` (dense DeepSeek-V3 with MLA),
``tiny-qwen3_5-trained`` (Qwen3.5: Gated-DeltaNet + full attention, ``mtp.*`` drafter) and ``mimo-py-18m`` (MiMo, 17.8 M parameters, trained on Python source) are trained here from nothing but the
installed Python sources, deterministically, and stored in the layout vLLM 0.32 loads. Their pure-PyTorch models
compute exactly what vLLM runs, so vLLM's greedy tokens and its MTP acceptance counters can be predicted and
checked (``data/models/README.md`` records the recipes and the measured results).

Modules, bottom to top (none imports vLLM except :mod:`~kit.checks.parity`, through :mod:`kit.engine`):

- :mod:`~kit.zoo.tiny.config`: architectures, training recipes, the ``config.json`` vLLM loads.
- :mod:`~kit.zoo.tiny.pycorpus`, :mod:`~kit.zoo.tiny.corpus`, :mod:`~kit.zoo.tiny.tokenizer`: the Python-source pack, the
  standard-library corpus and token stream, the byte-level BPE.
- :mod:`~kit.zoo.tiny.layers`, :mod:`~kit.zoo.tiny.mimo`, :mod:`~kit.zoo.tiny.deepseek`, :mod:`~kit.zoo.tiny.qwen3_5`: the PyTorch
  models (Qwen3.5's target is transformers' own ``Qwen3_5TextModel``, with its pure-PyTorch Gated DeltaNet).
- :mod:`~kit.zoo.tiny.checkpoint`: safetensors in vLLM's layout (shards, merge), loading a model directory.
- :mod:`~kit.zoo.tiny.train`: the one training loop; :mod:`~kit.zoo.tiny.trainers`: the four shipped trainers.
- :mod:`~kit.zoo.tiny.decode`: greedy reference decoding and vLLM's MTP draft loop replayed.
- :mod:`~kit.checks.parity`: parity and acceptance against vLLM; :mod:`~kit.cli.tiny`: ``kit tiny``.
"""
