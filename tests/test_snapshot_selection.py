"""Phase 1's snapshot rule on noisy FID traces (fedcli/generators/stylegan2/selection.py), and the flags on a released
buffer
whose fidelity is below chance or below its control's (fedcli/generators/fidelity.py shortfalls)."""

from __future__ import annotations

import types

import pytest
import torch

from fedcli.generators import fidelity
from fedcli.generators.stage import warn_low_fidelity
from fedcli.generators.stylegan2.train import TrainSettings, standard_phase
from fedcli.report import summaries
from fedcli.report.tables import gan_table

# A chest X-ray node's phase 1 as issue 31 met it, checked every 25 iterations to 400: the generator
# improves from about 900 to 100, but its second check reads 162 (a near-collapsed generator close to
# the real mean) and the next eight all read higher, up to 1109.
NOISY = [900, 162, 1109, 700, 450, 800, 380, 600, 350, 300, 170, 150, 120, 110, 100, 105]
EVERY = 25


class ScriptedTrainer:
    """What standard_phase drives, with each FID check (and each `--select fidelity` reading) read from a script;
    a snapshot is its iteration."""

    def __init__(self, fids: list[float], every: int = EVERY, accuracies: list[float] = (), **settings):
        self.s = TrainSettings(iterations=every * len(fids), fid_every=every, **settings)
        self.fids, self.iteration = iter(fids), 0
        readings = iter(accuracies)
        self.judge = lambda generator: next(readings)
        self.G_ema = None

    def step(self, alpha: float = 0.0) -> dict:
        self.iteration += 1
        return {}

    def fid(self) -> float:
        return next(self.fids)

    def snapshot(self) -> dict:
        return {"G_ema": {"iteration": torch.tensor(self.iteration)}}


def phase1(fids: list[float], log=lambda row: None, **settings):
    result, state = standard_phase(ScriptedTrainer(fids, **settings), log)
    assert int(result.generator["iteration"]) == result.iteration  # the kept snapshot is the one returned
    return result


def test_a_single_low_fid_reading_neither_wins_nor_stops_phase_one():
    """The rule before issue 31 kept iteration 50 (FID 162) and stopped at 250 on its patience. Within the
    checks' own noise (wide while the generator swings) 700, 450 and then 170 are level with 162, so training
    runs on to the generator's best stretch, and of 100 (375) and 105 (400) the later is kept."""
    result = phase1(NOISY, patience=200)
    assert result.stopped == "cap" and result.iterations_run == 400
    assert result.iteration == 400 and result.fid == 105
    assert result.selection["select"] == "stable" and result.selection["lowest_fid"] == pytest.approx(100)


def test_a_single_high_reading_does_not_hide_the_best_snapshot_after_it():
    # the quickstart's node1 at seed 0 (checks every 60): 138 at 240, then its best buffer at 300
    assert phase1([70, 43, 37, 138, 29], every=60, patience=150).iteration == 300


def test_a_collapse_beyond_the_noise_is_not_kept():
    # readings within about 5% of each other, then 400 and 500: the last snapshot within the noise is kept
    result = phase1([100, 90, 95, 92, 88, 91, 400, 500], patience=1000)
    assert (result.iteration, result.fid, result.iterations_run) == (150, 91, 200)


def test_patience_counts_from_the_last_check_within_the_noise():
    # 310 and 320 lie beyond 200 x the noise (the changes 300 -> 200 -> 310): two checks without one within it
    result = phase1([300, 200, 310, 320, 90, 80], patience=2 * EVERY)
    assert (result.iteration, result.iterations_run, result.stopped) == (50, 100, "patience")
    assert phase1([40.0], patience=100).iteration == 25  # a single check is kept


def test_select_last_trains_every_iteration_and_keeps_the_last_snapshot():
    result = phase1(NOISY[:9], patience=25, select="last")
    assert (result.iteration, result.iterations_run, result.stopped) == (225, 225, "cap")
    assert result.fid == NOISY[8] and result.selection["select"] == "last"


# The chest X-ray node that every FID rule failed (pneumonia seed 1, node0, checks every 25 to 400): its FID
# is lowest at iterations 50-75, whose buffers teach a classifier no better than chance (the readings here are
# its buffers' fidelity ratios); its buffers at 300 and 325 teach the most.
FOOLED_FID = [40, 33, 33, 41, 148, 271, 217, 175, 131, 186, 161, 127, 87, 86, 66, 52]
ACCURACY = [0.30, 0.32, 0.50, 0.69, 0.84, 0.83, 0.78, 0.77, 0.84, 0.86, 0.82, 0.88, 0.88, 0.86, 0.81, 0.81]


def test_select_fidelity_keeps_the_snapshot_whose_buffer_teaches_best_whatever_its_fid():
    fooled = phase1(FOOLED_FID, patience=200)
    assert (fooled.iteration, fooled.iterations_run) == (75, 275)  # where the FID rule was fooled
    rows = []
    result = phase1(FOOLED_FID, rows.append, patience=200, select="fidelity", accuracies=ACCURACY)
    assert (result.iteration, result.iterations_run, result.stopped) == (325, 400, "cap")  # 0.88 twice: the later
    assert result.fid == FOOLED_FID[12] and result.selection == {"select": "fidelity", "selection_accuracy": 0.88}
    assert [row["selection_accuracy"] for row in rows if "fid" in row] == ACCURACY  # every check is read


def test_select_fidelity_counts_patience_from_the_best_reading():
    accuracies = [0.6, 0.8, 0.7, 0.75, 0.79, 0.95]
    result = phase1([50.0] * 6, patience=3 * EVERY, select="fidelity", accuracies=accuracies)
    assert (result.iteration, result.iterations_run, result.stopped) == (50, 125, "patience")


def scores(synthetic: float, control: float, real: float = 0.8) -> tuple[dict, dict]:
    return ({"synthetic_accuracy": synthetic, "real_accuracy": real, "ratio": synthetic / real},
            {"synthetic_accuracy": control, "real_accuracy": real, "ratio": control / real})


@pytest.mark.parametrize("synthetic, control, flags", [
    (0.474, 0.48, [fidelity.BELOW_CHANCE]),  # issue 31's buffer: below chance (0.5), level with its control
    (0.60, 0.80, [fidelity.BELOW_CONTROL]),  # 0.20 below the control on 200 images: beyond +-0.087
    (0.75, 0.80, []),  # 0.05 below: within the interval
])
def test_a_released_buffer_is_flagged_below_chance_or_below_its_control_beyond_the_interval(synthetic, control,
                                                                                           flags):
    released, ctrl = scores(synthetic, control)
    out = fidelity.shortfalls(released, ctrl, chance=0.5, test_images=200)
    assert out["flags"] == flags
    assert out["floor"] == pytest.approx(0.5 / 0.8)
    assert out["control_margin"] == pytest.approx(
        1.959964 * ((synthetic * (1 - synthetic) + control * (1 - control)) / 200) ** 0.5 / 0.8)


def test_chance_is_always_answering_the_most_frequent_test_class():
    assert fidelity.chance_accuracy(torch.tensor([0, 1, 1, 1, 2])) == pytest.approx(0.6)


def summary(node: str, flags: list[str]) -> dict:
    released, control = scores(0.48, 0.8)
    return {"node": node, "train_images": 10, "metric_names": {"fid": "fid[cnn-node]"}, "fid": {"calibrated": False},
            "buffer": {"size": 30},
            "phase1": {"fid": 5.0, "best_iteration": 50, "iterations": 250, "stopped": "patience", "select": "stable"},
            "phase2": {"fid": 6.0, "kept_iteration": 20, "iterations": 20, "stopped": "cap"},
            "fidelity": released | {"phase1": released, "control": control, "class_fidelity": 0.5, "floor": 0.625,
                                    "control_margin": 0.1, "flags": flags}}


def test_flagged_buffers_are_named_in_one_warning_line_and_in_the_stage_table(capsys):
    summaries = [summary("a", [fidelity.BELOW_CHANCE, fidelity.BELOW_CONTROL]), summary("b", [])]
    warn_low_fidelity(summaries)
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("warning:")
    assert "node a's fidelity ratio 0.600 is at or below chance (0.625" in lines[0]
    assert "below its control's 1.000 beyond the score's 95% interval" in lines[0] and "node b" not in lines[0]
    table = gan_table(summaries)
    columns = {column.header: list(column.cells) for column in table.columns}
    assert columns["flags"] == ["below chance, below control", "-"]
    assert columns["kept 1"] == ["50/250", "50/250"]
    warn_low_fidelity([summary("b", [])])
    assert capsys.readouterr().err == ""


def test_the_report_names_flagged_buffers_in_its_gan_table():
    experiment = types.SimpleNamespace(gans=[summary("a", [fidelity.BELOW_CHANCE]), summary("b", [])],
                                       run=lambda strategy: None)
    built = summaries.gan_summary([experiment])
    assert list(built.frame["flags"]) == ["below chance 1/1", ""]
    assert "Flagged released buffers: a (below chance" in built.note


def test_the_selection_reading_weights_classes_as_the_test_set_holds_them():
    """A buffer classifier right on every normal X-ray and half of the pneumonia ones reads 0.75 for a balanced
    test set, whatever the training images' mix (0.55 on 10% normal ones, 0.95 on 90%)."""
    judge = fidelity.SelectionJudge(train=None, test_mix={0: 0.5, 1: 0.5}, classes=[0, 1], size=2, truncation=1.0,
                                    budget=fidelity.Budget(), in_channels=1, num_classes=2, seed=0, node="node0")
    assert judge.reading({0: 1.0, 1: 0.5}) == 0.75
    assert judge.reading({0: 1.0}) == 0.5  # a test class the training images lack counts as missed
