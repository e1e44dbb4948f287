# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Eagle3 under PP: the draft layer's *name* clashes, its `layer_types` index stays right
#
# **The question:** an Eagle3 draft model names its decoder layer *after* the target's layers,
# `model.layers.<target_layer_num>`, and looks up that layer's attention kind (sliding window or full) in its own
# `layer_types` at `layer_idx - target_layer_count`. Under PP, `target_layer_num` can be the layers on this rank
# (`model_config.get_num_layers(parallel_config)`, the old code) or all of them (`get_total_num_hidden_layers()`,
# vLLM 0.32). What name does the draft layer get with each count, and what does the per-rank name break?
#
# **The short answer, checked below on vLLM 0.32's code and on live engines:** one number, `target_layer_num`,
# gives the draft layer both its *name* (`model.layers.<target_layer_num>`) and the count subtracted for the
# `layer_types` lookup. With either count the lookup lands on the draft's `layer_types[0]`; what the per-rank count
# breaks is the *name*. On the last rank it can be the name of a target layer that lives there too: vLLM refuses
# to build it (`Duplicate layer name`). At other PP sizes the name is that of a target layer on *another* rank: no
# rank holds two layers of one name, but the engine core merges every worker's KV cache specs by layer name, and
# here the two specs differ (the draft layer is sliding-window, that target layer full attention), so the engine
# fails later, at KV cache setup (`The KV cache specs for the same layer are different across workers`). Saying
# that the per-rank count "corrupts `layer_types` indexing" is loose: the index stays right, the name does not.
# (The file keeps the name it was first given, `02_layer_types_fix`, after the defect as it was reported.)
#
# The target here, `tiny-llama-swa-trained` (the zoo's `tiny-llama-swa` with trained weights), has 4 layers with
# `layer_types` alternating sliding / full; its trained Eagle3 draft has one sliding layer and reads the target's
# hidden states after layers 1, 2 and 3 (`eagle_aux_hidden_state_layer_ids`). Trained, the draft's tokens are
# accepted often, so the run below shows drafts at work, not only that the engine starts.
#
# Words used here (Eagle3, stage and rank, KV cache, ...) are defined in the
# [Glossary](00_start_here.ipynb#Glossary) of notebook 00.
#
# About 100 s on 2 cores (four engines); each engine cell says how long it takes.

# %% tags=["parameters"]
MODEL = "tiny-llama-swa-trained"
PP = 2
SPEC = "eagle3:2"
NUM_PROMPTS = 4
MAX_TOKENS = 24
PATCHES = "all"                                         # the fixed run (CI breaks the claim with the legacy patch)
LEGACY_PATCHES = "all,eagle3_per_rank_layers_legacy"   # the old behaviour, reproduced on real vLLM code
RUN_LEGACY = True   # False skips the per-rank engine at PP below (CI: the break-the-claim test runs that engine)
PP_SIZES_TABLE = [1, 2, 3, 4]   # the PP sizes drawn and predicted below (no engine starts for these)
NO_CLASH_PP = 3                 # a PP size where the per-rank name lands without a clash, run live

# %%
import kit
import kit.checks.compare
import kit.lab.notebook
kit.lab.notebook.setup()

# %%
import json
from kit.core.topology import Topology
from kit.core.models import resolve_model
t = resolve_model(MODEL); d = resolve_model(t.draft_model)
print("target layer_types:", t.config["layer_types"], " sliding_window:", t.config["sliding_window"])
print("draft  layer_types:", d.config["layer_types"], " aux layers:", d.config["eagle_aux_hidden_state_layer_ids"])

# %% [markdown]
# ## What vLLM 0.32's code does with the count
# Read from the installed vLLM (not copied here): `Eagle3LlamaForCausalLM.__init__` in `llama_eagle3.py` computes
# `target_layer_num` once and passes it on twice; `LlamaAttention.__init__` in `llama.py` parses the layer index
# back out of the layer's name (its `prefix`) and subtracts the same number.

# %%
import inspect
from vllm.model_executor.models import llama, llama_eagle3
eagle3_src = inspect.getsource(llama_eagle3.Eagle3LlamaForCausalLM.__init__)
attn_src = inspect.getsource(llama.LlamaAttention.__init__)
for line in eagle3_src.splitlines():
    if "target_layer_num" in line:
        print("llama_eagle3.py:", line.strip())
for line in attn_src.splitlines():
    if "extract_layer_index(prefix)" in line or "layer_idx - config.target_layer_count" in line:
        print("llama.py       :", line.strip())
with open(llama_eagle3.__file__) as f:
    assert 'prefix=maybe_prefix(prefix, f"layers.{layer_idx + start_layer_id}")' in f.read()
assert "target_layer_num = vllm_config.model_config.get_total_num_hidden_layers()" in eagle3_src
assert "self.config.target_layer_count = target_layer_num" in eagle3_src
assert "start_layer_id=target_layer_num" in eagle3_src
assert "layer_idx = extract_layer_index(prefix)" in attn_src
assert "effective_layer_idx = layer_idx - config.target_layer_count" in attn_src
print("checked: the draft layer's name index and the subtracted count are the same number, target_layer_num")

# %% [markdown]
# So the draft's first layer is named `model.layers.<0 + target_layer_num>` and its `layer_types` index is
# `target_layer_num - target_layer_count = 0`, whatever count `target_layer_num` holds. The count only moves the
# *name*. Below, the names each rank builds, for every PP size in `PP_SIZES_TABLE`, with the total count (vLLM 0.32)
# and the per-rank count (the old code): the target layers split by vLLM's own `get_pp_indices`, the draft layer on
# the last rank, in red when its name is already taken by a target layer on that rank, in purple when a target
# layer on another rank has it. Each marker's shape is the layer's attention kind, from the configs' `layer_types`:
# a square for sliding window, a circle for full attention.

# %%
from kit.lab import plots
from kit.checks.placement import eagle3_layer_names
n_layers = t.config["num_hidden_layers"]
names = {c: {pp: eagle3_layer_names(n_layers, pp, c) for pp in PP_SIZES_TABLE} for c in ("total", "per_rank")}
plots.eagle3_name_grid(names, title=f"{MODEL}: {n_layers} target layers + 1 Eagle3 draft layer, names per PP rank",
                       layer_types=t.config["layer_types"], draft_layer_type=d.config["layer_types"][0]).show()
clashing = {c: [pp for pp in PP_SIZES_TABLE if names[c][pp][-1]["clash"]] for c in names}
for pp in PP_SIZES_TABLE:
    tot, per = names["total"][pp][-1], names["per_rank"][pp][-1]
    print(f"PP={pp}: last rank holds {len(per['target'])} of {n_layers} layers; draft named {tot['draft']} (total) "
          f"vs {per['draft']} (per-rank){' -> CLASH' if per['clash'] else ''}")

# %%
# The rule the picture shows: the per-rank name model.layers.<n_last> is taken on the last rank exactly when that
# rank holds target layer n_last, i.e. when it holds at least half of the layers (and PP > 1).
for pp in PP_SIZES_TABLE:
    last_names = names["per_rank"][pp][-1]
    n_last = len(last_names["target"])
    assert last_names["clash"] == (pp > 1 and n_last >= n_layers - n_last), (pp, last_names)
    assert names["total"][pp][-1]["clash"] is False, pp
    assert {names[c][pp][-1]["layer_types_index"] for c in names} == {0}, pp
elsewhere = [pp for pp in PP_SIZES_TABLE if names["per_rank"][pp][-1]["elsewhere"] is not None]
from kit.lab.notebook import claim
claim(clashing["total"] == [],
      f"with the total count no PP size of {PP_SIZES_TABLE} clashes; with the per-rank count PP sizes {clashing['per_rank']} "
      f"clash on the last rank and {elsewhere} take the name of a target layer on another rank; the layer_types index "
      "is 0 with either count", clashing)

# %% [markdown]
# **Predict, then run:** the same drafter on targets of 5, 6 and 7 layers at PP=2, with the per-rank count. Which
# of them clash? (vLLM's `get_pp_indices` gives an odd layer out to the first stage at PP=2.)
#
# <details><summary>Answer</summary>
#
# Only 6. With 5 layers the stages hold 0-2 and 3-4: the draft is named `model.layers.2`, which lives on rank 0.
# With 6 they hold 0-2 and 3-5: `model.layers.3` is on the last rank, a clash. With 7 they hold 0-3 and 4-6:
# `model.layers.3` again lives on rank 0. The last rank must hold at least half of the layers. The cell below checks it.
# </details>

# %%
answer = {n: eagle3_layer_names(n, 2, "per_rank")[-1] for n in (5, 6, 7)}
for n, r in answer.items():
    print(f"{n} layers: last rank holds {r['target']}, draft named {r['draft']}, clash: {r['clash']}")
claim([n for n, r in answer.items() if r["clash"]] == [6], "at PP=2 only the 6-layer target clashes", answer)

# %% [markdown]
# ## The fixed behaviour (vLLM 0.32 + the kit), read from the live engine
# One engine at `PP` with the drafter (and a reference engine further down), each with its status line.

# %%
# about 25 s on 2 cores: one engine
from kit import engine
topo = Topology(model=MODEL, pp=PP, spec=SPEC)
prompts = kit.checks.compare.load_prompts(limit=NUM_PROMPTS)
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
# What the engine built, drawn like the picture above: the names from the workers, each layer's kind from its
# sliding window as built (a window: sliding; none: full).
def short(layer):
    return layer.replace(".self_attn.attn", "")

built, built_kinds = [], {}
for r in ranks:
    drafted = r["draft"]["attn_layers"] if r["draft"] else {}
    target = {short(n): v for n, v in r["target_attn_layers"].items() if n not in drafted}
    built.append({"pp_rank": r["pp_rank"], "target": sorted(target, key=lambda n: int(n.split(".")[2])),
                  "draft": next((short(n) for n in drafted), None)})
    built_kinds.update({int(n.split(".")[2]): plots.attention_kind(v["sliding_window"]) for n, v in target.items()})
for row in built:
    row["clash"] = row["draft"] in row["target"]
    row["elsewhere"] = next((o["pp_rank"] for o in built if o is not row and row["draft"] in o["target"]), None)
built_types = [built_kinds[i] for i in sorted(built_kinds)]
built_draft_kind = plots.attention_kind(next(iter(last["draft"]["attn_layers"].values()))["sliding_window"])
plots.eagle3_name_grid({"built": {PP: built}}, title=f"{MODEL} at PP={PP}: the attention layers the engine built",
                       layer_types=built_types, draft_layer_type=built_draft_kind,
                       panel_titles=["read from the workers (vLLM 0.32: the total count)"]).show()
predicted_rows = eagle3_layer_names(n_layers, PP, "total")
claim([(r["target"], r["draft"]) for r in built] == [(r["target"], r["draft"]) for r in predicted_rows]
      and built_types == t.config["layer_types"] and built_draft_kind == d.config["layer_types"][0],
      f"at PP={PP} the engine built the names the picture predicts for the total count, and every layer "
      "(draft included) the attention kind its config's layer_types gives", (built, built_types, built_draft_kind))

# %% [markdown]
# **What it shows:** the draft's layer is named after *all* target layers (`model.layers.<total>`), so on the last
# rank it sits next to the target's own layers without a name clash, and its draft-relative index
# `total - total = 0` picks the draft's `layer_types[0]`: its marker has the shape of the kind its config says
# (printed above).

# %%
# about 10 s on 2 cores: the reference engine
draft_layers = last["draft"]["attn_layers"]
total = last["total_layers"]
want_sliding = resolve_model(t.draft_model).config["layer_types"][0] == "sliding_attention"
claim(last["draft"]["target_layer_count"] == total, f"the draft subtracts the total target layer count, {total}",
      f"the draft indexes layer_types with {last['draft']['target_layer_count']} target layers, not the total {total}")
claim(all(name.startswith(f"model.layers.{total}.") for name in draft_layers),
      f"the draft layer is named model.layers.{total}, after all target layers: no clash", draft_layers)
claim(all(bool(v["sliding_window"]) == want_sliding for v in draft_layers.values()),
      f"the draft layer is {'sliding-window' if want_sliding else 'full'} attention, as its layer_types[0] says", draft_layers)
ref = engine.generate(topo.reference(), prompts, max_tokens=MAX_TOKENS)
claim(fixed_tokens == ref.token_ids,
      f"Eagle3 at PP={PP} gives the reference's tokens ({len(prompts)} prompts x {MAX_TOKENS} tokens)", fixed_spec)
accepted, drafted = fixed_spec["num_accepted_tokens"], fixed_spec["num_draft_tokens"]
claim(accepted > 0.25 * drafted,
      f"the trained draft's tokens are accepted: {accepted} of {drafted} draft tokens ({accepted / max(drafted, 1):.0%}), "
      f"{fixed_spec['mean_acceptance_length'] or 0:.2f} tokens per target forward on drafted steps", fixed_spec)

# %% [markdown]
# ## The old behaviour: the per-rank count, where the picture predicts a clash
# The kit's teaching patch `eagle3_per_rank_layers_legacy` makes the drafter use `get_num_layers(parallel_config)`
# (what vLLM did before PR #46003) for `target_layer_num`. The engine below runs at `PP`; the picture above
# predicts its draft layer's name, and the cell waits until the last rank refuses it.

# %%
# about 20 s on 2 cores: one engine with the per-rank layer count
legacy_err, legacy = None, None
try:
    if RUN_LEGACY:
        res = engine.run(topo, [{"kind": "rpc", "method": "kit_eagle3_layers"}], env={"KIT_PATCHES": LEGACY_PATCHES},
                         timeout=600)
        legacy = sorted(res["jobs"][0], key=lambda r: r["pp_rank"])[-1]
        print("legacy draft target_layer_count:", legacy["draft"]["target_layer_count"])
        print("legacy draft attention layers  :", legacy["draft"]["attn_layers"])
except engine.EngineError as e:
    legacy_err = str(e)
    print(legacy_err)

# %%
# Either vLLM refuses the clash outright, or the draft layer carries the name of a target layer that lives
# on the same (last) rank: model.layers.<per-rank count> instead of model.layers.<total>.
if not RUN_LEGACY:
    print("RUN_LEGACY = False: not run here")
elif legacy_err is not None:
    # Observed on vLLM 0.32: the last rank refuses to build the draft layer under a target layer's name.
    clash = f"Duplicate layer name: model.layers.{last['per_rank_layers']}."
    claim(clash in legacy_err, f"with the per-rank count the last rank refuses the draft layer: {clash}", legacy_err)
else:
    per_rank = legacy["per_rank_layers"]
    names = list(legacy["draft"]["attn_layers"])
    target_on_last = {int(k.split(".")[2]) for k in last["target_attn_layers"] if k not in last["draft"]["attn_layers"]}
    claim(legacy["draft"]["target_layer_count"] == per_rank != legacy["total_layers"]
          and all(n.startswith(f"model.layers.{per_rank}.") for n in names) and per_rank in target_on_last,
          f"with the per-rank count the draft layer takes the name of target layer {per_rank} on the last rank",
          (per_rank, names, target_on_last))

# %% [markdown]
# ## The per-rank count where the picture predicts no clash on the last rank
# At `NO_CLASH_PP` the last rank holds fewer than half of the target layers, so the per-rank name is that of a
# target layer on *another* rank (purple above). No rank builds two layers of one name, so nothing refuses while the
# model is built. **Predict** before running: does this engine start?
#
# <details><summary>Answer</summary>
#
# No. After building the model every worker reports its KV cache spec per layer name, and the engine core merges
# them into one dict (`get_kv_cache_configs` in `vllm/v1/core/kv_cache_utils.py`: "Different PP stages may have
# different layer names"). The draft layer and the target layer of the same name then meet there; their specs
# differ when their attention kinds do, and vLLM stops: `The KV cache specs for the same layer are different across
# workers`. (Had they been of one kind, the two layers would have been merged silently into one entry.)
# </details>

# %%
# about 30 s on 2 cores: one engine at the PP size without a clash
predicted = eagle3_layer_names(n_layers, NO_CLASH_PP, "per_rank")[-1]
idx = int(predicted["draft"].split(".")[2])
target_kind, draft_kind = t.config["layer_types"][idx], d.config["layer_types"][0]
print(f"PP={NO_CLASH_PP}: the draft layer would be {predicted['draft']} on rank {predicted['pp_rank']}; target layer {idx} "
      f"lives on rank {predicted['elsewhere']} ({target_kind}), the draft layer is {draft_kind}")
topo_nc = Topology(model=MODEL, pp=NO_CLASH_PP, spec=SPEC)
nc_err = None
try:
    res_nc = engine.run(topo_nc, [{"kind": "rpc", "method": "kit_eagle3_layers"}], env={"KIT_PATCHES": LEGACY_PATCHES})
    print("started; draft attention layers:", sorted(res_nc["jobs"][0], key=lambda r: r["pp_rank"])[-1]["draft"]["attn_layers"])
except engine.EngineError as e:
    nc_err = str(e)
    print("\n".join(l for l in nc_err.splitlines() if "Error" in l or "died" in l))

# %%
assert not predicted["clash"] and predicted["elsewhere"] not in (None, predicted["pp_rank"]), predicted
assert target_kind != draft_kind, "this lesson needs a target layer of another attention kind under the draft's name"
assert nc_err is not None, f"PP={NO_CLASH_PP} with the per-rank count started"
assert "The KV cache specs for the same layer are different across workers" in nc_err, nc_err
claim("Duplicate layer name" not in nc_err,
      f"at PP={NO_CLASH_PP} the per-rank count names the draft layer {predicted['draft']}, a target layer of "
      f"rank {predicted['elsewhere']}; no rank refuses the name, and the engine core stops at KV cache setup because "
      f"the two layers' specs ({draft_kind} vs {target_kind}) differ", nc_err)

# %% [markdown]
# **Takeaway:** number the Eagle3 draft layer after the model's total layer count: the per-rank count keeps the
# `layer_types` index right but gives the draft layer a target layer's name, and the engine does not start.
# %%
display(kit.lab.notebook.where_next("02"))
