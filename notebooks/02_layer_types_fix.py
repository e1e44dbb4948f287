# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Eagle3 under PP: why `target_layer_num` must be the *total* layer count
#
# **The question:** an Eagle3 draft model numbers its own decoder layer(s) *after* the target's, and looks up
# each layer's attention kind (sliding window or full) in its own `layer_types` by a draft-relative index
# `layer_idx - target_layer_count`. Which count is right under PP: the layers on this rank
# (`model_config.get_num_layers(parallel_config)`) or all of them (`get_total_num_hidden_layers()`)?
#
# The target here, `tiny-llama-swa`, has 4 layers with `layer_types` alternating sliding / full; its Eagle3 draft
# has one sliding layer and reads the target's hidden states after layers 1, 2 and 3 (`eagle_aux_hidden_state_layer_ids`).

# %% tags=["parameters"]
MODEL = "tiny-llama-swa"
PP = 2
SPEC = "eagle3:2"
NUM_PROMPTS = 4
MAX_TOKENS = 24
PATCHES = "all"                                         # the fixed run (CI breaks the claim with the legacy patch)
LEGACY_PATCHES = "all,eagle3_per_rank_layers_legacy"   # the old behaviour, reproduced on real vLLM code

# %%
import kit
import kit.compare
import kit.notebook
kit.notebook.setup()

# %%
import json
from kit.topology import Topology
from kit.models import resolve_model
t = resolve_model(MODEL); d = resolve_model(t.draft_model)
print("target layer_types:", t.config["layer_types"], " sliding_window:", t.config["sliding_window"])
print("draft  layer_types:", d.config["layer_types"], " aux layers:", d.config["eagle_aux_hidden_state_layer_ids"])

# %% [markdown]
# ## The fixed behaviour (vLLM 0.32 + the kit), read from the live engine

# %%
from kit import engine
topo = Topology(model=MODEL, random_weights=True, pp=PP, spec=SPEC)
prompts = kit.compare.load_prompts(limit=NUM_PROMPTS)
# One engine: read the layers from every worker, then generate with it.
res = engine.run(topo, [{"kind": "rpc", "method": "kit_eagle3_layers"},
                        {"kind": "generate", "prompts": prompts, "max_tokens": MAX_TOKENS}],
                 env={"KIT_PATCHES": PATCHES})
ranks = sorted(res["jobs"][0], key=lambda r: r["pp_rank"])
fixed_tokens, fixed_spec = res["jobs"][1]["token_ids"], res["jobs"][1]["spec"]
last = ranks[-1]
print("per-rank layer count on the last rank:", last["per_rank_layers"], " total:", last["total_layers"])
print("draft target_layer_count:", last["draft"]["target_layer_count"])
print("draft attention layers  :", last["draft"]["attn_layers"])
print("target attention layers on the last rank:", {k: v for k, v in last["target_attn_layers"].items() if k not in last["draft"]["attn_layers"]})

# %%
import plotly.graph_objects as go
rows = []
for r in ranks:
    for name, v in r["target_attn_layers"].items():
        is_draft = r["draft"] is not None and name in r["draft"]["attn_layers"]
        rows.append((f"rank {r['pp_rank']}", name.replace(".self_attn.attn", ""), "draft" if is_draft else "target",
                     "sliding" if v["sliding_window"] else "full"))
fig = go.Figure()
for who, color in (("target", "#3182bd"), ("draft", "#e6550d")):
    sel = [x for x in rows if x[2] == who]
    fig.add_trace(go.Scatter(x=[x[1] for x in sel], y=[x[0] for x in sel], mode="markers+text", name=who,
                             text=[x[3] for x in sel], textposition="top center",
                             marker=dict(size=22, color=color, symbol=["square" if x[3] == "sliding" else "circle" for x in sel])))
fig.update_layout(title=f"Attention layers per PP rank (PP={PP}): name and kind", height=320, xaxis_title="layer name")
fig.show()

# %% [markdown]
# **What it shows:** the draft's layer is named after *all* target layers (`model.layers.4` for a 4-layer target), so
# on the last rank it sits next to the target's own layers without a name clash, and its draft-relative index
# `4 - 4 = 0` picks `layer_types[0]` = sliding, as its config says.

# %%
draft_layers = last["draft"]["attn_layers"]
total = last["total_layers"]
assert last["draft"]["target_layer_count"] == total, (
    f"the draft indexes layer_types with {last['draft']['target_layer_count']} target layers, not the total {total}")
assert all(name.startswith(f"model.layers.{total}.") for name in draft_layers), draft_layers
want_sliding = resolve_model(t.draft_model).config["layer_types"][0] == "sliding_attention"
assert all(bool(v["sliding_window"]) == want_sliding for v in draft_layers.values())
ref = engine.generate(topo.reference(), prompts, max_tokens=MAX_TOKENS)
assert fixed_tokens == ref.token_ids, "Eagle3 at PP=2 diverged from the reference"
print("claim holds: total-count indexing, no clash, right attention kind, tokens identical; drafts:", fixed_spec)

# %% [markdown]
# ## The old behaviour: the per-rank count
# The kit's teaching patch `eagle3_per_rank_layers_legacy` makes the drafter use `get_num_layers(parallel_config)`
# (what vLLM did before the seed PR). At PP=2 the last rank holds 2 of the 4 layers, so the draft layer becomes
# `model.layers.2` — the name of a target layer that lives on that same rank.

# %%
legacy_err, legacy = None, None
try:
    res = engine.run(topo, [{"kind": "rpc", "method": "kit_eagle3_layers"}], env={"KIT_PATCHES": LEGACY_PATCHES}, timeout=600)
    legacy = sorted(res["jobs"][0], key=lambda r: r["pp_rank"])[-1]
    print("legacy draft target_layer_count:", legacy["draft"]["target_layer_count"])
    print("legacy draft attention layers  :", legacy["draft"]["attn_layers"])
except engine.EngineError as e:
    legacy_err = str(e)
    print(legacy_err)

# %%
# Either vLLM refuses the clash outright, or the draft layer carries the name of a target layer that lives
# on the same (last) rank: model.layers.<per-rank count> instead of model.layers.<total>.
if legacy_err is not None:
    # Observed on vLLM 0.32: the last rank refuses to build the draft layer under a target layer's name.
    clash = f"Duplicate layer name: model.layers.{last['per_rank_layers']}."
    assert clash in legacy_err, legacy_err
else:
    per_rank = legacy["per_rank_layers"]
    assert legacy["draft"]["target_layer_count"] == per_rank != legacy["total_layers"]
    names = list(legacy["draft"]["attn_layers"])
    assert all(n.startswith(f"model.layers.{per_rank}.") for n in names), names
    target_on_last = {int(k.split(".")[2]) for k in last["target_attn_layers"] if k not in last["draft"]["attn_layers"]}
    assert per_rank in target_on_last, (per_rank, target_on_last)
print("as expected: with the per-rank count the draft layer takes the name of target layer", legacy and legacy["per_rank_layers"])
