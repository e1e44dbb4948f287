"""The kit's vocabulary, with no vLLM process in sight: the topology, cores, the model registry, prompts,
the metrics parser, validation and command-line flags, ports and addresses, and the results writer.

Imports nothing else from ``kit``; every other layer may import it.
"""
