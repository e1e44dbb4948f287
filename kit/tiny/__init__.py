"""Tiny trained models with MTP layers, built offline, and their checks against vLLM.

``tiny-mimo`` (MiMo, 1.6 M parameters), ``tiny-deepseek-v3-trained`` (dense DeepSeek-V3 with MLA),
``tiny-qwen3_5-trained`` (Qwen3.5: Gated-DeltaNet + full attention, ``mtp.*`` drafter) and ``mimo-py-18m`` (MiMo, 17.8 M parameters, trained on Python source) are trained here from nothing but the
installed Python sources, deterministically, and stored in the layout vLLM 0.32 loads. Their pure-PyTorch models
compute exactly what vLLM runs, so vLLM's greedy tokens and its MTP acceptance counters can be predicted and
checked (``data/models/README.md`` records the recipes and the measured results).

Modules, bottom to top (none imports vLLM except :mod:`~kit.tiny.parity`, through :mod:`kit.engine`):

- :mod:`~kit.tiny.config`: architectures, training recipes, the ``config.json`` vLLM loads.
- :mod:`~kit.tiny.pycorpus`, :mod:`~kit.tiny.corpus`, :mod:`~kit.tiny.tokenizer`: the Python-source pack, the
  standard-library corpus and token stream, the byte-level BPE.
- :mod:`~kit.tiny.layers`, :mod:`~kit.tiny.mimo`, :mod:`~kit.tiny.deepseek`, :mod:`~kit.tiny.qwen3_5`: the PyTorch
  models (Qwen3.5's target is transformers' own ``Qwen3_5TextModel``, with its pure-PyTorch Gated DeltaNet).
- :mod:`~kit.tiny.checkpoint`: safetensors in vLLM's layout (shards, merge), loading a model directory.
- :mod:`~kit.tiny.train`: the one training loop; :mod:`~kit.tiny.trainers`: the four shipped trainers.
- :mod:`~kit.tiny.decode`: greedy reference decoding and vLLM's MTP draft loop replayed.
- :mod:`~kit.tiny.parity`: parity and acceptance against vLLM; :mod:`~kit.tiny.cli`: ``python -m kit.tiny``.
"""
