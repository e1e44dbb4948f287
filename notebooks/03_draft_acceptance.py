# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # How many drafts are accepted, per position, and does PP change that?
#
# **The question:** with the trained `tiny-mimo` (one MTP layer, trained to predict the token after next),
# how often is each draft position accepted for k = 1, 2, 3, and are the counts the same at PP=1 and PP=2?
# They must be: with greedy decoding, acceptance depends only on the model, not on how it is split.
#
# Words used here (verify round, acceptance rate, greedy reference, ...) are defined in the
# [Glossary](00_start_here.ipynb#Glossary) of notebook 00.
#
# About 2 minutes on 2 cores, nearly all of it in the first engine cell, which says so.

# %% tags=["parameters"]
MODEL = "tiny-mimo"
KS = [1, 2, 3]
PP_SIZES = [1, 2]
NUM_PROMPTS = 8
MAX_TOKENS = 48
SAMPLED_TEMPERATURES = [0.05, 0.3, 0.8]   # sampled on the largest-k engine of each PP size
PLAIN_PP_SIZES = [1]      # PP sizes that also run without drafts (k = 0); must include PP_SIZES[0]
ROUNDS_SHOWN = 8          # verify rounds shown token by token, per prompt

# %%
import kit
import kit.checks.compare
import kit.lab.notebook
kit.lab.notebook.setup()

# %% [markdown]
# One engine per (PP size, k), k = 0 being the plain engine (at the PP sizes in `PLAIN_PP_SIZES`), started one after
# the other. Each engine shows its status line.

# %%
# about 2 minutes on 2 cores: one engine per PP size and k, plus the plain ones
import time
from kit import engine
from kit.bench.payoff import expected_tokens
from kit.lab import plots
from kit.checks.compare import load_prompts
from kit.core.topology import Topology

from kit.checks import sampling

prompts = load_prompts(limit=NUM_PROMPTS)
greedy = {"kind": "generate", "prompts": prompts, "max_tokens": MAX_TOKENS}
results, sampled = {}, {}
plain_pps = [pp for pp in PP_SIZES if pp in PLAIN_PP_SIZES]
assert PP_SIZES[0] in plain_pps, "the first PP size's plain engine is the reference for every other run"
for pp in PP_SIZES:
    for k in ([0] if pp in plain_pps else []) + list(KS):
        topo = Topology(model=MODEL, pp=pp, spec=f"mtp:{k}" if k else None)
        # The largest-k engine of each PP size also samples the prompts at each temperature, with the kit's
        # acceptance probe on (no extra engine start): see "A sampled setting" below.
        if k == KS[-1]:
            jobs = sampling.sweep_jobs(prompts, SAMPLED_TEMPERATURES, max_tokens=MAX_TOKENS)
            if pp == PP_SIZES[0]:
                # Its greedy job also runs with the probe's verify-round log on: see "Token by token" below.
                jobs = [{"kind": "rpc", "method": "kit_probe_start_log"}, jobs[0],
                        {"kind": "rpc", "method": "kit_probe_read"}] + jobs[1:]
            jr = engine.run(topo, jobs)["jobs"]
            if pp == PP_SIZES[0]:
                round_log = [e for rank in jr[2] for e in rank.get("log", {}).get("rounds", [])]
                log_dropped = sum(rank.get("log", {}).get("dropped", 0) for rank in jr[2])
                jr = [jr[1]] + jr[3:]   # the sweep's own jobs, as parse_sweep reads them
            for t, r in zip(SAMPLED_TEMPERATURES, sampling.parse_sweep(topo, SAMPLED_TEMPERATURES, jr)):
                sampled[(pp, t)] = r
        else:
            jr = engine.run(topo, [greedy])["jobs"]
        results[(pp, k)] = engine.GenerationResult.from_dict(jr[0])
rows = []
for (pp, k), r in results.items():
    s = r.spec
    rows.append({"PP": pp, "k": k, "drafts": s.num_drafts, "accepted": s.num_accepted_tokens,
                 "per_position": s.per_position, "mean_acceptance_length": round(s.mean_acceptance_length, 2) if k else None,
                 "tokens/s": round(r.num_generated / r.seconds, 1)})
import pandas as pd
display(pd.DataFrame(rows))

# %%
rates = {(pp, k): results[(pp, k)].spec.per_position_rate for pp in PP_SIZES for k in KS}
plots.acceptance_panels(rates, KS, PP_SIZES, title="Accepted drafts / verify rounds, per draft position "
                        f"(PP={PP_SIZES[0]} bars, other PP sizes as markers)").show()
cond = {(pp, k): plots.conditional_rates(results[(pp, k)].spec.per_position, results[(pp, k)].spec.num_drafts)
        for pp in PP_SIZES for k in KS}
plots.acceptance_panels(cond, KS, PP_SIZES, title="Acceptance at position i given positions 1..i-1 were accepted").show()

def direction(xs):
    steps = [round(b, 2) - round(a, 2) for a, b in zip(xs, xs[1:])]  # as printed: two decimals
    if all(d > 0 for d in steps):
        return "rises with depth"
    if all(d < 0 for d in steps):
        return "falls with depth"
    if all(d == 0 for d in steps):
        return "stays flat"
    if all(d >= 0 for d in steps):
        return "rises, then stays flat"
    if all(d <= 0 for d in steps):
        return "falls, then stays flat"
    return "goes up and down with depth"

from IPython.display import Markdown
deep = [k for k in KS if k > 1]
display(Markdown("**This run, bottom panels** (PP=" + str(PP_SIZES[0]) + "): " + ("; ".join(
    f"k={k}: {' -> '.join(f'{x:.2f}' for x in cond[(PP_SIZES[0], k)])}, the conditional rate "
    f"{direction(cond[(PP_SIZES[0], k)])}" for k in deep) if deep else "no k above 1, so no depth to compare") + "."))
from kit.lab.notebook import claim
claim(all(b <= a for r in rates.values() for a, b in zip(r, r[1:])),
      "top panels: the unconditional rate never rises with depth (a draft counts only after its whole prefix)",
      {str(key): r for key, r in rates.items()})

# %% [markdown]
# **What it shows:** the top picture divides the rounds whose draft at position i was accepted by all verify rounds.
# A draft at position i only counts when all before it were accepted, so this rate cannot rise with depth: position 1
# (the MTP head's own prediction) is accepted most often by construction. The bottom picture divides by the rounds
# that got that far: how good the head is at depth i, re-using its own guesses, once it got there. That rate may rise
# or fall with depth; the line under the pictures says which way it went in this run. In every panel the markers of
# the other PP sizes sit on the PP=1 bars: the split does not change acceptance.
# Wall-clock tokens/s on 2 CPU cores is honest but not flattering: on a model this small the drafter's forward and
# the extra verification positions can eat much, or all, of what they save. How much, in this run:

# %%
from IPython.display import Markdown
speed = {(pp, k): results[(pp, k)].num_generated / results[(pp, k)].seconds for (pp, k) in results}
lines = []
for pp in PP_SIZES:
    base = speed.get((pp, 0))
    per_k = ", ".join(f"k={k}: {speed[(pp, k)]:.1f} (" + (f"{speed[(pp, k)] / base:.2f}x, " if base else "")
                      + f"{results[(pp, k)].spec.mean_acceptance_length:.2f} tokens per target forward)" for k in KS)
    lines.append(f"- PP={pp}: " + (f"without drafts {base:.1f} tokens/s; " if base else "") + per_k)
display(Markdown(f"**This run** ({NUM_PROMPTS} prompts x {MAX_TOKENS} tokens, generation time only, engine start "
                 "excluded), tokens/s:\n" + "\n".join(lines)))

# %% [markdown]
# ## Tokens per verify round: measured against the textbook curve
# If every draft were accepted with one probability *a*, independently of its depth, a round with k drafts would
# yield (1 - a^(k+1)) / (1 - a) tokens. Below: that curve with *a* = the position-1 rate measured at the smallest k,
# and the mean acceptance length measured at each k. Points above the curve mean deeper drafts were accepted more
# often than that single rate predicts, points below it less often (the conditional rates above say which).

# %%
a = cond[(PP_SIZES[0], KS[0])][0]
measured = {pp: {k: results[(pp, k)].spec.mean_acceptance_length for k in KS} for pp in PP_SIZES}
plots.acceptance_length_vs_k(measured, a, KS, title=f"{MODEL}: tokens per target forward vs k").show()
for k in KS:
    print(f"k={k}: measured {measured[PP_SIZES[0]][k]:.2f}, curve {expected_tokens(a, k):.2f}, "
          f"from this k's conditional rates {expected_tokens(cond[(PP_SIZES[0], k)], k):.2f}")

# %% [markdown]
# **Try it (no engine starts):** move k and *a*; the first line uses the conditional rates measured at the largest k,
# the second one rate *a* for every position. The lines at the sliders' starting values are printed first, as plain
# output (what the HTML report shows); the sliders print the new values under themselves.

# %%
import ipywidgets as W
c_meas = cond[(PP_SIZES[0], KS[-1])]
def tokens_per_round(k=len(c_meas), a=round(a, 2)):
    print(f"k={k}: measured conditional rates {[round(x, 2) for x in c_meas[:k]]} -> "
          f"{expected_tokens(c_meas, k):.2f} tokens per round")
    print(f"k={k}: one rate a={a:.2f} for every position      -> {expected_tokens(a, k):.2f} tokens per round")
kit.lab.notebook.interact_static(tokens_per_round, note="Above: the starting values. Move a slider to print the new ones here.",
                                 k=W.IntSlider(value=len(c_meas), min=1, max=len(c_meas), description="k"),
                                 a=W.FloatSlider(value=round(a, 2), min=0.0, max=0.99, step=0.01, description="a"));

# %% [markdown]
# **Predict, then run:** with one acceptance rate a = 0.8, how many tokens does a round with k = 4 drafts yield,
# and how many would k = 40 yield? (Think about the limit as k grows.)
#
# <details><summary>Answer</summary>
#
# (1 - 0.8^5) / 0.2 = 3.36 tokens; as k grows the sum tends to 1 / (1 - a) = 5: past a few drafts, more drafts
# buy almost nothing, while each still costs a drafter forward and a verify position. The cell below checks it.
# </details>

# %%
from kit.lab.notebook import claim
claim(abs(expected_tokens(0.8, 4) - 3.3616) < 1e-9 and abs(expected_tokens(0.8, 40) - 5.0) < 1e-3,
      f"a=0.8: {expected_tokens(0.8, 4):.2f} tokens at k=4, {expected_tokens(0.8, 40):.3f} at k=40, "
      "tending to 1/(1-a) = 5")

# %%
for k in KS:
    a, b = results[(PP_SIZES[0], k)], results[(PP_SIZES[-1], k)]
    claim(a.token_ids == b.token_ids == results[(PP_SIZES[0], 0)].token_ids,
          f"k={k}: the same {a.num_generated} tokens at PP={PP_SIZES[0]}, PP={PP_SIZES[-1]} and without drafts")
    claim(a.spec == b.spec, f"k={k}: the same acceptance counts at PP={PP_SIZES[0]} and PP={PP_SIZES[-1]} "
          f"({a.spec.num_accepted_tokens} of {a.spec.num_draft_tokens} draft tokens, per position {a.spec.per_position})",
          f"{a.spec} vs {b.spec}")
r1 = results[(PP_SIZES[0], KS[0])].spec.per_position_rate[0]
claim(r1 >= 0.5, f"the trained MTP head's first draft is accepted in {r1:.2f} of rounds (at least half)")

# %% [markdown]
# ## Token by token: what each verify round did
# The counters above add up many verify rounds; here are single ones, from the same engine run (the first PP size's
# engine at the largest k, on the greedy prompts): the kit's acceptance probe logged, inside the worker that verifies
# the drafts, each request's drafts and the tokens each round wrote (`kit_probe_start_log`). One row per round, read
# left to right: **green** drafts the target accepted (each is the target's own greedy choice there), then the first
# draft it did not accept, **red and struck through**, followed by the target's own token in **blue** (its
# correction) and, faded, the drafts after it, which no longer count. When every draft was accepted the round ends
# with the target's **grey** bonus token instead. A round writes the green tokens and the blue or grey one: 1 to
# k + 1 tokens for one target forward. The grey text before each row is the end of what the request had before
# that round (spaces drawn as ·, line breaks as ↵).

# %%
from IPython.display import Markdown
from kit.lab import tokens_view
tok = tokens_view.load_tokenizer(MODEL)
k_log, pp_log = KS[-1], PP_SIZES[0]
logged = results[(pp_log, k_log)]
by_prompt = tokens_view.match_requests(round_log, logged.token_ids)
# The first prompt, and the one whose first rounds rejected the most drafts (a second look at rejections).
rejections = {i: sum(r.rejected is not None for r in rr.verify_rounds[:ROUNDS_SHOWN]) for i, rr in by_prompt.items()}
first = min(by_prompt)
shown = [first] + [i for i in sorted(rejections, key=lambda i: (-rejections[i], i)) if i != first][:1]
lines = []
for i in shown:
    rounds = by_prompt[i].verify_rounds
    part = rounds[:ROUNDS_SHOWN]
    tokens_view.show(tokens_view.rounds_html(
        part, tok, generated=logged.token_ids[i], prompt=logged.prompt_token_ids[i],
        title=f"prompt {i}: verify rounds 1 to {len(part)} of {len(rounds)} (PP={pp_log}, k={k_log}, greedy)"))
    c = tokens_view.round_counts(part)
    lines.append(f"- prompt {i}: its first {len(part)} verify rounds wrote generated tokens {part[0].position} to "
                 f"{part[-1].position + len(part[-1].output) - 1} ({c['tokens']} tokens for {len(part)} target "
                 f"forwards): {c['accepted']} of {c['drafts']} drafts accepted, then "
                 f"{tokens_view.count(c['corrections'], 'correction')} and "
                 f"{tokens_view.count(c['bonus'], 'bonus token')} from the target; the "
                 + ("token" if part[0].position == 1 else f"{part[0].position} tokens")
                 + " before them came from steps with no drafts to check (the prefill).")
display(Markdown("**This run:**\n" + "\n".join(lines)))

# %%
# The view is the run: each round shown is the generated tokens at the position the worker's input batch gave it,
# and the whole log counts what vLLM's own counters counted for this job.
spec = logged.spec
width = max(k_log, len(spec.per_position))
pad = lambda xs: list(xs) + [0] * (width - len(xs))  # noqa: E731
everything = [r for rr in by_prompt.values() for r in rr.rounds]
from_log = tokens_view.counters(everything)
from_log["per_position"] = pad(from_log["per_position"])
from_vllm = {"num_drafts": spec.num_drafts, "num_draft_tokens": spec.num_draft_tokens,
             "num_accepted_tokens": spec.num_accepted_tokens, "per_position": pad(spec.per_position)}
text = {i: all(r.output == logged.token_ids[i][r.position:r.position + len(r.output)]
               for r in by_prompt[i].verify_rounds[:ROUNDS_SHOWN]) for i in shown}
claim(sorted(by_prompt) == list(range(len(prompts))) and not log_dropped and all(text.values())
      and all(rr.positions_agree for rr in by_prompt.values()) and from_log == from_vllm,
      f"the rounds shown are prompt {' and '.join(map(str, shown))}'s generated tokens where the worker put them, and "
      f"the log's {from_log['num_drafts']} verify rounds of all {len(prompts)} requests count what vLLM counted: "
      f"{spec.num_accepted_tokens} of {spec.num_draft_tokens} draft tokens accepted, per position {spec.per_position}",
      {"log": from_log, "vllm": from_vllm, "matched": sorted(by_prompt), "dropped": log_dropped, "text": text,
       "positions_agree": {i: rr.positions_agree for i, rr in by_prompt.items()}})

# %% [markdown]
# ## A sampled setting: acceptance against theory
# With temperature T > 0 the target *samples* its token. Speculative sampling keeps a draft token d with
# probability p_T(d), the target's probability of d at temperature T (the MTP drafter proposes d without a
# probability of its own), and on rejection draws from the target with d removed: the output then follows the
# target's distribution exactly. So the expected number of accepted drafts is the sum of p_T(d) over the drafts,
# and the kit records that sum inside the worker that verifies them (`kit.worker.acceptance_probe`), next to what was
# accepted. As T grows the target spreads its probability and p_T(d) falls, even for a draft that is its argmax.
#
# **Predict first:** at T = 0.05 the target is almost one-hot on its argmax. Will acceptance at position 1 be close
# to the greedy rate, or close to zero? And at T = 0.8?
#
# <details><summary>Answer</summary>
#
# Close to the greedy rate: p_0.05(d) is about 1 when d is the argmax and about 0 otherwise, so the expected
# acceptance is the greedy agreement rate. At T = 0.8 it is the mean of p_0.8(d), lower the more the target spreads
# its probability away from its argmax. On vLLM 0.32's
# CPU build both were near zero before the kit's `cpu_rejection_expand` patch: each draft position's temperature
# was uninitialised memory (`docs/findings.md`). The next cells measure it and check it.
# </details>

# %%
points = {key: [p.to_dict() for p in r.positions] for key, r in sampled.items()}
g1 = results[(PP_SIZES[0], KS[-1])].spec.per_position_rate[0]
plots.sampled_vs_theory(points, greedy_rate=g1, title=f"{MODEL}, k={KS[-1]}: accepted / reached per draft "
                        "position, measured (markers, +-2 sd) and predicted from p_T(draft) (lines)").show()
rows = []
for (pp, t), r in sorted(sampled.items()):
    for p in r.positions:
        d = p.to_dict()
        rows.append({"PP": pp, "T": t, "position": p.position + 1, "reached": p.reached, "accepted": p.accepted,
                     "expected": d["expected"], "sd": d["sd"], "z": d["z"]})
display(pd.DataFrame(rows))

# %%
t_lo = min(SAMPLED_TEMPERATURES)
lows = {pp: sampled[(pp, t_lo)].positions[0] for pp in PP_SIZES}
lines = [f"- PP={pp}: at T={t_lo} position 1 accepted {p.accepted} of {p.reached} "
         f"({p.accepted / p.reached:.2f}) against {p.expected:.1f} expected; greedy rate {g1:.2f}" for pp, p in lows.items()]
hi = max(SAMPLED_TEMPERATURES)
rate1 = {(pp, t): sampled[(pp, t)].positions[0].accepted / (sampled[(pp, t)].positions[0].reached or 1)
         for pp in PP_SIZES for t in SAMPLED_TEMPERATURES}
lines += [f"- PP={pp}: at T={hi} position 1 accepted {sampled[(pp, hi)].positions[0].accepted} of "
          f"{sampled[(pp, hi)].positions[0].reached} ({rate1[(pp, hi)]:.2f}; "
          f"{sampled[(pp, hi)].measured_rate:.2f} over all positions): position-1 acceptance "
          f"{'fell' if rate1[(pp, hi)] < rate1[(pp, t_lo)] else 'did not fall'} from T={t_lo} to T={hi}"
          for pp in PP_SIZES]
display(Markdown("**This run:**\n" + "\n".join(lines)))

# %% [markdown]
# **What it shows:** the markers sit on their lines at every temperature, PP size and draft position: drafts are
# accepted as often as the target's probabilities say, so where acceptance falls at higher T (the lines above say
# whether it did here) that is the target spreading out, not a defect. At the lowest temperature position-1
# acceptance is the greedy rate (dotted).

# %%
from kit.lab.notebook import claim

for (pp, t), r in sorted(sampled.items()):
    claim(r.agrees, f"PP={pp}, T={t}: accepted drafts within {sampling.Z_LIMIT} sd of theory at every position",
          [p.to_dict() for p in r.positions])
for pp, p in lows.items():
    # p_T(d) ~ 1 for an argmax draft at a low T: acceptance is the greedy rate, up to 4 binomial sd.
    sd = (g1 * (1 - g1) / p.reached) ** 0.5
    claim(p.accepted / p.reached >= g1 - 4 * sd,
          f"PP={pp}, T={t_lo}: position-1 acceptance {p.accepted / p.reached:.2f} is the greedy rate {g1:.2f} "
          f"(within 4 sd = {4 * sd:.2f})")

# %% [markdown]
# **Takeaway:** acceptance belongs to the model and its drafter, not to the PP split: PP=1 and PP=2 accept the same
# drafts per position, and sampled drafts are accepted as often as the target's probabilities predict.

# %% [markdown]
# ## Try it yourself
# Pick k, PP, temperature and a prompt, then press Run (widgets; the defaults above run headless). Each press starts
# one engine; the button stays disabled meanwhile.
# Nothing starts until a press: above the controls, what the runs of this notebook already produced at their starting
# values (the HTML report has no live widgets, so that is what it shows).

# %%
import ipywidgets as W
from IPython.display import Pretty
k_w = W.IntSlider(value=2, min=1, max=4, description="k")
pp_w = W.Dropdown(options=[1, 2, 4], value=2, description="PP")
t_w = W.FloatSlider(value=0.0, min=0.0, max=1.5, step=0.1, description="temperature")
p_w = W.Textarea(value=prompts[0], description="prompt")
out = W.Output()
def _run(_):
    btn.disabled = True  # one engine at a time: the button comes back when this one has stopped
    try:
        with out:
            out.clear_output()
            r = engine.generate(Topology(model=MODEL, pp=pp_w.value, spec=f"mtp:{k_w.value}"), [p_w.value],
                                max_tokens=MAX_TOKENS, temperature=t_w.value, seed=0)
            print(r.texts[0]); print(r.spec)
    finally:
        btn.disabled = False
btn = W.Button(description="Run"); btn.on_click(_run)
# The static rendering of the starting values, from the greedy runs above: no engine starts here.
start = results.get((pp_w.value, k_w.value))
what = ("**Run** starts one engine with the values below and prints its text and acceptance counters under the "
        "button (live only).")
if start is not None and t_w.value == 0 and p_w.value == prompts[0]:
    display(Markdown(f"{what} At the starting values (k={k_w.value}, PP={pp_w.value}, temperature 0: greedy, the "
                     f"first prompt) the greedy run above at k={k_w.value}, PP={pp_w.value} generated this for that "
                     f"prompt, submitted together with the other {len(prompts) - 1}; the counters are that engine's, over "
                     f"all {len(prompts)} prompts:"))
    display(Pretty(f"{start.texts[0]}\n{start.spec}"))
else:
    display(Markdown(f"{what} No run above used its starting values (k={k_w.value}, PP={pp_w.value}, "
                     f"temperature {t_w.value}), so there is nothing to show until Run is pressed."))
display(W.VBox([k_w, pp_w, t_w, p_w, btn, out]))
# %%
display(kit.lab.notebook.where_next("03"))
