"""A kind of generator is one sub-package implementing fedcli/generators/protocol.py's protocols: a tiny
class-mean decoder (tests/plugins/fedcli_test_plugins/class_mean/, a generator plugin of the tests' plugin
distribution), discovered by the registry as the built-in kinds are, goes through train-gan, federate and the
audit with no change to fedcli."""

from __future__ import annotations

import json

import pytest

import fedcli.generators as package
from fedcli.experiment.artifacts import parse_tensors
from fedcli.experiment.paths import BUFFER
from fedcli.generators.buffer import DECODED
from fedcli.generators.registry import KINDS, discover


@pytest.fixture(scope="module")
def class_mean_kind():
    return KINDS["class-mean"]


def test_the_registry_discovers_a_kind_that_is_one_sub_package(class_mean_kind):
    assert sorted(discover()) == ["class-mean", "stylegan2", "vqvae2"]
    assert type(class_mean_kind).__module__ == "fedcli_test_plugins.class_mean.kind"


def test_two_sub_packages_declaring_one_kind_name_are_refused(tmp_path):
    twin = tmp_path / "vqvae2_twin"
    twin.mkdir()
    (twin / "__init__.py").write_text("")
    (twin / "kind.py").write_text("from fedcli.generators.vqvae2.kind import KIND\n")
    package.__path__.append(str(tmp_path))
    try:
        with pytest.raises(ValueError, match="vqvae2"):
            discover()
    finally:
        package.__path__.remove(str(tmp_path))


def test_a_class_mean_decoder_goes_through_train_gan_federate_and_the_audit(cli, tmp_path, class_mean_kind):
    exp = tmp_path / "exp"
    cli.ok("partition", "--nodes", "2", "--image-size", "16", "--exp", exp)
    assert "--z-dim" in cli.user_error("train-gan", "--exp", exp, "--generator", "class-mean", "--z-dim", "8")
    assert "stylegan2" in cli.user_error("train-gan", "--exp", exp, "--generator", "no-such-kind")
    cli.ok("train-gan", "--exp", exp, "--generator", "class-mean", "--fidelity-seeds", "1", "--fidelity-epochs", "1",
           "--buffer-size", "20")
    record = json.loads((exp / "gan" / "node0" / "config.json").read_text())
    assert record["config"]["generator"] == "class-mean" and record["buffer"]["decoded"]
    assert record["buffer"]["size"] == record["train_images"]  # decoded codes: one per real image, not --buffer-size
    assert set(record["fidelity"]) >= {"ratio", "phase1", "control"}
    assert parse_tensors((exp / "gan" / "node0" / BUFFER).read_bytes())[1]["decoded"] == DECODED
    assert "decoded" in cli.user_error("train-gan", "--exp", exp, "--sample-only", "--buffer-size", "10")

    cli.ok("federate", "--exp", exp, "--strategy", "feder", "--rounds", "1", "--epochs", "1", "--bootstrap", "20")
    assert (exp / "federate" / "feder" / "metrics.csv").is_file()

    cli.ok("audit-privacy", "--exp", exp, "--node", "node0", "--max-images", "10", "--steps", "3", "--optimize-noise")
    summary = json.loads((exp / "audit" / "node0" / "summary.json").read_text())
    assert set(summary["generators"]) == {"privacy", "control"} and summary["phase2_kept_iteration"] is None
    assert summary["verdict"]["result"] in ("pass", "fail", "inconclusive")
    # one generator in all three roles: the privacy effect against the control is exactly none
    assert summary["privacy_effect"]["median_ratio"] == 1.0


@pytest.mark.parametrize("options,titles", [
    ({}, ["standard GAN (phase 1)", "privacy-preserving GAN (phase 2, buffer)", "control (phase 2 at alpha 0)"]),
    ({"dp_epsilon": 3.0}, ["DP GAN, epsilon 3 (buffer)"]),  # its three roles hold one generator: one panel
    ({"generator": "vqvae2"}, ["released buffer: decoded codes of its real images"]),  # no prior by default
    ({"generator": "vqvae2", "prior_iterations": 50}, ["released buffer: prior samples",
                                                       "decoded codes of its real images"]),
    ({"generator": "vqvae2", "prior_iterations": 50, "dp_epsilon": 10.0},
     ["released buffer: DP prior samples, epsilon 10"]),
])
def test_samples_png_titles_each_panel_by_what_that_configuration_releases(tmp_path, options, titles):
    from fedcli.generators.config import GanConfig
    cfg = GanConfig(exp=tmp_path, **options)
    assert list(KINDS[cfg.generator].titles(cfg).values()) == titles
