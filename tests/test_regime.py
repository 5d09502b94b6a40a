"""The memorising regime: a rule fixed before the sweep, applied as written. The first setting (in the recipe's
order) whose alpha-0 control leaks membership on every node is chosen and fixes every sub-experiment; a sweep
in which none leaks says so, records it, and compares nothing."""

from __future__ import annotations

import json

import pytest

from fedcli.audit.regime import Rule, choose, outcome
from fedcli.data.manifest import Manifest

def reading(node: str, low: float) -> dict:
    return {"node": node, "auroc": low + 0.1, "ci_low": low, "ci_high": low + 0.2, "members": 40}


def test_the_first_setting_that_leaks_on_every_node_is_chosen_and_the_bound_is_strict():
    rule = Rule(0.6)
    swept = [("n=50", [reading("a", 0.7), reading("b", 0.6)]),  # b's bound is not *above* 0.6
             ("n=100", [reading("a", 0.65), reading("b", 0.61)]),
             ("n=200", [reading("a", 0.9), reading("b", 0.9)])]
    assert choose(swept, rule) == "n=100"
    result = outcome(swept, rule, tried=3)
    assert result["chosen"] == "n=100" and [s["met"] for s in result["settings"]] == [False, True, True]
    assert "above 0.6 (or below 0.4: reversed) on every node" in result["rule"]


def test_a_control_whose_members_sit_further_leaks_too():
    """Two-sided: an interval below 1 - threshold is a leak an attacker reads by flipping the score."""
    rule = Rule(0.6)
    flipped = {"node": "b", "auroc": 0.2, "ci_low": 0.1, "ci_high": 0.3, "members": 40}
    assert rule.met([reading("a", 0.7), flipped])
    assert not rule.met([reading("a", 0.7), flipped | {"ci_high": 0.45}])


def test_a_sweep_in_which_nothing_leaks_chooses_nothing_and_says_so():
    rule = Rule(0.6)
    swept = [("n=50", [reading("a", 0.55), reading("b", 0.7)]), ("n=100", [reading("a", 0.4), reading("b", 0.5)])]
    result = outcome(swept, rule, tried=2)
    assert result["chosen"] is None
    assert result["said"] == ("regime: none of the 2 settings leaks by the rule (the alpha-0 control's membership "
                              "AUROC has its 95% interval above 0.6 (or below 0.4: reversed) on every node); the "
                              "closest, n=50, missed it on its worst node by 0.050")
    assert not Rule(0.6).met([])


def recipe(tmp_path, regime: str):
    """test_run's tiny recipe (two nodes, tiny GANs and audit), FedER alone, with `regime` added."""
    from test_run import recipe as tiny

    return tiny(tmp_path, strategies=("feder",), extra=regime)


def test_a_regime_sweep_that_finds_no_leak_stops_the_recipe_with_one_line(cli, tmp_path):
    exp = tmp_path / "exp"
    result = cli("run", recipe(tmp_path, '\n[regime]\nthreshold = 0.99\n"train_gan.iterations" = [12]\n'),
                 "--exp", exp, "--threads", "2")
    assert result.exit_code == 2 and "Traceback" not in result.output + result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]  # after the stages' progress
    assert len(errors) == 1 and errors[0].startswith("error: regime: none of the 1 settings leaks by the rule")
    regime = json.loads((exp / "regime" / "regime.json").read_text())
    assert regime["chosen"] is None and regime["threshold"] == 0.99
    assert [r["node"] for r in regime["settings"][0]["readings"]] == ["node0", "node1"]
    assert not (exp / "federate").exists() and not (exp / "runs").exists()  # nothing compared


def test_the_chosen_setting_fixes_every_sub_experiment(cli, tmp_path, monkeypatch):
    monkeypatch.setattr(Rule, "met", lambda self, readings: bool(readings))  # as if the first setting leaked
    exp = tmp_path / "exp"
    out = cli.ok("run", recipe(tmp_path, '\n[regime]\n"partition.test-fraction" = [0.5]\n'
                                         '"train_gan.iterations" = [16, 24]\n'), "--exp", exp, "--threads", "2").stdout
    regime = json.loads((exp / "regime" / "regime.json").read_text())
    assert regime["chosen"] == "test-fraction=0.5,iterations=16"
    assert [s["name"] for s in regime["settings"]] == [regime["chosen"]]  # the sweep stops at the first that leaks
    assert Manifest.load(exp)["test_fraction"] == 0.5
    assert json.loads((exp / "gan" / "node0" / "config.json").read_text())["config"]["iterations"] == 16
    assert "train-gan: same inputs as regime/test-fraction=0.5,iterations=16/gan, shared" in out
    assert (exp / "federate" / "feder" / "metrics.csv").is_file()
    report = (exp / "report" / "report.md").read_text()
    assert "Regime: where the unprotected generator leaks" in report


def test_the_regime_is_chosen_on_its_own_seed_and_hands_on_its_setting_alone(cli, tmp_path, monkeypatch):
    """[regime] seed: the sweep partitions on that seed; the sub-experiments keep their own."""
    monkeypatch.setattr(Rule, "met", lambda self, readings: bool(readings))
    exp = tmp_path / "exp"
    cli.ok("run", recipe(tmp_path, '\n[regime]\nseed = 100\n"train_gan.iterations" = [16]\n'), "--exp", exp,
           "--threads", "2")
    assert Manifest.load(exp / "regime" / "iterations=16")["seed"] == 100
    assert Manifest.load(exp)["seed"] == 0
    assert json.loads((exp / "gan" / "node0" / "config.json").read_text())["config"]["iterations"] == 16


@pytest.mark.parametrize("regime, message", [
    ('seed = 0\n"train_gan.iterations" = [12]', "regime.seed 0 is also a seed the sub-experiments report"),
    ('seed = -1\n"train_gan.iterations" = [12]', "regime.seed must be a non-negative integer"),
    ('"federate.rounds" = [1]', "[regime] needs grid lists of partition and train_gan options"),
    ('threshold = 0.4\n"train_gan.iterations" = [12]', "regime.threshold must be at least 0.5"),
])
def test_a_regime_outside_what_the_generator_sees_is_one_line(cli, tmp_path, regime, message):
    assert message in cli.user_error("run", recipe(tmp_path, f"\n[regime]\n{regime}\n"), "--exp", tmp_path / "exp",
                                     "--dry-run")


def test_a_setting_both_in_the_regime_and_swept_is_one_line(cli, tmp_path):
    path = recipe(tmp_path, '\n[regime]\n"train_gan.iterations" = [12]\n\n[sweep]\n"train_gan.iterations" = [16, 24]\n')
    assert "train_gan.iterations is both in [regime] and swept" in cli.user_error("run", path, "--exp",
                                                                                  tmp_path / "exp", "--dry-run")


CONTROLS = {(0, "node0"): 0.70, (0, "node1"): 0.66, (1, "node0"): 0.74, (1, "node1"): 0.68}


def frontier_sub(seed: int, released: dict, dp: bool = False, kind: str = "stylegan2", **config):
    """A sub-experiment as the frontier reads it: each node's audit (released and control membership) and GAN config."""
    from pathlib import Path

    from fedcli.report.collect import SubExperiment

    def mia(auroc: float) -> dict:
        return {"mia": {"auroc": auroc, "auroc_ci_low": auroc - 0.12, "auroc_ci_high": auroc + 0.12},
                "reconstruction_share": {"members": 1.0}}
    audits = [{"node": node, "attack": "latent projection" if kind == "stylegan2" else "nearest buffer image",
               "buffer": {"dcr_share": 0.5},
               "generators": {"privacy": mia(auroc), "control": mia(auroc if dp else CONTROLS[(seed, node)])},
               **({"dp": {}} if dp else {})} for node, auroc in released.items()]
    gans = [{"node": node, "config": {"generator": kind, **config}} for node in released]
    return SubExperiment(Path(f"seed={seed}"), {"partition.seed": seed}, None, [], [], gans, audits)


def test_the_frontier_pairs_each_release_with_the_regimes_control_of_its_seed_and_node():
    """FedER rows against their own alpha-0 control, a DP row (its own control in its audit) against the regime's
    control of the same seed and node, a VQ-VAE-2 row (another attack) against none."""
    from fedcli.report.frontier import generator_rows

    alpha = [frontier_sub(s, {n: CONTROLS[(s, n)] - d for n, d in (("node0", 0.10), ("node1", 0.20))}, alpha=4.0,
                          privacy_loss="all-pairs") for s in (0, 1)]
    dp = [frontier_sub(s, {"node0": 0.50, "node1": 0.52}, dp=True, dp_epsilon=10.0) for s in (0, 1)]
    vq = [frontier_sub(s, {"node0": 1.0, "node1": 1.0}, kind="vqvae2", prior_iterations=0) for s in (0, 1)]
    rows = generator_rows(alpha + dp + vq, "accuracy")
    assert rows["FedER alpha 4 (all-pairs)"]["minus control, paired [95%]"] == "-0.150 [-0.242, -0.058]"
    expected = sum(r - c for c, r in zip(CONTROLS.values(), (0.50, 0.52) * 2)) / 4  # paired by seed and node
    assert rows["DP epsilon 10"]["minus control, paired [95%]"].startswith(f"{expected:+.3f} [")
    assert rows["VQ-VAE-2: decoded codes"]["minus control, paired [95%]"] == "-"
    # released lower bounds: FedER's 0.48, 0.34, 0.52, 0.36; DP's 0.38, 0.40; the VQ-VAE-2's 0.88
    assert rows["FedER alpha 4 (all-pairs)"]["still leaking"] == "1/4"
    assert rows["DP epsilon 10"]["still leaking"] == "0/4" and rows["VQ-VAE-2: decoded codes"]["still leaking"] == "4/4"


def test_the_frontier_counts_a_reversed_leak_and_the_dp_pairs_it_drops():
    """Two-sided: a release whose members sit further (interval below 0.5) still leaks; a DP release whose seed and
    node have no regime control is dropped from the paired interval, and counted."""
    from fedcli.report.frontier import generator_rows

    alpha = frontier_sub(0, {"node0": 0.2, "node1": 0.5}, alpha=4.0, privacy_loss="nearest")
    dp = [frontier_sub(s, {"node0": 0.5, "node1": 0.5}, dp=True, dp_epsilon=10.0) for s in (0, 2)]  # no seed-2 control
    rows = generator_rows([alpha, *dp], "accuracy")
    assert rows["FedER alpha 4 (nearest)"]["still leaking"] == "1/2"
    assert rows["FedER alpha 4 (nearest)"]["strongest attack (AUROC, better direction)"] == (
        "0.650 ± 0.212 (membership (training LPIPS); membership (training LPIPS), reversed)")
    assert rows["DP epsilon 10"]["minus control, paired [95%]"].endswith("(2 pairs dropped: no control)")
    assert rows["DP epsilon 10"]["LiRA AUROC"] == "-"


def test_the_frontier_lists_each_curves_rows_together_and_in_the_curves_order():
    """Sub-experiments come sorted by name (alpha-16 before alpha-4, dp-10 before dp-3); the rows follow the curves."""
    from fedcli.report.frontier import generator_rows

    def release(**config):
        return frontier_sub(0, {"node0": 0.6}, **config)
    subs = [release(alpha=1.0, privacy_loss="all-pairs"), release(alpha=16.0, privacy_loss="all-pairs"),
            release(alpha=4.0, privacy_loss="all-pairs"), release(dp=True, dp_epsilon=10.0),
            release(dp=True, dp_epsilon=3.0), release(alpha=4.0, privacy_loss="nearest")]
    assert list(generator_rows(subs, "accuracy")) == [
        "FedER alpha 1 (all-pairs)", "FedER alpha 4 (all-pairs)", "FedER alpha 16 (all-pairs)", "DP epsilon 3",
        "DP epsilon 10", "FedER alpha 4 (nearest)"]


def test_the_same_federation_attacked_in_several_sub_experiments_counts_once():
    """Two variants of a seed that federate alike hold bitwise-equal attack summaries: one measurement, not two
    samples (the std would shrink and n grow); another seed's federation is another sample."""
    from pathlib import Path

    from fedcli.report.collect import Stat, SubExperiment
    from fedcli.report.frontier import attack_rows

    def attacked(seed: int, psnr: float) -> SubExperiment:
        row = {"node": "node0", "attack": "latents", "batch": 1, "psnr_mean": psnr,
               "reconstructed": {"ssim": {"share": 1.0}}, "chance": {"ssim": {"share": 0.0}}}
        summary = {"strategy": "fedreplay", "settings": {"iterations": 500}, "attacks": [row], "notes": []}
        return SubExperiment(Path(f"seed={seed}"), {"partition.seed": seed}, None, [], [], [], [],
                             attacks={"fedreplay": summary})
    subs = [attacked(0, 40.0), attacked(0, 40.0), attacked(1, 44.0)]
    psnr = attack_rows(subs, "accuracy")["fedreplay: latents"]["attack PSNR (dB)"]
    assert (psnr.mean, psnr.n, str(psnr)) == (42.0, 2, str(Stat.of([40.0, 44.0])))
