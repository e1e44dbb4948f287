"""Methods added to every vLLM worker (``worker_extension_cls``) so the kit can look inside a live engine.

``LLM.collective_rpc("kit_placement")`` calls them by name in each worker; no pickled code is sent
(which vLLM refuses unless ``VLLM_ALLOW_INSECURE_SERIALIZATION=1``).
"""
from __future__ import annotations

import os


def _param_bytes(module) -> tuple[int, int]:
    n = b = 0
    for p in module.parameters():
        n += p.numel()
        b += p.numel() * p.element_size()
    return n, b


def _ray_node_id() -> str | None:
    """The Ray node this worker runs on, when it is a Ray actor (``backend="ray"``); else ``None``."""
    import sys

    ray = sys.modules.get("ray")  # never import Ray into a worker that does not already use it
    try:
        if ray is not None and ray.is_initialized():
            return ray.get_runtime_context().get_node_id()
    except Exception:
        pass
    return None


def _group_info(group) -> dict:
    """One KV cache group: its spec kind and layers; for a mamba group (Gated-DeltaNet / Mamba recurrent state)
    the per-request state shapes and the cache mode (``none``: one state slot per request, ``align``: states
    kept per block for prefix caching)."""
    spec = group.kv_cache_spec
    out = {"spec": type(spec).__name__, "layers": list(group.layer_names)}
    for name in ("block_size", "page_size_bytes"):
        try:
            out[name] = int(getattr(spec, name))
        except Exception:
            pass
    if hasattr(spec, "shapes"):
        out["state_shapes"] = [list(s) for s in spec.shapes]
        out["state_dtypes"] = [str(d).replace("torch.", "") for d in spec.dtypes]
        out["mamba_type"] = str(getattr(spec, "mamba_type", ""))
        out["mamba_cache_mode"] = getattr(spec, "mamba_cache_mode", None)
        out["num_speculative_blocks"] = getattr(spec, "num_speculative_blocks", None)
    return out


_DRAFTER_CALLS: dict = {}


class KitWorkerExtension:
    """Mixed into vLLM's worker class."""

    def kit_placement(self) -> dict:
        """What this rank holds: layers, parameters, drafter, KV cache, embedding and LM head."""
        from vllm.distributed.parallel_state import get_pp_group, get_tp_group

        runner = self.model_runner
        model = runner.get_model()
        inner = getattr(model, "model", model)
        start = getattr(inner, "start_layer", None)
        end = getattr(inner, "end_layer", None)
        layers = getattr(inner, "layers", [])
        present = [i for i, l in enumerate(layers) if type(l).__name__ != "PPMissingLayer"]
        n_params, n_bytes = _param_bytes(model)
        drafter = getattr(runner, "drafter", None)
        drafter_info = None
        if drafter is not None and not getattr(drafter, "kit_absent", False):
            dm = getattr(drafter, "model", None)
            dn, db = _param_bytes(dm) if dm is not None else (0, 0)
            drafter_info = {"class": type(drafter).__name__, "model_class": type(dm).__name__ if dm is not None else None,
                            "params": dn, "bytes": db}
        elif drafter is not None:
            drafter_info = {"class": "AbsentDrafter (kit stand-in: no drafter on this rank)", "params": 0, "bytes": 0}
        kv = {}
        kvc = getattr(runner, "kv_cache_config", None)
        if kvc is not None:
            kv["num_blocks"] = int(kvc.num_blocks)
            names = [n for g in kvc.kv_cache_groups for n in g.layer_names]
            kv["layers"] = names
            try:
                kv["block_size"] = int(kvc.kv_cache_groups[0].kv_cache_spec.block_size)
                kv["page_size_bytes"] = int(kvc.kv_cache_groups[0].kv_cache_spec.page_size_bytes)
            except Exception:
                pass
            kv["groups"] = [_group_info(g) for g in kvc.kv_cache_groups]
        embed = getattr(inner, "embed_tokens", None)
        lm_head = getattr(model, "lm_head", None)
        return {
            "pid": os.getpid(),
            "pp_rank": get_pp_group().rank_in_group,
            "pp_size": get_pp_group().world_size,
            "tp_rank": get_tp_group().rank_in_group,
            "is_last_rank": get_pp_group().is_last_rank,
            "layer_range": [start, end],
            "layers": present,
            "params": n_params,
            "param_bytes": n_bytes,
            "embedding": embed is not None and type(embed).__name__ != "PPMissingLayer",
            "lm_head": lm_head is not None and type(lm_head).__name__ != "PPMissingLayer",
            "drafter": drafter_info,
            "kv_cache": kv,
            "hostname": os.uname().nodename,
            # The node this worker runs on: the address vLLM binds and advertises here, and the cores it runs on.
            "host_ip": os.environ.get("VLLM_HOST_IP"),
            "cpu_affinity": sorted(os.sched_getaffinity(0)),
            "ray_node_id": _ray_node_id(),
        }

    def kit_eagle3_layers(self) -> dict:
        """On the rank with an Eagle3 drafter: its layer names, attention kind, and the layer counts."""
        from vllm.distributed.parallel_state import get_pp_group

        runner = self.model_runner
        vc = runner.vllm_config
        out = {"pp_rank": get_pp_group().rank_in_group,
               "per_rank_layers": vc.model_config.get_num_layers(vc.parallel_config),
               "total_layers": vc.model_config.get_total_num_hidden_layers(),
               "target_layer_types": list(getattr(vc.model_config.hf_config, "layer_types", None) or []),
               "target_attn_layers": {}, "draft": None}
        for name, layer in vc.compilation_config.static_forward_context.items():
            sw = getattr(layer, "sliding_window", None)
            out["target_attn_layers"][name] = {"sliding_window": sw}
        drafter = getattr(runner, "drafter", None)
        dm = getattr(drafter, "model", None) if drafter is not None else None
        if dm is not None:
            cfg = getattr(dm, "config", None)
            layers = {}
            for mname, mod in dm.named_modules():
                if type(mod).__name__ in ("Attention",) and hasattr(mod, "layer_name"):
                    layers[mod.layer_name] = {"sliding_window": getattr(mod, "sliding_window", None)}
            out["draft"] = {"class": type(dm).__name__,
                            "target_layer_count": getattr(cfg, "target_layer_count", None),
                            "draft_layer_types": list(getattr(cfg, "layer_types", None) or []),
                            "attn_layers": layers}
        return out

    def kit_watch_drafter(self) -> dict:
        """Count this rank's drafter forwards and what they were given (PP intermediates or not), until
        :meth:`kit_drafter_calls` reads them. Ranks without a drafter report ``watching: False``."""
        import functools

        from vllm.distributed.parallel_state import get_pp_group

        drafter = getattr(self.model_runner, "drafter", None)
        dm = getattr(drafter, "model", None) if drafter is not None and not getattr(drafter, "kit_absent", False) else None
        rank = get_pp_group().rank_in_group
        if dm is None:
            return {"pp_rank": rank, "watching": False}
        inner = getattr(dm, "model", dm)
        _DRAFTER_CALLS.update(calls=0, with_intermediates=0, model_class=type(dm).__name__,
                              inner_class=type(inner).__name__)
        if not getattr(inner.forward, "__kit_watch__", False):
            orig = inner.forward

            @functools.wraps(orig)
            def forward(*args, **kwargs):
                it = kwargs.get("intermediate_tensors", args[3] if len(args) > 3 else None)
                _DRAFTER_CALLS["calls"] += 1
                _DRAFTER_CALLS["with_intermediates"] += it is not None
                return orig(*args, **kwargs)

            forward.__kit_watch__ = True
            inner.forward = forward
        return {"pp_rank": rank, "watching": True, "model_class": type(dm).__name__, "inner_class": type(inner).__name__}

    def kit_drafter_calls(self) -> dict:
        """What :meth:`kit_watch_drafter` counted on this rank: drafter forwards, and how many got PP intermediates."""
        from vllm.distributed.parallel_state import get_pp_group

        return {"pp_rank": get_pp_group().rank_in_group, **_DRAFTER_CALLS}

    def kit_trace_start(self) -> dict:
        """Record each engine step on this rank from now on (:mod:`kit.worker.steptrace`): forward, model, recv, sample,
        MTP propose, handoff; the one timer behind ``kit bench --breakdown`` and ``--timeline``."""
        from kit.worker import steptrace

        return steptrace.start(self)

    def kit_trace_read(self) -> dict:
        """This rank's step events since ``kit_trace_start``."""
        from kit.worker import steptrace

        return steptrace.read()

    def kit_probe_start(self) -> bool:
        """Start counting sampled drafts against their predicted acceptance (:mod:`kit.worker.acceptance_probe`)."""
        from kit.worker import acceptance_probe

        acceptance_probe.start()
        return True

    def kit_probe_start_log(self) -> bool:
        """``kit_probe_start``, and also log every verify round (greedy too) from now on, up to
        ``acceptance_probe.LOG_ROWS`` rows: each request row's drafts and the tokens that round wrote, read back
        with ``kit_probe_read`` (its ``log``). The next ``kit_probe_start`` turns the log off."""
        from kit.worker import acceptance_probe

        acceptance_probe.start(log_rows=acceptance_probe.LOG_ROWS, runner=self.model_runner)
        return True

    def kit_probe_read(self) -> dict:
        """This rank's sampled-acceptance counts since ``kit_probe_start`` (zero except on the last rank), and the
        verify-round log where ``kit_probe_start_log`` started one."""
        from vllm.distributed.parallel_state import get_pp_group

        from kit.worker import acceptance_probe

        return {"pp_rank": get_pp_group().rank_in_group, **acceptance_probe.read()}
