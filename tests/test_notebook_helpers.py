"""The arithmetic the notebooks draw from (no engine): acceptance rates and Eagle3 layer names per PP rank."""
import pytest

from kit import plots
from kit.placement import eagle3_layer_names


def test_conditional_rates_and_expected_length():
    assert plots.conditional_rates([8, 4, 1], 10) == [0.8, 0.5, 0.25]
    assert plots.conditional_rates([0, 0], 0) == [0.0, 0.0]
    assert plots.expected_length([0.8, 0.5, 0.25], 3) == pytest.approx(1 + 0.8 + 0.4 + 0.1)
    # With one rate: the geometric sum (1 - a^(k+1)) / (1 - a)
    for a in (0.3, 0.8):
        for k in range(5):
            assert plots.expected_length(a, k) == pytest.approx((1 - a ** (k + 1)) / (1 - a))


def test_eagle3_names_per_rank_follow_vllms_split():
    total = {pp: eagle3_layer_names(4, pp, "total") for pp in (1, 2, 3, 4)}
    per_rank = {pp: eagle3_layer_names(4, pp, "per_rank") for pp in (1, 2, 3, 4)}
    assert [r["target"] for r in per_rank[2]] == [["model.layers.0", "model.layers.1"], ["model.layers.2", "model.layers.3"]]
    assert {pp: rows[-1]["draft"] for pp, rows in total.items()} == {pp: "model.layers.4" for pp in (1, 2, 3, 4)}
    assert {pp: rows[-1]["draft"] for pp, rows in per_rank.items()} == {1: "model.layers.4", 2: "model.layers.2",
                                                                      3: "model.layers.1", 4: "model.layers.1"}
    assert [pp for pp, rows in per_rank.items() if rows[-1]["clash"]] == [2]
    assert {pp: rows[-1]["elsewhere"] for pp, rows in per_rank.items()} == {1: None, 2: None, 3: 1, 4: 1}
    assert all(rows[-1]["layer_types_index"] == 0 for rows in list(total.values()) + list(per_rank.values()))
    assert all(r["draft"] is None for rows in per_rank.values() for r in rows[:-1])
    with pytest.raises(ValueError):
        eagle3_layer_names(4, 2, "half")
