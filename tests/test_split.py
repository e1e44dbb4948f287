"""kit.bench.split: the layer split that balances the PP stages, predicted from a traced run's stage costs."""
import pytest

from kit.bench.split import balanced_partition, even_partition, split_lines, stage_model


@pytest.mark.parametrize("layers, pp", [(8, 2), (9, 2), (8, 4), (10, 4), (11, 4), (4, 4), (61, 4), (7, 3)])
def test_the_even_split_is_vllms_own(layers, pp, monkeypatch):
    from vllm.distributed.utils import get_pp_indices

    monkeypatch.delenv("VLLM_PP_LAYER_PARTITION", raising=False)
    assert even_partition(layers, pp) == tuple(e - s for s, e in (get_pp_indices(layers, r, pp) for r in range(pp)))


def test_a_drafting_last_stage_gets_fewer_layers():
    # 4 + 4 layers at 1.65 ms each; the last stage also samples and drafts (+3.6 ms).
    per_layer, extra = stage_model([6.6, 10.2], (4, 4))
    assert per_layer == pytest.approx(1.65) and extra == pytest.approx([0.0, 3.6])
    best, cost = balanced_partition([6.6, 10.2], (4, 4))
    assert best == (5, 3) and cost == pytest.approx([8.25, 8.55])
    assert balanced_partition([6.0, 6.1], (4, 4))[0] == (4, 4)     # balanced already: no move for 0.1 ms
    best, cost = balanced_partition([2.0, 2.0, 2.0, 6.0], (2, 2, 2, 2))  # PP=4: one layer left on the last stage
    assert best[-1] == 1 and sum(best) == 8 and max(cost) == pytest.approx(5.0)


def _rec(label, pp, busy, batch=8):
    return {"model": "m", "topology": f"{label} b{batch}", "pp": pp, "spec": "mtp:2", "batch": batch,
            "timeline": {"stages": [{"busy": b / 1e3} for b in busy]}}


def test_the_split_paragraph_predicts_from_the_even_rows_and_shows_the_split_rows():
    recs = [_rec("pp2 mtp:2", 2, [6.6, 10.2]), _rec("pp2 mtp:2", 2, [6.8, 10.4]), _rec("pp2 mtp:2", 2, [6.4, 10.0]),
            _rec("pp2 mtp:2 [layers 5-3]", 2, [8.1, 8.9]), _rec("pp2 mtp:2 [off]", 2, [1.0, 9.0]),
            _rec("pp1 mtp:2", 1, [12.0])]
    lines = split_lines(recs, {"m": 8})
    assert lines[-1] == "| m pp2 mtp:2 b8 | 4-4: 6.60 / 10.20 | 5-3: 8.25 / 8.55 | 8.10 / 8.90 |"
    assert split_lines(recs[:1], {"m": 8})[-1].endswith("| 5-3: 8.25 / 8.55 | not run |")
    assert split_lines([recs[-1]], {"m": 8}) == []
    assert split_lines([_rec("pp2 none", 2, [6.0, 6.1])], {"m": 8})[-1].endswith("| 4-4: 6.00 / 6.10 | (the even split) |")
