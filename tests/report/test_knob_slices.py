"""The study report's per-knob view: slice plots, and the knobs folded away."""

from __future__ import annotations

from lbtune.report.plots import png_axes_text
from lbtune.report.study_plots import best_params_markdown, slice_plot, split_params, varied_knobs
from tests.report.test_browser_layout import study


def test_knobs_that_do_nothing_under_the_chosen_values_are_folded_away() -> None:
    result = study()
    best = result.trial(4)
    assert best is not None and best.params["algorithm"] == "leastconn"
    effective, folded = split_params(result, best.params)
    assert {"algorithm", "weight.h100-0", "weight.l4-0"} <= set(effective)
    assert "acts only when algorithm = random" in folded["random_draws"]
    assert "acts only when algorithm = hash" in folded["hash_bytes"]
    assert "fixed during this study" in folded["agent.a"]  # never moved: no agent ran
    assert "queue_timeout_s" in folded and not set(effective) & set(folded)
    text = "\n".join(best_params_markdown(result, best.params))
    assert '"hash_bytes"' not in text and "`hash_bytes` 256: acts only when" in text


def test_under_hash_the_hash_knobs_act() -> None:
    result = study()
    hashed = result.trial(3)
    assert hashed is not None
    effective, folded = split_params(result, hashed.params)
    assert "acts only when" not in folded.get("hash_bytes", "")  # active under hash
    assert "random_draws" in folded and "random_draws" not in effective


def test_one_slice_panel_per_varied_knob_with_a_colour_bar() -> None:
    result = study()
    knobs = varied_knobs(result)
    assert knobs[0] == "algorithm"  # the most important first
    axes = png_axes_text(slice_plot(result)) or ""
    panels = [p for p in axes.split("; ") if " x = " in p]
    assert [p.split(":")[0] for p in panels] == knobs
    assert all(p.endswith("y = score (lower is better)") for p in panels)
    assert "colour = trial number" in axes


def test_a_fixed_knob_is_folded_for_apply_show() -> None:
    from lbtune.report.study_plots import _space_of, split_by_space
    from lbtune.targets.space import ParameterSpace

    space = _space_of(study(), ["weight.h100-0"])
    assert space is not None
    fixed = {
        n: s.model_copy(update={"fixed": n.startswith("agent.")}) for n, s in space.params.items()
    }
    live = {**space.baseline(), "algorithm": "hash"}
    effective, folded = split_by_space(ParameterSpace(space.target, fixed), live)
    assert "hash_bytes" in effective and "weight.h100-0" in effective
    assert "fixed in this cluster" in folded["agent.a"]
    assert "acts only when algorithm = random" in folded["random_draws"]


def test_the_report_explains_what_the_winner_changes() -> None:
    from lbtune.report.study_plots import _space_of, explain_changes

    result = study()
    best = result.trial(4)
    assert best is not None
    changes = {c.name: c for c in explain_changes(result, best.params)}
    # leastconn vs the live roundrobin, and both weights moved; unchanged/folded knobs absent
    assert set(changes) == {"algorithm", "weight.h100-0", "weight.l4-0"}
    algo = changes["algorithm"]
    assert (algo.live, algo.winner) == ("roundrobin", "leastconn")
    space = _space_of(result, list(best.params))
    assert space is not None
    assert algo.meaning == " ".join(space.params["algorithm"].help.split())  # space.yaml's help
    assert (changes["weight.h100-0"].live, changes["weight.h100-0"].winner) == ("100", "180")
    text = "\n".join(best_params_markdown(result, best.params))
    assert (
        "### What the winner changes" in text and "| algorithm | roundrobin | leastconn |" in text
    )


def test_knobs_that_start_acting_under_the_winner_show_as_new() -> None:
    from dataclasses import replace

    from lbtune.report.study_plots import explain_changes

    result = study()
    llm = {**result.trials[4].params, "algorithm": "llm", "llm.w_queue": 1.5}
    trials = tuple(replace(t, params=llm) if t.number == 4 else t for t in result.trials)
    result = replace(result, trials=trials)
    changes = {c.name: c for c in explain_changes(result, llm)}
    assert changes["algorithm"].winner == "llm"
    assert changes["llm.w_queue"].live == "not acting (new under the winner)"
    assert changes["llm.w_queue"].winner == "1.5" and "queue" in changes["llm.w_queue"].meaning


def test_a_winner_equal_to_live_says_so() -> None:
    result = study()
    live = result.trial(0)
    assert live is not None
    text = "\n".join(best_params_markdown(result, live.params))
    assert "sets every acting knob as the live configuration does" in text
