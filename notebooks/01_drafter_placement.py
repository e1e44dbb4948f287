# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Where does everything live under PP?
#
# **The question:** with PP=2 and PP=4, which rank holds which decoder layers, the embedding, the LM head,
# the MTP drafter and which KV cache? Everything below is read from the **live engine**: the kit adds a method
# to every vLLM worker (`worker_extension_cls`) and calls it with `LLM.collective_rpc`.

# %% tags=["parameters"]
MODEL = "tiny-mimo"
RANDOM_WEIGHTS = True
SPEC = "mtp:1"
PP_SIZES = [2, 4]
PATCHES_FOR_FAILURE = "all,-drafter_only_on_last_rank"   # the run that shows what breaks

# %%
import kit
import kit.compare
import kit.notebook
kit.notebook.setup()

# %% [markdown]
# One engine per PP size in `PP_SIZES`, each started, asked and stopped (on 2 cores about 35 s at PP=2 and
# 55 s at PP=4).

# %%
import pandas as pd
from kit.topology import Topology
from kit.placement import placement, summary_rows
from kit import plots

layouts = {}
for pp in PP_SIZES:
    topo = Topology(model=MODEL, random_weights=RANDOM_WEIGHTS, pp=pp, spec=SPEC)
    layouts[pp] = placement(topo)
    display(pd.DataFrame(summary_rows(layouts[pp])).set_index("pp_rank"))

# %%
n_layers = Topology(model=MODEL, random_weights=True).info.num_layers
for pp, ranks in layouts.items():
    plots.placement_lanes(ranks, n_layers, title=f"PP={pp}: layers per rank, drafter on the last rank").show()

# %% [markdown]
# **What it shows:** the decoder layers are split into consecutive ranges; rank 0 alone embeds tokens, the
# last rank alone has the LM head — and the MTP drafter (with its own copy of embedding and LM head) lives
# only on the last rank, next to the sampler whose tokens it extends. Each rank's KV cache holds only its own
# layers' KV; the drafter's layer KV sits on the last rank.

# %%
for pp, ranks in layouts.items():
    last = max(r["pp_rank"] for r in ranks)
    covered = sorted(i for r in ranks for i in r["layers"])
    assert covered == list(range(n_layers)), f"PP={pp}: layers not partitioned: {covered}"
    for r in ranks:
        has_drafter = bool(r["drafter"] and r["drafter"].get("params"))
        assert has_drafter == (r["pp_rank"] == last), f"PP={pp} rank {r['pp_rank']}: drafter placement"
        assert r["embedding"] == (r["pp_rank"] == 0) and r["lm_head"] == (r["pp_rank"] == last)
print("claim holds: layers partitioned, drafter / embedding / LM head where expected")

# %% [markdown]
# ## The KV cache of each rank
# **Predict, then look:** at PP=4 with a 4-layer target and one MTP layer, how many layers' KV does each rank
# allocate, and which rank holds the MTP layer's?
#
# <details><summary>Answer</summary>
#
# One target layer each, and the last rank one more: the MTP layer's KV (`model.layers.4`, named after all target
# layers), because the drafter that attends over it runs there. The picture and the cell below read it from the
# live workers' KV cache configuration.
# </details>

# %%
plots.kv_layers_per_rank(layouts, n_layers).show()
for pp, ranks in layouts.items():
    last = max(r["pp_rank"] for r in ranks)
    for r in ranks:
        got = sorted(int(n.split(".")[2]) for n in r["kv_cache"]["layers"])
        want = sorted(r["layers"]) + ([n_layers] if r["pp_rank"] == last else [])
        assert got == want, f"PP={pp} rank {r['pp_rank']}: KV for layers {got}, expected {want}"
print("claim holds: each rank allocates KV for its own target layers only, and the last rank also for the MTP layer")

# %% [markdown]
# ## The failure without the kit's drafter guard
# Stock vLLM 0.32 creates the drafter only on the last rank, but other start-up paths touch `self.drafter` on
# every rank. Turning the kit's `drafter_only_on_last_rank` patch off shows the crash (caught here; about 40 s on
# 2 cores until the worker fails).

# %%
from kit.engine import EngineError
err = None
try:
    placement(Topology(model=MODEL, random_weights=RANDOM_WEIGHTS, pp=2, spec=SPEC),
              env={"KIT_PATCHES": PATCHES_FOR_FAILURE}, timeout=300)
except EngineError as e:
    err = str(e)
print(err or "no error: the run started")

# %%
assert err is not None and "has no attribute 'drafter'" in err, "expected the missing-drafter crash"
print("as expected: the non-last rank touched a drafter it does not have")
