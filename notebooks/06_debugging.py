# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Debugging wrong tokens: from the symptom to the patch
#
# **The question:** a PP=2 + MTP engine on stock vLLM 0.32 gives tokens that differ from the PP=1 reference. Is it
# a numerical tie or a bug, which part of the topology causes it, and which line of the engine's schedule is wrong?
# This notebook walks the path the kit's tools take: the first divergence and its margin, a topology that does not
# fail, the per-rank step trace, the request that was scheduled while in flight and the row of logits it read, and
# last the patch that fixes it.
#
# Words used here (verify round, in flight, empty step, reference margin, engine core, ...) are defined in the
# [Glossary](00_start_here.ipynb#Glossary) of notebook 00. Notebook 00 shows the same defect in one picture; this
# one finds its root cause as you would for a defect you do not know yet. About 100 s on 2 cores (five small
# engines, each printing its phase while it runs); each engine cell says how long it takes.

# %% tags=["parameters"]
MODEL = "tiny-mimo"      # the trained checkpoint: its drafts are accepted, so the bug has drafts to misplace
PP = 2
SPEC = "mtp:2"
NUM_PROMPTS = 2          # two prompts: the smallest batch in which one request can read another's row
MAX_TOKENS = 16
# Stock vLLM 0.32's behaviour for this defect: the gate off, vLLM's own step loop (the kit's pp_microbatches off:
# with it the drafts come back only with the step's tokens and nothing is left to break), and the decode-side rule
# off (it would refuse this engine before it starts).
BROKEN = "all,-pp_spec_schedule_gate,-pp_microbatches,-decode_side_pp_spec_rule"
FIXED = "all,-pp_microbatches"   # the same loop with the gate on: one patch differs from BROKEN

# %%
import kit.lab.notebook
kit.lab.notebook.setup()
from IPython.display import Markdown, display
from kit.lab.notebook import claim
from kit.core.topology import Topology
from kit.checks.compare import load_prompts
from kit import engine

topo = Topology(model=MODEL, pp=PP, spec=SPEC)
prompts = load_prompts(limit=NUM_PROMPTS)

# %% [markdown]
# ## 1. The symptom, and is it a tie?
# Two engines: the reference (PP=1, no speculation, greedy, float32, with each token's top-2 log-probabilities) and
# the suspect topology with `BROKEN`'s patches. `first_divergence` names the first prompt and position where the
# tokens differ, and the reference's **margin** there: its top-1 minus top-2 log-probability. Two correct engines
# can differ where the two best tokens are nearly tied (a different summation order flips them); they cannot
# differ where one token leads by a wide margin.
#
# **Predict, then run:** if the suspect engine is wrong only through float rounding, what margin do you expect at
# its first divergence: near 0, or several nats?

# %%
# about 40 s on 2 cores: the reference and the traced suspect engine
from kit.checks.placement import traced_placement
from kit.engine.result import first_divergence
from kit.lab import tokens_view
from kit.worker import steptrace

reference = engine.generate(topo.with_(pp=1, spec=None), prompts, max_tokens=MAX_TOKENS, top2=True)
# The suspect engine generates with every step traced inside each worker (kit.worker.steptrace): section 3 reads it.
broken_run = traced_placement(topo, prompts, max_tokens=MAX_TOKENS, env={"KIT_PATCHES": BROKEN})
broken = broken_run["generation"]
fd = first_divergence(reference, broken)
tok = tokens_view.load_tokenizer(MODEL)
say = lambda t: tokens_view.describe_token(tok, t)  # noqa: E731
n_tokens = sum(map(len, reference.token_ids))
n_wrong = sum(a != b for r, g in zip(reference.token_ids, broken.token_ids) for a, b in zip(r, g))
print(f"{topo.label()} with {BROKEN}: {n_wrong} of {n_tokens} tokens differ from the reference")
if fd:
    print(f"first divergence: prompt {fd['prompt_index']}, position {fd['position']}: expected {say(fd['expected'])}, "
          f"got {say(fd['got'])}; reference margin {fd['reference_margin']:.2f} nats")

# %%
claim(fd is not None, f"the suspect engine differs from the reference ({n_wrong} of {n_tokens} tokens)", fd)
claim(fd["reference_margin"] is not None and fd["reference_margin"] > 0.1,
      f"at the first divergence the reference's top token leads by {fd['reference_margin']:.2f} nats "
      "(more than 0.1): not a tie", fd)

# %% [markdown]
# **What it shows:** the reference's choice at that position was not close. In float32 a different summation order
# moves a log-probability by far less than 0.01 nats, so a lead of more than 0.1 is not lost to rounding: the
# suspect engine computed something else. A margin near 0 would have sent us to numerics instead (dtype, kernel,
# summation order); here it rules them out. (A small margin is no proof of a tie either: a bug can strike where
# the reference was unsure.)

# %% [markdown]
# ## 2. Which part of the topology?
# The suspect topology combines two things: PP=2 and MTP drafts. Run each alone with the same patches: PP=1 with
# MTP, and PP=2 without drafts.
#
# **Predict, then run:** which of the two is wrong?
#
# <details><summary>Answer</summary>
#
# Neither. PP=1 + MTP has no second stage, so no step is ever in flight when the next is planned; PP=2 without
# drafts has steps in flight, but a request in flight has no new token and is skipped. Only the combination
# breaks: a request in flight that *has* drafts.
# </details>

# %%
# about 30 s on 2 cores: two engines, one part of the topology each
alone = {}
for label, t in (("PP=1 + " + SPEC, topo.with_(pp=1)), (f"PP={PP}, no drafts", topo.with_(spec=None))):
    g = engine.generate(t, prompts, max_tokens=MAX_TOKENS, env={"KIT_PATCHES": BROKEN})
    alone[label] = first_divergence(reference, g)
    print(f"{label:18s}: " + ("identical to the reference" if alone[label] is None else f"differs: {alone[label]}"))

# %%
claim(all(v is None for v in alone.values()),
      f"with the same patches, {' and '.join(alone)} each give the reference's tokens: only the combination fails",
      alone)

# %% [markdown]
# ## 3. The step trace: a request in two adjacent steps
# Under PP vLLM's engine core keeps up to PP steps in flight: it plans step s + 1 before step s's output is back.
# A request in step s is therefore still in flight when step s + 1 is planned, and it must not ride in it. The trace
# recorded, on every rank, each step's requests with the tokens scheduled for each and the drafts among them.
# `kit.checks.inflight.rides` lists every decode step that carries a request the step just before it carried.
#
# **Predict, then run:** a request in its normal decode step is scheduled 1 + k tokens: its newest sampled token
# and k = 2 drafts. How many tokens do you expect for a request that rides in the step right after its own?
#
# <details><summary>Answer</summary>
#
# k: its drafts alone. The token they follow is the one its previous step is still computing, so the scheduler has
# nothing to put in front of them. The table below lists the steps; the claim under it checks the first.
# </details>

# %%
from kit.checks import inflight

trace_broken = steptrace.merge(broken_run["trace"])
names = inflight.request_names(trace_broken, len(prompts))   # prompt i -> its request's name in the trace
r_broken = inflight.rides(trace_broken)
rows = "\n".join(f"| {r['step']} | {r['req']} (prompt {names.index(r['req'])}) | {r['tokens']} | {r['drafts']} | "
                 f"{', '.join(r['others']) or 'none'} |" for r in r_broken[:12])
display(Markdown(f"**{len(r_broken)} steps** carried a request that was in the step before (first 12):\n\n"
                 "| step | request | tokens scheduled | of them drafts | other requests in the step |\n"
                 f"|---|---|---|---|---|\n{rows}"))

# %%
first = r_broken[0] if r_broken else None
claim(first is not None and first["tokens"] == first["drafts"],
      f"with the gate off {len(r_broken)} steps carried a request still in flight; the first of them, step "
      f"{first and first['step']}, scheduled {first and first['req']}'s {first and first['drafts']} drafts alone "
      "(tokens scheduled = drafts: no sampled token in front)", r_broken[:4])

# %% [markdown]
# **What it shows:** right after the prefill, the step that should have been empty (both requests in flight)
# carries both again, each with only its k drafts (and the step after it sends one token for two drafts: the same
# miscount, compounded). The engine core stored the drafts the prefill's MTP pass made
# before it processed the prefill's sampled token, so the scheduler saw k new tokens and planned them; the token
# they follow was still on its way. From then on every step carries both requests: none is ever skipped, so both
# are always in flight when the next step is planned.

# %% [markdown]
# ## 4. From the wrong token to the step that wrote it, and the row it read
# The last rank's sample events say how many tokens each step wrote for each request (1 + the drafts accepted), so
# every output position maps to the step that wrote it (`inflight.written_by`). The trace also recorded, for each
# request in a verify step, which rows of the step's hidden states it owns (the tokens it was sent) and which rows
# its logits were read from: vLLM computes those from the tokens each request *should* have, 1 + k of them,
# counting back from the end of its own rows.
#
# **Predict, then run:** a request sent only its 2 drafts owns 2 rows but needs 3 logits. Counting 3 back from the
# end of its own rows, where does its first logit come from?
#
# <details><summary>Answer</summary>
#
# From the row in front of its own: the previous request's last row, or, for the first request in the batch,
# index −1, which wraps to the last row of the batch (the last request's). The cell below prints the rows.
# </details>

# %%
i, pos = fd["prompt_index"], fd["position"]
req = names[i]
wrote = inflight.written_by(trace_broken, req)
step = wrote[pos] if pos < len(wrote) else None
ride_steps = {r["step"] for r in r_broken if r["req"] == req}
read = inflight.rows_read(trace_broken, req, step) if step is not None else None
print(f"prompt {i} is request {req}; its token at position {pos} was written by step {step}")
if read:
    print(f"in step {step}, {req} owns rows {read['own'][0]}..{read['own'][1] - 1} and its logits were read from "
          f"rows {read['read']}, owned by {read['owners']}")
from kit.lab.rows_plot import rows_figure
sample = steptrace.steps(trace_broken)[step]["sample"]
rows_figure(sample["rows"], labels={r: f"{r} (prompt {names.index(r)})" for r in sample["rows"]},
            title=f"Step {step} on the last rank, gate off: the rows each request owns (band) and reads its logits "
                  "from (dots; ringed: another request's row)").show()
tokens_view.show(tokens_view.divergence_html(reference.token_ids, broken.token_ids, tok, prompts=prompts,
                                             labels=("reference", "gate off")))

# %%
other = [o for o in (read or {}).get("owners", []) if o != req]
claim(step is not None and step in ride_steps,
      f"the first wrong token (prompt {i}, position {pos}) was written by step {step}, a step that carried "
      f"{req} while it was in flight", (step, sorted(ride_steps)))
claim(bool(other),
      f"in that step {req}'s first logit was read from row {read and read['read'][0]}, a row of {other[:1]}: "
      "the token came from the other request's hidden state", read)

# %% [markdown]
# **What it shows:** the request owns 2 rows but 3 logits are read for it, counted back from the end of its rows, so
# the first lands one row in front of them: for the first request in the batch that index is −1, which wraps to
# the batch's last row, the other request's. The token sampled from it is what the model predicts after the
# *other* prompt's drafts, written into this prompt's output: the wrong token at the first divergence. (A
# request later in the batch reads its neighbour's last row the same way.) With one request alone the indices run off the
# front of its rows: stock vLLM then fails with `IndexError: index -2 is out of bounds`.

# %% [markdown]
# ## 5. The patch, and the run that proves it
# The kit's registry says what the patch changes, why, and when it can go (`kit patches` prints the same for every
# patch; docs/patches.md is generated from it). The engine below is the suspect one with that one patch turned
# back on (`FIXED`), traced the same way.

# %%
from kit.patches import registry
p = registry()["pp_spec_schedule_gate"]
display(Markdown(f"**`{p.name}`**: {p.summary}\n\n*Why:* {p.why}\n\n*Upstream:* {p.upstream}\n\n"
                 f"*Removal:* {p.removal}"))

# %%
# about 20 s on 2 cores: one traced engine, the gate on
fixed_run = traced_placement(topo, prompts, max_tokens=MAX_TOKENS, env={"KIT_PATCHES": FIXED})
trace_fixed = steptrace.merge(fixed_run["trace"])
r_fixed = inflight.rides(trace_fixed)
fd_fixed = first_divergence(reference, fixed_run["generation"])
print(f"gate on: {len(r_fixed)} steps carried a request in flight; first divergence: {fd_fixed}; "
      f"drafts accepted {fixed_run['generation'].spec.num_accepted_tokens}")

# %%
from kit.lab.pipeline_plots import decode_left_ms, pipeline_lanes
runs = {"gate off (stock vLLM 0.32)": trace_broken, "gate on (pp_spec_schedule_gate)": trace_fixed}
span_ms = min([60.0] + [left for left in map(decode_left_ms, runs.values()) if left])
pipeline_lanes(runs, PP, span_ms=span_ms,
               title=f"{topo.label()}: {span_ms:.0f} ms of decoding with the gate off and on "
                     "(one colour per set of requests in a step)").update_layout(meta="main").show()

# %% [markdown]
# **What it shows:** both requests share every computed step in both runs (one colour). With the gate off rank 0
# starts a step as soon as the one before it is sampled, with both requests again although the step before carried
# them (they were in flight): no step is ever empty. With the gate on every second step is empty (outlined): both
# requests are in flight when it is planned, so it goes out with nothing in it. Same engine, same loop, one patch
# apart. The gate-on run computes half as many steps in the same time: the empty steps are what vLLM's own loop
# costs here, and the kit's `pp_microbatches` (on by default) fills them with a second micro-batch (notebook 01).

# %%
claim(fd_fixed is None and len(r_fixed) == 0,
      "with pp_spec_schedule_gate on, no step carries a request in flight and the tokens equal the reference's",
      (fd_fixed, r_fixed[:4]))

# %% [markdown]
# **Takeaway:** a wrong token with a wide reference margin is a bug, not a tie; topologies that differ in one part
# locate it; the step trace shows the request planned again while in flight, with its drafts and no sampled token;
# the wrong token is the other request's, read from its row; `pp_spec_schedule_gate` hides such a request's drafts
# until its step is back, and the tokens match.
#
# **Try it:** set `SPEC = "mtp:1"`, or `NUM_PROMPTS = 3`, and predict the rows each request reads in the first
# step after the prefill before you run it.

# %%
display(kit.lab.notebook.where_next("06"))
