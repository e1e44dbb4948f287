"""Write notebooks/*.ipynb from the cell lists below (committed without outputs).

Edit a notebook here, then run `.venv/bin/python scripts/build_notebooks.py`; the notebooks stay plain
`.ipynb` files that JupyterLab opens and papermill runs.
"""
from __future__ import annotations

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

OUT = Path(__file__).resolve().parent.parent / "notebooks"

SETUP = """\
import os, sys, pathlib
# Notebooks run from notebooks/; make the repo importable even without `pip install -e .`.
sys.path.insert(0, str(pathlib.Path.cwd().parent))
import kit
import kit.compare
import plotly.io as pio
# JupyterLab renders the plotly mime type; the HTML report (nbconvert) gets plotly.js embedded once per
# notebook, so the report opens offline.
pio.renderers.default = "plotly_mimetype+notebook"
"""


def md(s):
    return new_markdown_cell(s.strip())


def code(s, params=False):
    c = new_code_cell(s.strip())
    if params:
        c.metadata["tags"] = ["parameters"]
    return c


NB = {}

NB["00_start_here"] = [
    md("""
# Start here: PP + MTP on real vLLM, token for token

**The question:** can a model split over two pipeline stages (PP=2) with an MTP drafter produce *exactly*
the tokens of the plain model (PP=1, no speculation)? Greedy decoding is deterministic, so it must — and on
stock vLLM 0.32 it does not (it does not even start). The kit's patches make it so; this notebook checks it.

**Words you will meet**
- **PP (pipeline parallelism)**: the decoder layers are split into consecutive stages, one process (rank) each.
  Rank 0 embeds the tokens; the last rank holds the LM head and samples.
- **MTP / Eagle3 drafter**: a small extra head that guesses the next *k* tokens; the target model checks all
  of them in one forward pass and keeps the longest correct prefix (plus one token of its own). Correct
  speculation never changes greedy output, it only saves target forwards.
- **PD disaggregation**: one server does the prefill (producer) and hands the KV cache to another that decodes (consumer).

**Where to go next**
| notebook | question |
|---|---|
| `01_drafter_placement` | where do layers, drafter, embedding, LM head and KV cache live at PP=2 and PP=4? |
| `02_layer_types_fix` | why must an Eagle3 drafter index `layer_types` with the *total* layer count? |
| `03_draft_acceptance` | how many drafts are accepted per position, at PP=1 and PP=2? |
| `04_pd_kv_handoff` | what moves from producer to consumer, and are the tokens still right? |
"""),
    code("""
# Parameters (papermill / CI can override these)
MODEL = "tiny-mimo"      # a model under data/models/
RANDOM_WEIGHTS = False   # True: seeded random checkpoint (normal init), False: the trained checkpoint
PP = 2
SPEC = "mtp:2"           # METHOD:K
NUM_PROMPTS = 4
MAX_TOKENS = 32
""", params=True),
    code(SETUP),
    md("## The machine and the kit\n`kit doctor` shows versions and which patches apply in this vLLM."),
    code("""
import subprocess
print(subprocess.run([sys.executable, "-m", "kit", "doctor"], capture_output=True, text=True, cwd="..").stdout)
"""),
    md("""
## A first run
The kit starts the reference (PP=1, no speculation) and the topology below as real vLLM engines (each in
its own process group, torn down afterwards), on the same prompts, greedy, float32.
"""),
    code("""
from kit.topology import Topology
from kit.compare import compare, load_prompts

topo = Topology(model=MODEL, random_weights=RANDOM_WEIGHTS, pp=PP, spec=SPEC)
prompts = load_prompts(limit=NUM_PROMPTS)
cmp = compare(topo, prompts, max_tokens=MAX_TOKENS)
d = cmp.to_dict()
print("topology  :", topo.label())
print("identical :", d["identical"], " first divergence:", d["first_divergence"])
print("acceptance:", d["acceptance"])
"""),
    code("""
from kit import plots
plots.token_match(cmp.reference.token_ids, cmp.result.token_ids,
                  title=f"{topo.label()} vs PP=1 no-spec: green = same token").show()
"""),
    md("""
**What it shows:** every cell is one generated token; green means the PP + MTP engine produced the same token
as the reference. An all-green picture is the claim of this kit: speculation under PP changes *how* tokens are
produced (fewer target forwards when drafts are accepted), never *which* tokens.
"""),
    code("""
assert d["identical"], f"PP={PP} + {SPEC} diverged from the reference: {d['first_divergence']}"
assert d["acceptance"]["num_drafts"] > 0, "the drafter never ran"
print("claim holds: identical tokens,", d["acceptance"]["num_accepted_tokens"], "draft tokens accepted")
"""),
]

NB["01_drafter_placement"] = [
    md("""
# Where does everything live under PP?

**The question:** with PP=2 and PP=4, which rank holds which decoder layers, the embedding, the LM head,
the MTP drafter and which KV cache? Everything below is read from the **live engine**: the kit adds a method
to every vLLM worker (`worker_extension_cls`) and calls it with `LLM.collective_rpc`.
"""),
    code("""
MODEL = "tiny-mimo"
RANDOM_WEIGHTS = True
SPEC = "mtp:1"
PP_SIZES = [2, 4]
PATCHES_FOR_FAILURE = "all,-drafter_only_on_last_rank"   # the run that shows what breaks
""", params=True),
    code(SETUP),
    code("""
import pandas as pd
from kit.topology import Topology
from kit.placement import placement, summary_rows
from kit import plots

layouts = {}
for pp in PP_SIZES:
    topo = Topology(model=MODEL, random_weights=RANDOM_WEIGHTS, pp=pp, spec=SPEC)
    layouts[pp] = placement(topo)
    display(pd.DataFrame(summary_rows(layouts[pp])).set_index("pp_rank"))
"""),
    code("""
n_layers = Topology(model=MODEL, random_weights=True).info.num_layers
for pp, ranks in layouts.items():
    plots.placement_lanes(ranks, n_layers, title=f"PP={pp}: layers per rank, drafter on the last rank").show()
"""),
    md("""
**What it shows:** the decoder layers are split into consecutive ranges; rank 0 alone embeds tokens, the
last rank alone has the LM head — and the MTP drafter (with its own copy of embedding and LM head) lives
only on the last rank, next to the sampler whose tokens it extends. Each rank's KV cache holds only its own
layers' KV; the drafter's layer KV sits on the last rank.
"""),
    code("""
for pp, ranks in layouts.items():
    last = max(r["pp_rank"] for r in ranks)
    covered = sorted(i for r in ranks for i in r["layers"])
    assert covered == list(range(n_layers)), f"PP={pp}: layers not partitioned: {covered}"
    for r in ranks:
        has_drafter = bool(r["drafter"] and r["drafter"].get("params"))
        assert has_drafter == (r["pp_rank"] == last), f"PP={pp} rank {r['pp_rank']}: drafter placement"
        assert r["embedding"] == (r["pp_rank"] == 0) and r["lm_head"] == (r["pp_rank"] == last)
print("claim holds: layers partitioned, drafter / embedding / LM head where expected")
"""),
    md("""
## The failure without the kit's drafter guard
Stock vLLM 0.32 creates the drafter only on the last rank, but other start-up paths touch `self.drafter` on
every rank. Turning the kit's `drafter_only_on_last_rank` patch off shows the crash (caught here).
"""),
    code("""
from kit.engine import EngineError
err = None
try:
    placement(Topology(model=MODEL, random_weights=RANDOM_WEIGHTS, pp=2, spec=SPEC),
              env={"KIT_PATCHES": PATCHES_FOR_FAILURE}, timeout=300)
except EngineError as e:
    err = str(e)
print(err or "no error: the run started")
"""),
    code("""
assert err is not None and "has no attribute 'drafter'" in err, "expected the missing-drafter crash"
print("as expected: the non-last rank touched a drafter it does not have")
"""),
]

NB["03_draft_acceptance"] = [
    md("""
# How many drafts are accepted, per position, and does PP change that?

**The question:** with the trained `tiny-mimo` (one MTP layer, trained to predict the token after next),
how often is each draft position accepted for k = 1..4, and are the counts the same at PP=1 and PP=2?
They must be: with greedy decoding, acceptance depends only on the model, not on how it is split.
"""),
    code("""
MODEL = "tiny-mimo"
KS = [1, 2, 3, 4]
PP_SIZES = [1, 2]
NUM_PROMPTS = 8
MAX_TOKENS = 48
SAMPLED_TEMPERATURE = 0.8
""", params=True),
    code(SETUP),
    code("""
import time
from kit import engine, plots
from kit.compare import load_prompts
from kit.topology import Topology

prompts = load_prompts(limit=NUM_PROMPTS)
greedy = {"kind": "generate", "prompts": prompts, "max_tokens": MAX_TOKENS}
sampled_job = dict(greedy, temperature=SAMPLED_TEMPERATURE, seed=0)
results, sampled = {}, None
for pp in PP_SIZES:
    for k in [0] + list(KS):
        topo = Topology(model=MODEL, pp=pp, spec=f"mtp:{k}" if k else None)
        # The sampled setting rides on the first PP size's largest-k engine (one engine start fewer).
        want_sampled = pp == PP_SIZES[0] and k == KS[-1]
        res = engine.run(topo, [greedy] + ([sampled_job] if want_sampled else []))
        results[(pp, k)] = engine.GenerationResult.from_dict(res["jobs"][0])
        if want_sampled:
            sampled = engine.GenerationResult.from_dict(res["jobs"][1])
rows = []
for (pp, k), r in results.items():
    s = r.spec
    rows.append({"PP": pp, "k": k, "drafts": s.num_drafts, "accepted": s.num_accepted_tokens,
                 "per_position": s.per_position, "mean_acceptance_length": s.mean_acceptance_length,
                 "tokens/s": round(r.num_generated / r.seconds, 1)})
import pandas as pd
display(pd.DataFrame(rows))
"""),
    code("""
plots.acceptance_bars([{"label": f"PP={pp}, k={k}", "per_position_rate": results[(pp, k)].spec.per_position_rate}
                       for pp in PP_SIZES for k in KS]).show()
"""),
    md("""
**What it shows:** position 1 (the MTP head's own prediction) is accepted most often; later positions reuse
the same head on its own guesses, so acceptance falls with depth. Bars of the same k at PP=1 and PP=2 are equal.
Wall-clock tokens/s on 2 CPU cores is honest but not flattering: the drafter's forward and the extra
verification positions cost about as much as they save on a model this small.
"""),
    code("""
for k in KS:
    a, b = results[(PP_SIZES[0], k)], results[(PP_SIZES[-1], k)]
    assert a.token_ids == b.token_ids == results[(PP_SIZES[0], 0)].token_ids, f"k={k}: tokens differ across PP"
    assert a.spec == b.spec, f"k={k}: acceptance differs between PP={PP_SIZES[0]} and PP={PP_SIZES[-1]}: {a.spec} vs {b.spec}"
assert results[(PP_SIZES[0], 1)].spec.per_position_rate[0] >= 0.5, "trained MTP head accepts under half its drafts"
print("claims hold: same tokens and the same acceptance counts at every PP size")
"""),
    md("## A sampled setting\nWith temperature > 0 (seeded) the target samples its token, and a draft is kept with the probability the target gives it, so acceptance usually drops (shown, not asserted)."),
    code("""
greedy_rate = results[(PP_SIZES[0], KS[-1])].spec.per_position_rate
print(f"k={KS[-1]}, temperature {SAMPLED_TEMPERATURE}: acceptance per position", [round(x, 2) for x in sampled.spec.per_position_rate])
print(f"k={KS[-1]}, greedy:            acceptance per position", [round(x, 2) for x in greedy_rate])
assert sampled.spec.num_drafts > 0
"""),
    md("## Try it yourself\nPick k, PP, temperature and a prompt, then press Run (widgets; the defaults above run headless)."),
    code("""
import ipywidgets as W
k_w = W.IntSlider(value=2, min=1, max=4, description="k")
pp_w = W.Dropdown(options=[1, 2, 4], value=2, description="PP")
t_w = W.FloatSlider(value=0.0, min=0.0, max=1.5, step=0.1, description="temperature")
p_w = W.Textarea(value=prompts[0], description="prompt")
out = W.Output()
def _run(_):
    with out:
        out.clear_output()
        r = engine.generate(Topology(model=MODEL, pp=pp_w.value, spec=f"mtp:{k_w.value}"), [p_w.value],
                            max_tokens=MAX_TOKENS, temperature=t_w.value, seed=0)
        print(r.texts[0]); print(r.spec)
btn = W.Button(description="Run"); btn.on_click(_run)
display(W.VBox([k_w, pp_w, t_w, p_w, btn, out]))
"""),
]


NB["02_layer_types_fix"] = [
    md("""
# Eagle3 under PP: why `target_layer_num` must be the *total* layer count

**The question:** an Eagle3 draft model numbers its own decoder layer(s) *after* the target's, and looks up
each layer's attention kind (sliding window or full) in its own `layer_types` by a draft-relative index
`layer_idx - target_layer_count`. Which count is right under PP: the layers on this rank
(`model_config.get_num_layers(parallel_config)`) or all of them (`get_total_num_hidden_layers()`)?

The target here, `tiny-llama-swa`, has 4 layers with `layer_types` alternating sliding / full; its Eagle3 draft
has one sliding layer and reads the target's hidden states after layers 1, 2 and 3 (`eagle_aux_hidden_state_layer_ids`).
"""),
    code("""
MODEL = "tiny-llama-swa"
PP = 2
SPEC = "eagle3:2"
NUM_PROMPTS = 4
MAX_TOKENS = 24
PATCHES = "all"                                         # the fixed run (CI breaks the claim with the legacy patch)
LEGACY_PATCHES = "all,eagle3_per_rank_layers_legacy"   # the old behaviour, reproduced on real vLLM code
""", params=True),
    code(SETUP),
    code("""
import json
from kit.topology import Topology
from kit.models import resolve_model
t = resolve_model(MODEL); d = resolve_model(t.draft_model)
print("target layer_types:", t.config["layer_types"], " sliding_window:", t.config["sliding_window"])
print("draft  layer_types:", d.config["layer_types"], " aux layers:", d.config["eagle_aux_hidden_state_layer_ids"])
"""),
    md("## The fixed behaviour (vLLM 0.32 + the kit), read from the live engine"),
    code("""
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
"""),
    code("""
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
"""),
    md("""
**What it shows:** the draft's layer is named after *all* target layers (`model.layers.4` for a 4-layer target), so
on the last rank it sits next to the target's own layers without a name clash, and its draft-relative index
`4 - 4 = 0` picks `layer_types[0]` = sliding, as its config says.
"""),
    code("""
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
"""),
    md("""
## The old behaviour: the per-rank count
The kit's teaching patch `eagle3_per_rank_layers_legacy` makes the drafter use `get_num_layers(parallel_config)`
(what vLLM did before the seed PR). At PP=2 the last rank holds 2 of the 4 layers, so the draft layer becomes
`model.layers.2` — the name of a target layer that lives on that same rank.
"""),
    code("""
legacy_err, legacy = None, None
try:
    res = engine.run(topo, [{"kind": "rpc", "method": "kit_eagle3_layers"}], env={"KIT_PATCHES": LEGACY_PATCHES}, timeout=600)
    legacy = sorted(res["jobs"][0], key=lambda r: r["pp_rank"])[-1]
    print("legacy draft target_layer_count:", legacy["draft"]["target_layer_count"])
    print("legacy draft attention layers  :", legacy["draft"]["attn_layers"])
except engine.EngineError as e:
    legacy_err = str(e)
    print(legacy_err)
"""),
    code("""
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
"""),
]


NB["04_pd_kv_handoff"] = [
    md("""
# PD disaggregation: what moves from the prefill server to the decode server?

**The question:** a *producer* server (with an MTP drafter) computes a prompt's KV cache and hands it
to a *consumer* server (also with MTP) that decodes. What exactly travels — which layers, how many
blocks and bytes — and are the consumer's tokens still exactly those of one plain engine (PP=1, no speculation)?

Everything below is real: two `vllm` OpenAI servers on loopback, vLLM's NIXL connector with its CPU buffer,
and the kit's router doing the two-step request flow (prefill with `do_remote_decode`, then decode with the
`kv_transfer_params` the producer returned, same request id on both calls).
"""),
    code("""
MODEL = "tiny-mimo"
RANDOM_WEIGHTS = False
PRODUCER_PP = 2          # the seed's scenario: PP=2 + MTP prefill server (push connector); 1 = pull
PRODUCER_SPEC = "mtp:2"
CONSUMER_PP = 1
CONSUMER_SPEC = "mtp:2"
NUM_PROMPTS = 4
MAX_TOKENS = 24
PATCHES_WITHOUT_FIX = "all,-pp_spec_schedule_gate"   # for the decode-side rule demo (no engine starts)
""", params=True),
    code(SETUP),
    code("""
from kit import pd
from kit.compare import load_prompts

producer, consumer = pd.pd_topologies(MODEL, PRODUCER_PP, PRODUCER_SPEC, CONSUMER_PP, CONSUMER_SPEC,
                                      random_weights=RANDOM_WEIGHTS)
connector, reason = pd.choose_connector(producer, consumer)
print("producer :", producer.label())
print("consumer :", consumer.label())
print("connector:", connector, "-", reason)
print("KV layers that move:", pd.kv_layers_moved(producer, consumer))
"""),
    md("""
**Which layers move:** the target's decoder layers `model.layers.0..L-1` from *every* producer PP rank (each
rank pushes its own: with PP=2, layers 0-1 from rank 0 and layers 2-3 plus the MTP layer from rank 1), plus the MTP layer's KV (`model.layers.L`, which vLLM names after all target layers) when
both sides run the drafter: the consumer's drafter needs the prompt's KV for its own attention, or its first
drafts would attend to nothing.
"""),
    code("""
from kit import engine
prompts = load_prompts(limit=NUM_PROMPTS)
# The reference: one plain engine, PP=1, no speculation (kept for the second pair further down).
reference = engine.generate(consumer.reference(), prompts, max_tokens=MAX_TOKENS, top2=True)
# colocated=True: the consumer's topology also runs as one plain engine, for the acceptance comparison below
d = pd.pd_compare(producer, consumer, prompts, max_tokens=MAX_TOKENS, colocated=True, reference=reference)
print("identical to the colocated PP=1 reference:", d["identical"], d["first_divergence"] or "")
print("handoff checks:", d["handoff_checks"])
print("KV bytes: measured", d["kv_bytes_transferred"], " expected", d["kv_bytes_expected"], " =", d["kv_expected"]["formula"])
print("consumer prefill tokens computed itself:", d["consumer_prefill_tokens_computed"],
      " received:", d["consumer_external_tokens"], "of", d["prompt_tokens"])
print("consumer spec-decode counters:", d["consumer_spec"])
"""),
    code("""
import pandas as pd_
rows = []
for r, exp in zip([x for x in d["requests"] if not x["error"]], d["kv_expected"]["per_request"]):
    rows.append({"prompt": r["index"], "prompt tokens": r["prompt_tokens"], "blocks": -(-r["prompt_tokens"] // d["kv_expected"]["block_size"]),
                 "KV bytes measured": r["kv_bytes_transferred"], "KV bytes expected": exp,
                 "consumer computed": r["consumer_prefill_tokens_computed"],
                 "producer prefill s": r["producer_prefill_s"], "consumer s": r["consumer_s"]})
table = pd_.DataFrame(rows).set_index("prompt")
display(table)
"""),
    code("""
import plotly.graph_objects as go
from plotly.subplots import make_subplots
fig = make_subplots(rows=1, cols=2, subplot_titles=("KV bytes per request: measured vs model shape",
                                                    "one request's timeline (s)"))
fig.add_trace(go.Bar(x=table.index, y=table["KV bytes measured"], name="measured (connector)"), row=1, col=1)
fig.add_trace(go.Bar(x=table.index, y=table["KV bytes expected"], name="expected (shape)"), row=1, col=1)
r0 = d["timings"]["per_request"][0]
steps = [("producer prefill", 0.0, r0["producer_prefill_s"]),
         ("consumer decode", r0["producer_prefill_s"], r0["consumer_s"])]
for name, start, dur in steps:
    fig.add_trace(go.Bar(y=["request 0"], x=[dur], base=[start], orientation="h", name=name), row=1, col=2)
fig.update_layout(barmode="group", height=380, title=f"{producer.label()}  ->  {consumer.label()}  ({d['connector_class']})")
fig.show()
"""),
    md("""
**What it shows:** left, for every request the bytes the connector reports moving equal what the model's shape
predicts (moved layers x whole blocks x block size x KV heads x head size x 2 for K and V x 4 bytes in float32):
nothing is missing, nothing extra. Right, one request: the producer computes the prompt and its first token;
the consumer then pulls (or is pushed) the blocks and decodes the rest — it computed none of the prompt itself.
"""),
    code("""
assert d["identical"], f"consumer tokens differ from the colocated reference: {d['first_divergence']}"
assert d["consumer_prefill_tokens_computed"] == 0, "the consumer recomputed prompt tokens: the handoff did not work"
assert d["kv_bytes_transferred"] == d["kv_bytes_expected"], (d["kv_bytes_transferred"], d["kv_bytes_expected"])
assert all(r["kv_bytes_transferred"] == e for r, e in zip(d["requests"], d["kv_expected"]["per_request"]))
if producer.spec and consumer.spec:
    assert f"model.layers.{producer.info.num_layers}" in d["kv_expected"]["layers"], "the MTP layer's KV must move"
print("claims hold: identical tokens, no prompt token recomputed, every byte accounted for")
"""),
    md("""
## Does the consumer's drafter accept as much as on one engine?
The consumer's MTP drafter attends to the prompt through the MTP layer's KV that the producer sent. If that KV
were missing or wrong, its drafts would be worse and fewer would be accepted. So: run the consumer's topology
once more as one plain engine (no PD) on the same prompts, and put the two sets of spec-decode counters side by side.
"""),
    code("""
a = d["acceptance_vs_colocated"]
print("consumer :", a["consumer"])
print("colocated:", a["colocated"])
print("accepted drafts equal (total and per position):", a["accepted_equal"],
      "| extra verify rounds on the consumer:", a["extra_draft_rounds"], "for", a["requests"], "requests")
k = len(a["consumer"]["per_position"])
fig2 = go.Figure()
for name, c in (("PD consumer", a["consumer"]), ("colocated engine", a["colocated"])):
    fig2.add_trace(go.Bar(x=[f"draft position {i + 1}" for i in range(k)] + ["verify rounds"],
                          y=list(c["per_position"]) + [c["num_drafts"]], name=name))
fig2.update_layout(barmode="group", height=360, yaxis_title="count",
                   title="accepted drafts per position, and verify rounds: PD consumer vs one engine")
fig2.show()
"""),
    md("""
**What it shows:** the accepted drafts are the same at every draft position — the drafter on the consumer
proposes exactly what it proposes on one engine, which it could not do without the MTP layer's KV from the
producer. The one difference is by design of the handoff: the consumer runs one extra verify round per
request (measured: 8 more rounds for 8 requests, with MTP k=2 at PP=1 -> PP=1 pull and at PP=2 -> PP=1
push), and nothing in that round is accepted, so its mean acceptance length is a little lower (2.02 against
2.08 for 8 prompts x 40 tokens). A consumer request starts without drafts of its own — the producer drafted
for its own prefill step, and those drafts do not travel — so its first round verifies drafts that are
rejected; every later round matches the colocated engine's one for one.
"""),
    code("""
assert a["accepted_equal"], ("the consumer's drafter accepted differently from one engine: "
                             f"{a['consumer']['per_position']} vs {a['colocated']['per_position']}")
assert a["colocated_tokens_identical_to_reference"]
assert 0 <= a["extra_draft_rounds"] <= a["requests"], a
print("claim holds: same accepted drafts per position as one engine; at most one extra round per request")
"""),
    md("""
## And if the MTP layer's KV did not arrive?
The claim above is that the consumer's drafter *needs* the MTP layer's KV from the producer. Test it: run a
producer **without** the drafter (PP=2, no MTP: it never computes the MTP layer's KV, so the connector has
nothing to send for it) into the same MTP consumer. vLLM refuses such a pair by default — the NIXL
handshake's compatibility hash covers the MTP configuration (`NIXL compatibility hash mismatch`) — so this
run turns that check off (`enforce_handshake_compat=false`, a documented connector option). The consumer's
MTP layer then attends over prompt KV blocks that were never written.
"""),
    code("""
# Push from a PP=2 producer is the only 0.32 NIXL path that leaves one consumer layer out (each producer stage
# writes its own layers; nobody writes the MTP layer's region). The consumer here runs at PP=1.
no_mtp_producer = producer.with_(pp=2, spec=None)
mtp_consumer = consumer.with_(pp=1)
print("KV layers that move now:", pd.kv_layers_moved(no_mtp_producer, mtp_consumer))
w = pd.pd_compare(no_mtp_producer, mtp_consumer, prompts, max_tokens=MAX_TOKENS, reference=reference,
                  kv_extra_config={"enforce_handshake_compat": False})
print("identical:", w["identical"], "| handoff:", w["handoff_ok"], "| KV bytes", w["kv_bytes_transferred"],
      "expected", w["kv_bytes_expected"])
with_kv, without_kv = d["consumer_spec"], w["consumer_spec"]
print("consumer accepted with the MTP layer's KV   :", with_kv["num_accepted_tokens"], with_kv["per_position"],
      "in", with_kv["num_drafts"], "rounds")
print("consumer accepted without the MTP layer's KV:", without_kv["num_accepted_tokens"], without_kv["per_position"],
      "in", without_kv["num_drafts"], "rounds")
fig3 = go.Figure()
for name, c in (("MTP layer's KV sent", with_kv), ("MTP layer's KV withheld", without_kv)):
    fig3.add_trace(go.Bar(x=[f"draft position {i + 1}" for i in range(k)] + ["verify rounds"],
                          y=list(c["per_position"]) + [c["num_drafts"]], name=name))
fig3.update_layout(barmode="group", height=360, yaxis_title="count",
                   title="PD consumer's drafter with and without the MTP layer's prompt KV")
fig3.show()
"""),
    md("""
**What it shows:** the tokens stay identical — the target model's KV all arrived, and speculative decoding
only changes *how fast* tokens come, never which ones. But the drafter, reading an unwritten prompt KV in its
own attention layer, gets fewer drafts accepted and the consumer needs more verify rounds for the same tokens
(measured here with 8 prompts x 40 tokens: accepted 160 [94, 66] in 168 rounds without the MTP layer's KV,
against 166 [94, 72] in 162 rounds with it; with the CI's 2 prompts x 16 tokens: 14 [8, 6] in 19 rounds against
17 [11, 6] in 17). That is why the kit counts the MTP layer among the layers that must move,
and why vLLM's handshake refuses a producer whose MTP configuration differs.
"""),
    code("""
assert w["identical"], f"withholding the drafter's KV changed the tokens: {w['first_divergence']}"
assert w["handoff_ok"], w["handoff_checks"]
assert f"model.layers.{producer.info.num_layers}" not in w["kv_expected"]["layers"]
assert without_kv["num_accepted_tokens"] < with_kv["num_accepted_tokens"], (without_kv, with_kv)
assert without_kv["num_drafts"] >= with_kv["num_drafts"], (without_kv, with_kv)
print("claims hold: same tokens; fewer accepted drafts and no fewer rounds without the MTP layer's KV")
"""),
    md("""
## What does not run on vLLM 0.32 (CPU), observed
- **Producer PP=2 + MTP** (the seed's scenario, run above) needs the push connector (the only 0.32 NIXL mode
  that pairs different PP sizes) and three kit patches. Stock, the producer's last PP worker fails while
  registering its KV regions (`assert num_local_layers > 0 and self.num_regions % num_local_layers == 0`: 2
  target layers *plus* the MTP layer's KV on that rank; `nixl_pp_draft_regions`). And on a CPU host the pair
  stalls for minutes at random: NIXL's CPU init pins each worker's forward thread to the machine's last core
  (`os.sched_setaffinity`, `nixl_cpu_affinity` undoes it), so all three workers shared one core, and every NIXL
  agent's progress thread spun a core of its own (`pthrDelay = 0`; `nixl_progress_delay`).
- **Consumer PP=2**: stock vLLM refuses it (`NixlPushConnector consumer (decode) does not support
  pipeline_parallel_size > 1.`). The kit's `nixl_pp_consumer` patch runs it when the producer has the same PP
  size (`PRODUCER_PP = CONSUMER_PP = 2` above): producer stage s writes into consumer stage s. A PP=1 producer
  into a PP=2 consumer would need one stage's layers split across two destinations; the kit refuses that pair
  before anything starts.
- **MTP on the consumer only**: the handshake refuses (`NIXL compatibility hash mismatch ... Prefill and
  decode instances have incompatible configurations`) unless the check is turned off, as in the run above.

## The decode-side rule
The seed PR forbids MTP with PP>1 on a decode (consumer) server, because stock vLLM's PP + speculation
produces wrong tokens. With the kit's correctness patches active it is allowed (and verified above for the
producer; the tests check a PP=2 consumer too). With them off, the kit's `decode_side_pp_spec_rule` patch
refuses the engine with a ValueError at configuration time (inside every vLLM process); the kit checks the
same rule before it starts anything, so the refusal below takes milliseconds.
"""),
    code("""
from kit import engine
from kit.topology import Topology, TopologyError
t = Topology(model=MODEL, random_weights=True, pp=2, spec="mtp:1")   # a decode-side engine: no PD producer role
rule_err = None
try:
    engine.generate(t, prompts[:1], max_tokens=4, env={"KIT_PATCHES": PATCHES_WITHOUT_FIX})
except TopologyError as e:
    rule_err = str(e)
print(rule_err or "no error: the engine ran")
assert rule_err and "only supported on the prefill side" in rule_err, "expected the decode-side rule to refuse"
print("as expected: refused before any process started; the same topology with the fix active is allowed")
engine.precheck(t)   # default KIT_PATCHES=all: allowed
"""),
]


def main() -> None:
    OUT.mkdir(exist_ok=True)
    for name, cells in NB.items():
        nb = new_notebook(cells=cells, metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                                "language": "python"}})
        nbformat.write(nb, str(OUT / f"{name}.ipynb"))
        print("wrote", OUT / f"{name}.ipynb")


if __name__ == "__main__":
    main()
