# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Start here: PP + MTP on real vLLM, token for token
#
# **The question:** can a model split over two pipeline stages (PP=2) with an MTP drafter produce *exactly*
# the tokens of the plain model (PP=1, no speculation)? Greedy decoding is deterministic, so it must — and on
# stock vLLM 0.32 it does not (it does not even start). The kit's patches make it so; this notebook checks it.
#
# **Words you will meet**
# - **PP (pipeline parallelism)**: the decoder layers are split into consecutive stages, one process (rank) each.
#   Rank 0 embeds the tokens; the last rank holds the LM head and samples.
# - **MTP / Eagle3 drafter**: a small extra head that guesses the next *k* tokens; the target model checks all
#   of them in one forward pass and keeps the longest correct prefix (plus one token of its own). Correct
#   speculation never changes greedy output, it only saves target forwards.
# - **PD disaggregation**: one server does the prefill (producer) and hands the KV cache to another that decodes (consumer).
#
# **Where to go next**
# | notebook | question |
# |---|---|
# | `01_drafter_placement` | where do layers, drafter, embedding, LM head and KV cache live at PP=2 and PP=4? |
# | `02_layer_types_fix` | why must an Eagle3 drafter index `layer_types` with the *total* layer count? |
# | `03_draft_acceptance` | how many drafts are accepted per position, at PP=1 and PP=2? |
# | `04_pd_kv_handoff` | what moves from producer to consumer, and are the tokens still right? |

# %% tags=["parameters"]
# Parameters (papermill / CI can override these)
MODEL = "tiny-mimo"      # a model under data/models/
RANDOM_WEIGHTS = False   # True: seeded random checkpoint (normal init), False: the trained checkpoint
PP = 2
SPEC = "mtp:2"           # METHOD:K
NUM_PROMPTS = 4
MAX_TOKENS = 32
BREAK_PATCHES = "all,-pp_spec_schedule_gate,-pp_microbatches,-decode_side_pp_spec_rule"   # "break it": the gate off
SHOW_DOCTOR = True       # run `kit doctor` below (about 10 s; the report lists the versions anyway)

# %%
import kit
import kit.checks.compare
import kit.lab.notebook
kit.lab.notebook.setup()

# %% [markdown]
# ## The machine and the kit
# `kit doctor` shows versions and which patches apply in this vLLM.

# %%
import subprocess, sys
if SHOW_DOCTOR:
    print(subprocess.run([sys.executable, "-m", "kit", "doctor"], capture_output=True, text=True).stdout)

# %% [markdown]
# ## A first run
# The kit starts the reference (PP=1, no speculation) and the topology below as real vLLM engines (each in
# its own process group, torn down afterwards), on the same prompts, greedy, float32. On 2 cores this takes about
# 45 s: 15-25 s per engine, most of it vLLM starting; a status line under the cell shows the phase.

# %%
from kit.core.topology import Topology
from kit.checks.compare import compare, load_prompts

topo = Topology(model=MODEL, random_weights=RANDOM_WEIGHTS, pp=PP, spec=SPEC)
prompts = load_prompts(limit=NUM_PROMPTS)
cmp = compare(topo, prompts, max_tokens=MAX_TOKENS)
d = cmp.to_dict()
print("topology  :", topo.label())
print("identical :", d["identical"], " first divergence:", d["first_divergence"])
print("acceptance:", d["acceptance"])

# %%
from kit.lab import plots
plots.token_match(cmp.reference.token_ids, cmp.result.token_ids,
                  title=f"{topo.label()} vs PP=1 no-spec: green = same token").show()

# %% [markdown]
# **What it shows:** every cell is one generated token; green means the PP + MTP engine produced the same token
# as the reference. An all-green picture is the claim of this kit: speculation under PP changes *how* tokens are
# produced (fewer target forwards when drafts are accepted), never *which* tokens.

# %%
from kit.lab.notebook import claim
claim(d["identical"], f"{topo.label()} gives the reference's tokens, all {sum(map(len, cmp.reference.token_ids))} of them",
      d["first_divergence"])
claim(d["acceptance"]["num_drafts"] > 0, f"the drafter ran: {d['acceptance']['num_accepted_tokens']} draft tokens accepted")

# %% [markdown]
# **Predict, then run:** the engine above generated every token shown. Did it need as many target forward passes
# (verify rounds) as it generated tokens, fewer, or more?
#
# <details><summary>Answer</summary>
#
# Fewer. Each verify round yields its own token plus every accepted draft, so a round gives
# 1 + (accepted drafts) tokens; with drafts accepted the rounds are fewer than the tokens. The cell below prints
# this run's numbers and checks them.
# </details>

# %%
from IPython.display import Markdown
acc = cmp.result.spec
generated = cmp.result.num_generated
display(Markdown(f"**This run:** {generated} tokens for {len(prompts)} prompts in {acc.num_drafts} verify rounds "
                 f"(plus one prefill per prompt); {acc.num_accepted_tokens} of {acc.num_draft_tokens} draft tokens "
                 f"accepted, {acc.mean_acceptance_length:.2f} tokens per verify round."))
claim(acc.num_accepted_tokens > 0 and acc.num_drafts < generated,
      f"{acc.num_drafts} verify rounds for {generated} tokens: fewer target forwards than tokens")

# %% [markdown]
# ## Break it, then fix it
# Under PP a request's step is still travelling through the stages when the scheduler plans the next batch. Without
# drafts such a request has nothing new to compute and is skipped; *with* drafts stock vLLM 0.32 schedules it
# again, with the drafts at the wrong positions, and the last stage then reads another request's row of logits.
# The kit's `pp_spec_schedule_gate` patch hides those drafts until the step is back. Predict what the same prompts
# give with that patch off, in vLLM's own step loop (`BREAK_PATCHES`: the kit's `pp_microbatches` is off too, since
# with it the drafts come back only after the step's tokens and there is nothing left for the gate to hide; the
# decode-side rule is off as well, or the kit would refuse the engine before it starts), then run it: one more
# engine, about 25 s on 2 cores.
#
# <details><summary>Answer</summary>
#
# Different tokens from the first decode steps on, and some of them are tokens of *another* prompt: the requests
# leak into each other. The picture puts this run (left) beside the run above with every patch on (right).
# </details>

# %%
from kit import engine
from kit.checks.compare import first_divergence
broken = engine.generate(topo, prompts, max_tokens=MAX_TOKENS, env={"KIT_PATCHES": BREAK_PATCHES})
ref_ids = cmp.reference.token_ids
plots.token_match_side_by_side(ref_ids, {"pp_spec_schedule_gate off": broken.token_ids,
                                         "all patches on (the run above)": cmp.result.token_ids},
                               title=f"{topo.label()}: the same prompts with the gate off and on (red = not the reference's token)"
                               ).update_layout(meta="main").show()   # meta="main": the report's thumbnail
wrong = [(i, j, g) for i, (r, b) in enumerate(zip(ref_ids, broken.token_ids)) for j, (x, g) in enumerate(zip(r, b)) if x != g]
# A wrong token that another prompt's reference has within two positions: a token that came from that request.
leaks = [(i, j, g, i2) for i, j, g in wrong for i2, r2 in enumerate(ref_ids) if i2 != i and g in r2[max(0, j - 2):j + 3]]
print(f"gate off: {len(wrong)} of {sum(map(len, ref_ids))} tokens differ; first divergence:", first_divergence(cmp.reference, broken))
print("wrong tokens that another prompt's reference has nearby (prompt, position, token, from prompt):", leaks[:8])

# %%
claim(first_divergence(cmp.reference, broken) is not None and d["identical"],
      f"without pp_spec_schedule_gate {len(wrong)} of {sum(map(len, ref_ids))} tokens differ from the reference; "
      "with every patch on, none")
