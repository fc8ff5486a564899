"""The planner's Slicer prices its halves as ``auto`` and ``simulate`` do (issue 29, item 2):
Algorithm 2's ``k`` and the simulated iteration from the profile at half the micro-batch
(:func:`pipeweave.planner.slicer_halves.halves_at`), not half the whole.

Hand derivation (autopipe.txt Algorithm 2, three equal stages, ``f = b = 1``, free links):

* halves at half the whole (the paper's, ``f/2 = b/2 = 0.5``): micro-batch 0's first half
  reaches the last stage at ``3 x 0.5 = 1.5``, its backward comes back (two halves, 1 a
  stage) and ``startt = [2.5, 3.5, 4.5]``; the sliced halves leave stage 0 at ``endt[0] =
  (0.5, 1.0)``. With one micro-batch sliced the first unbroken forward must leave stage 0 by
  ``startt[0] - f_1 - f_0 = 0.5 < 1.0``: too early, slice another; with two, ``endt[0] =
  (1.5, 2.0)`` and it must leave by ``startt[1] - f_0 = 2.5 >= 2.0``: **k = 2**.
* halves at 1.2 the whole (as measured on millisecond actions: the two halves took 2.2-2.6x
  the whole, a fixed cost per call): ``startt = [3.6 + 2.4, ...] = [6.0, 8.4, 10.8]``, the
  halves leave stage 0 at ``(1.2, 2.4)``, and ``6.0 - 1 - 1 = 4.0 >= 2.4``: **k = 1**.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeweave.cli.main import main
from pipeweave.planner import PlanRequest, make_plan
from pipeweave.profiler import BlockProfile, Profile
from pipeweave.schedules.sliced import slicer_count


def _profile(forward: float, backward: float, samples: int) -> Profile:
    return Profile(tuple(BlockProfile(f"b{i}", forward, backward, 0.0, 1.0, 1.0)
                         for i in range(3)), model="three", batch_size=samples)


WHOLE = _profile(1.0, 1.0, 2)
DEAR_HALF = _profile(1.2, 1.2, 1)
"""Each half of a 2-sample micro-batch costs 1.2x the whole (measured tiny batches)."""


def test_the_hand_derivation() -> None:
    assert slicer_count([1.0] * 3, [1.0] * 3, 0.0) == 2
    assert slicer_count([1.0] * 3, [1.0] * 3, 0.0, half_forward=[1.2] * 3,
                        half_backward=[1.2] * 3) == 1


@pytest.mark.parametrize("method", ["autopipe", "uniform"])
def test_dear_halves_change_the_slicer_count(method: str) -> None:
    paper = make_plan(PlanRequest(WHOLE, 3, microbatches=6, slicer=True), method)
    measured = make_plan(PlanRequest(WHOLE, 3, microbatches=6, slicer=True,
                                     half_profile=DEAR_HALF), method)
    assert paper.plan.stages == measured.plan.stages == ((0, 1), (1, 2), (2, 3))
    assert paper.details["sliced"] == 2 and measured.details["sliced"] == 1
    # the simulated iteration prices the halves too: two dear halves cost more than a whole
    assert measured.predicted_iteration_time > paper.predicted_iteration_time
    assert measured.details["iteration_time_without_slicer"] == \
        paper.details["iteration_time_without_slicer"]


def test_halves_at_half_the_whole_change_nothing() -> None:
    paper = make_plan(PlanRequest(WHOLE, 3, microbatches=6, slicer=True), "autopipe")
    half = make_plan(PlanRequest(WHOLE, 3, microbatches=6, slicer=True,
                                 half_profile=_profile(0.5, 0.5, 1)), "autopipe")
    assert half.details["sliced"] == paper.details["sliced"]
    assert half.predicted_iteration_time == pytest.approx(paper.predicted_iteration_time)


def test_a_half_profile_without_the_slicer_or_of_another_model_is_refused() -> None:
    with pytest.raises(ValueError, match="slicer=True"):
        PlanRequest(WHOLE, 3, half_profile=DEAR_HALF)
    other = Profile((BlockProfile("a", 1.0, 1.0, 0.0, 1.0, 1.0),), batch_size=1)
    with pytest.raises(ValueError, match="1 blocks but the profile 3"):
        PlanRequest(WHOLE, 3, slicer=True, half_profile=other)


def test_plan_slicer_from_a_profile_file_prices_halves_with_its_fixed_costs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``pipeweave plan --profile FILE --slicer`` scales the profile to half its
    micro-batch: a half's compute halves, the runtime's fixed cost of its action does not."""
    from pipeweave.auto.scaling import scaled_profile
    from pipeweave.profiler.runtime_costs import RuntimeCosts

    path = tmp_path / "p.json"
    profile = Profile(WHOLE.blocks, model="three", batch_size=2,
                      runtime=RuntimeCosts(per_action={"forward": 1.0, "backward": 1.0}))
    profile.save(path)
    assert main(["plan", "--profile", str(path), "--ranks", "3", "--method", "uniform",
                 "--microbatches", "6", "--slicer", "--shared-cores", "none", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    request = PlanRequest(Profile.load(path), 3, microbatches=6, slicer=True)
    paper = make_plan(request, "uniform")
    halves = make_plan(PlanRequest(request.profile, 3, microbatches=6, slicer=True,
                                   half_profile=scaled_profile(request.profile, 1)), "uniform")
    assert printed["predicted_iteration_time"] == pytest.approx(halves.predicted_iteration_time)
    # each half's F pays the whole per-action second: slower than half the whole
    assert halves.predicted_iteration_time > paper.predicted_iteration_time + 0.5


def test_the_text_report_says_whether_the_slicer_is_predicted_faster() -> None:
    """``plan --slicer`` runs the Slicer as asked; its report puts the plan without it beside
    and says which is predicted faster (dear halves: slower, and how to drop it)."""
    from pipeweave.cli.cmd_plan import format_result

    paper = make_plan(PlanRequest(WHOLE, 3, microbatches=6, slicer=True), "uniform")
    dear = make_plan(PlanRequest(WHOLE, 3, microbatches=6, slicer=True,
                                 half_profile=DEAR_HALF), "uniform")
    without = dear.details["iteration_time_without_slicer"]
    slower = 100 * (dear.predicted_iteration_time / without - 1)
    assert slower > 0
    assert (f"without the Slicer {1e3 * without:.3f} ms (simulated): the Slicer is predicted "
            f"{slower:.1f} % slower: drop --slicer") in format_result(dear, WHOLE)
    faster = 100 * (1 - paper.predicted_iteration_time / without)
    assert faster > 0  # at half the whole, slicing fills the warm-up bubble
    assert f"the Slicer is predicted {faster:.1f} % faster" in format_result(paper, WHOLE)
    plain = make_plan(PlanRequest(WHOLE, 3, microbatches=6), "uniform")
    assert "without the Slicer" not in format_result(plain, WHOLE)
