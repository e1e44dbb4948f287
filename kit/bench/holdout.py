"""Held-out predictions of the payoff model: fit the step costs on some rows, predict the others.

:func:`kit.bench.payoff.predict` fits each (model, PP, batch) group on all of its rows and its "prediction at
occupancy" takes the row's own step count, so it cannot fail by much. Here each named split fits only its fit rows
and predicts the decode speed-up of speculation over no speculation for its held-out rows from:

- the fitted step costs (:class:`kit.bench.payoff.Costs`), fitted without the held-out row;
- the held-out row's model, PP size, batch and k, and its measured mean acceptance length: acceptance is an input
  the user sets (how well the drafter predicts these prompts), not something the model predicts;
- the occupancy of its speculative steps predicted from the schedule (:func:`schedule_occupancy`), never read
  from the row.

Nothing else of a held-out row reaches the predictor (:func:`blind` keeps only those fields): not its step
period, forward, drafter time, step count or speed. Its group's no-speculation row is always a fit row: it is the
baseline the speed-up is measured against and gives the plain step T(0).

Where the held-out row's group keeps speculative fit rows (the k splits), the costs are that group's fit
(:func:`kit.bench.payoff.fit_costs`). Otherwise (the batch and model splits) they are carried over from a source
group with speculative fit rows, same PP size, by :func:`transfer`. Pure functions: nothing here starts an engine.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Callable

from kit.bench.payoff import TOLERANCE as BAND
from kit.bench.payoff import Costs, fit_costs, occupancy
# The only fields of a held-out row the predictor sees.
BLIND_FIELDS = ("model", "pp", "batch", "k", "tokens_per_forward")


@dataclass(frozen=True)
class Split:
    """A named split: ``held(row)`` says which speculative rows are predicted; every other row may be fitted.
    ``source``: where a held-out row's costs may come from: ``"group"`` its own (model, PP, batch) group's fit
    rows, ``"batch"`` the same model and PP at another batch, ``"model"`` another model at the same PP and batch."""

    name: str
    held: Callable[[dict], bool]
    source: str = "group"


def splits_for(rows: list[dict]) -> list[Split]:
    """The splits the rows allow: per k (fit k <= K, predict the larger k), per batch (fit the smallest batch,
    predict the others) and per ordered pair of models (fit one, predict the other's speculative rows)."""
    spec = [r for r in rows if r["k"] > 0]
    ks, batches = sorted({r["k"] for r in spec}), sorted({r["batch"] for r in spec})
    models = list(dict.fromkeys(r["model"] for r in rows))
    out = []
    for kk in ks[:-1]:
        # Only groups that keep a speculative row to fit (a group measured at larger k only has nothing to extend).
        kept = {(r["model"], r["pp"], r["batch"]) for r in spec if r["k"] <= kk}
        bigger = ",".join(str(k) for k in ks if k > kk)
        out.append(Split(f"fit k<={kk} -> predict k={bigger}",
                         lambda r, kk=kk, kept=kept: r["k"] > kk and (r["model"], r["pp"], r["batch"]) in kept))
    if len(batches) > 1:
        b0 = batches[0]
        out.append(Split(f"fit batch {b0} -> predict batch {','.join(map(str, batches[1:]))}",
                         lambda r, b0=b0: r["k"] > 0 and r["batch"] != b0, "batch"))
    for a in models:
        for b in models:
            if a != b:
                out.append(Split(f"fit {a} -> predict {b}", lambda r, b=b: r["k"] > 0 and r["model"] == b, "model"))
    return out


def schedule_occupancy(pp: int, batch: int, k: int, microbatches: bool = True) -> float:
    """The predicted occupancy of speculative decode steps (1 = every step carries the plain engine's requests).

    PP = 1, batch 1 or no drafts: 1. On the kit's default schedule (``pp_microbatches``) the running requests
    split into ``min(PP, batch)`` groups that take turns with and without drafts alike, so a speculative step
    carries as many requests as a plain one: 1. With ``pp_microbatches`` off (``microbatches=False``: vLLM's own
    loop with the scheduling gate ``pp_spec_schedule_gate``) only the speculative batch splits (a request sits out
    the step after its own while that one is in flight), the plain one rides whole in every step: each
    speculative step carries ``1 / min(PP, batch)`` of the batch. It ignores the tail of a group whose requests
    finish at different steps, and a group that never split.
    """
    if k == 0 or pp <= 1 or batch <= 1 or microbatches:
        return 1.0
    return 1.0 / min(pp, batch)


def microbatches_on(row: dict) -> bool:
    """Whether a row ran with ``pp_microbatches`` selected: its ``kit_patches`` (the run's ``KIT_PATCHES``, saved by
    ``kit bench`` for a ``--variant`` that sets it) or, without one, the default selection."""
    from kit.patches import selected_names

    return "pp_microbatches" in selected_names(row.get("kit_patches") or "all")


def blind(row: dict) -> dict:
    """What the predictor may read of a held-out row: :data:`BLIND_FIELDS`, nothing measured but acceptance, and
    its configuration's schedule (``microbatches``: whether ``pp_microbatches`` was selected)."""
    return {**{f: row[f] for f in BLIND_FIELDS}, "microbatches": microbatches_on(row)}


def transfer(source: Costs, source_plain: dict, target_plain: dict, batch: int, pp: int,
             layers: tuple[int, int] = (1, 1)) -> Costs:
    """Carry a fitted source group's costs over to a target group of which only the no-spec row is known.

    ``source_plain``/``target_plain``: the no-spec rows' step components (``forward_s``, ``period_s``);
    ``layers``: (source, target) decoder layer counts. The rules, each stated so the held-out error can refute it:
    the target's forward grows with tokens as the source's fit does, scaled through its own plain forward
    (``f_T(n) = f_T(B) * f_S(n) / f_S(B)``); the drafter (one layer of the target's kind) costs the source's
    drafter times the ratio of the plain forwards per layer (a larger batch or a wider layer costs the drafter what
    it costs a target layer); a speculative step's fixed cost exceeds the plain one by the source's excess.
    """
    f0 = target_plain["forward_s"]
    at_b = source.forward_s(batch)
    if at_b <= 0:
        raise ValueError("the source's forward fit is not positive at the target's batch")
    scale = f0 / at_b
    per_layer = (f0 / layers[1]) / (source_plain["forward_s"] / layers[0])
    fixed0 = target_plain["period_s"] - f0
    return Costs(fixed_nospec_s=fixed0, fixed_spec_s=fixed0 + source.fixed_spec_s - source.fixed_nospec_s,
                 forward_base_s=source.forward_base_s * scale, forward_per_token_s=source.forward_per_token_s * scale,
                 draft_base_s=source.draft_base_s * per_layer, draft_per_token_s=source.draft_per_token_s * per_layer,
                 batch=batch, pp=pp)


def _groups(rows: list[dict]) -> dict[tuple, dict[int, dict]]:
    out: dict[tuple, dict[int, dict]] = {}
    for r in rows:
        out.setdefault((r["model"], r["pp"], r["batch"]), {})[r["k"]] = r
    return out


def _source(fit: dict[tuple, dict[int, dict]], target: tuple, kind: str) -> tuple | None:
    """The fit group to carry costs from (``kind`` as :class:`Split`'s ``source``): same PP, a no-spec and a
    speculative row; for ``"batch"`` the same model at the nearest batch, for ``"model"`` another model at the
    same batch."""
    model, pp, batch = target
    cands = [g for g, by_k in fit.items() if g[1] == pp and g != target and 0 in by_k and len(by_k) > 1
             and ((kind == "batch" and g[0] == model) or (kind == "model" and g[0] != model and g[2] == batch))]
    return min(cands, key=lambda g: (abs(g[2] - batch), g[2], g[0]), default=None)


def predict_held(fit_rows: list[dict], held: dict, layers: dict[str, int] | None = None,
                 kind: str = "group") -> dict:
    """One held-out row's prediction from ``fit_rows`` and ``held`` (already :func:`blind`).

    Returns ``predicted`` (full-step speed-up x predicted occupancy), ``predicted_full``, ``occupancy``
    (predicted), ``source`` (the group whose speculative rows were fitted) and ``costs``. ``kind``: where the
    costs may come from (:class:`Split`'s ``source``). Raises ``LookupError`` when the fit rows cannot give this
    row's costs (no no-spec row in its group, no source group, unknown layer counts)."""
    fit = _groups(fit_rows)
    target = (held["model"], held["pp"], held["batch"])
    by_k = fit.get(target, {})
    if 0 not in by_k:
        raise LookupError(f"no no-spec row for {target}")
    if kind == "group":
        if len(by_k) < 2:
            raise LookupError("no speculative fit row in its group")
        costs, source = fit_costs({k: r["components"] for k, r in by_k.items()}, batch=held["batch"], pp=held["pp"]), target
    else:
        source = _source(fit, target, kind)
        if source is None:
            raise LookupError("no fit group with speculative rows to carry the costs from")
        src = fit[source]
        fitted = fit_costs({k: r["components"] for k, r in src.items()}, batch=source[2], pp=source[1])
        lay = (1, 1) if source[0] == target[0] else ((layers or {}).get(source[0]), (layers or {}).get(target[0]))
        if None in lay:
            raise LookupError(f"layer counts of {source[0]} and {target[0]} unknown")
        costs = transfer(fitted, src[0]["components"], by_k[0]["components"], held["batch"], held["pp"], lay)
    full = costs.speedup_at_length(held["tokens_per_forward"], held["k"])
    occ = schedule_occupancy(held["pp"], held["batch"], held["k"], held.get("microbatches", True))
    return {"predicted": full * occ, "predicted_full": full, "occupancy": occ, "source": source, "costs": costs}


def evaluate(rows: list[dict], splits: list[Split] | None = None, layers: dict[str, int] | None = None) -> list[dict]:
    """Every split's held-out predictions against the measurements.

    ``rows``: as :func:`kit.bench.payoff.predict` takes them (``model``, ``pp``, ``batch``, ``k``,
    ``decode_tok_s``, ``tokens_per_forward``, ``components``), optionally ``label`` and ``interval`` (the measured
    speed-up's (lo, hi)). ``layers``: decoder layers per model (for the model splits). Per split: ``name``,
    ``fit`` (the fit rows' count), ``rows`` (per held-out row: ``measured``, ``interval``, ``predicted``,
    ``error`` = predicted / measured - 1, ...), ``skipped`` (held-out rows that could not be predicted, and why),
    ``mean_abs_error`` and ``max_abs_error`` (``None`` without rows).
    """
    rows = [r for r in rows if r.get("components") is not None]
    plain = {(r["model"], r["pp"], r["batch"]): r for r in rows if r["k"] == 0}
    out = []
    for split in splits if splits is not None else splits_for(rows):
        held = [r for r in rows if r["k"] > 0 and split.held(r)]
        fit_rows = [r for r in rows if not (r["k"] > 0 and split.held(r))]
        got, skipped = [], []
        for r in held:
            base = plain.get((r["model"], r["pp"], r["batch"]))
            try:
                if base is None:
                    raise LookupError("no no-spec row to measure against")
                p = predict_held(fit_rows, blind(r), layers, split.source)
            except (LookupError, ValueError) as e:
                skipped.append({"label": r.get("label") or _name(r), "why": str(e)})
                continue
            measured = r["decode_tok_s"] / base["decode_tok_s"]
            steps0, steps = base["components"].get("steps"), r["components"].get("steps")
            got.append({"label": r.get("label") or _name(r), "model": r["model"], "pp": r["pp"], "batch": r["batch"],
                        "k": r["k"], "tokens_per_forward": r["tokens_per_forward"], "measured": measured,
                        "interval": r.get("interval"), "error": p["predicted"] / measured - 1,
                        # Shown beside the prediction, never an input to it: how full the steps really were.
                        "occupancy_measured": occupancy(steps0, steps, r["tokens_per_forward"]) if steps0 and steps
                        else None,
                        **{key: p[key] for key in ("predicted", "predicted_full", "occupancy", "source")}})
        errs = [abs(g["error"]) for g in got]
        out.append({"name": split.name, "fit": len(fit_rows), "rows": got, "skipped": skipped,
                    "mean_abs_error": statistics.fmean(errs) if errs else None, "max_abs_error": max(errs, default=None)})
    return out


def _name(r: dict) -> str:
    return f"{r['model']} pp{r['pp']} k={r['k']} b{r['batch']}"


def inputs(rows: list[dict]) -> list[dict]:
    """The payoff rows :func:`evaluate` takes, from aggregated ``kit bench`` rows (:func:`kit.bench.table.aggregate`
    with step components), each with the bootstrap interval of its measured speed-up over no speculation
    (``interval``)."""
    from kit.bench.table import payoff_rows

    prows = payoff_rows(rows)
    by_label = {r["label"]: r for r in rows}
    for p in prows:
        # The speed-up table's interval when its baseline is the ratio measured here (the same no-spec row).
        sp = next((x for x in by_label[p["label"]].get("speedups") or [] if x["kind"] == "speculation"), None)
        p["interval"] = (sp["lo"], sp["hi"]) if sp else None
    return prows


def holdout_lines(rows: list[dict], layers: dict[str, int] | None = None) -> list[str]:
    """The ``--holdout`` tables from aggregated ``kit bench`` rows (:func:`kit.bench.table.aggregate` with step
    components): one table per split and a summary of the splits' errors."""
    prows = inputs(rows)
    if layers is None:
        layers = model_layers({p["model"] for p in prows})
    result = evaluate(prows, layers=layers)
    lines = ["", "Held-out predictions (kit.bench.holdout): each split fits the step costs on its fit rows only and "
             "predicts every held-out speculative row's decode speed-up over no speculation from the fitted costs, "
             "the row's model, PP, batch and k, its measured mean acceptance length (an input, as a user would set "
             "it) and an occupancy predicted from the schedule (1 at PP=1, at batch 1 and on the kit's default "
             "pipelined schedule, where plain and speculative batches split alike; 1/min(PP, batch) under PP with "
             "pp_microbatches off, where only the speculative batch splits); nothing else of the held-out row is "
             "read. Its group's no-spec row is a fit row (the baseline). fitted from: the group whose speculative "
             "rows gave the costs (another batch or model: carried over by kit.bench.holdout.transfer). The "
             "measured occupancy is shown, not used.", "",
             "| split | fit rows | held out | mean abs error | max abs error | within 15 % |", "|---|---|---|---|---|---|"]
    pct = lambda x: "-" if x is None else f"{100 * x:.0f} %"  # noqa: E731
    for s in result:
        inside = sum(abs(g["error"]) <= BAND for g in s["rows"])
        lines.append(f"| {s['name']} | {s['fit']} | {len(s['rows'])}" + (f" (+{len(s['skipped'])} not predictable)"
                     if s["skipped"] else "") + f" | {pct(s['mean_abs_error'])} | {pct(s['max_abs_error'])} "
                     f"| {inside} of {len(s['rows'])} |")
    for s in result:
        lines += ["", f"**{s['name']}** ({s['fit']} fit rows):", "",
                  "| held-out row | fitted from | mean accept len (input) | occupancy predicted (measured) "
                  "| predicted | measured [95 % interval] | error | inside interval |", "|---|---|---|---|---|---|---|---|"]
        for g in s["rows"]:
            src = "its own group" if g["source"] == (g["model"], g["pp"], g["batch"]) else \
                f"{g['source'][0]} pp{g['source'][1]} b{g['source'][2]}"
            iv = g["interval"]
            om = "-" if g["occupancy_measured"] is None else f"{g['occupancy_measured']:.2f}"
            lines.append(f"| {g['label']} | {src} | {g['tokens_per_forward']:.2f} | {g['occupancy']:.2f} ({om}) "
                         f"| {g['predicted']:.2f}x | {g['measured']:.2f}x"
                         + (f" [{iv[0]:.2f}–{iv[1]:.2f}]" if iv else "") + f" | {100 * g['error']:+.0f} % | "
                         + ("-" if not iv else "yes" if iv[0] <= g["predicted"] <= iv[1] else "no") + " |")
        for sk in s["skipped"]:
            lines.append(f"| {sk['label']} | not predictable: {sk['why']} | | | | | | |")
    return lines


def model_layers(models: set[str]) -> dict[str, int]:
    """Decoder layers per model name the kit knows (``data/models/``); unknown names are left out."""
    from kit.core.models import ModelError, resolve_model

    out = {}
    for m in models:
        try:
            out[m] = resolve_model(m).num_layers
        except (ModelError, KeyError, OSError):
            continue
    return out
