"""FedPerl and FedMatch (fl/strategies/peer_learning.py): peers' predictions help label a node's unlabelled images
(against a hand computation), T = 0 is SSFL, an anonymised peer is its peers' mean and arrives as one model, the
choices follow the policy, and one launch gives the in-process numbers on the distributed engine."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from conftest import Cli, copy_exp
from fedcli.artifacts import load_tensors
from fedcli.data.manifest import Manifest
from fedcli.fl import engine, stage
from fedcli.fl.federate_config import FederateConfig
from fedcli.fl.fixmatch import FixMatchSettings, SemiBatch
from fedcli.fl.peer_teaching import PeerFixMatch, pseudo_labels
from fedcli.fl.trainer import LocalTrainer
from fedcli.report.calibration import reliability, risk_coverage
from fedcli.report.collect import Run, SubExperiment
from fedcli.report.few_labels import few_labels_table
from fedcli.report.study import Missing

# three of the four nodes train each round (--participation), so the engines and the resume are compared with it
RUN = dict(rounds=3, epochs=1, init_epochs=0, batch=8, bootstrap=10, threads=1, ssl="fixmatch", unlabeled_ratio=2,
           confidence=0.5, participation=0.75)
ARGS = ["--rounds", "3", "--epochs", "1", "--init-epochs", "0", "--batch", "8", "--bootstrap", "10", "--threads", "1",
        "--ssl", "fixmatch", "--unlabeled-ratio", "2", "--confidence", "0.5", "--participation", "0.75"]


@pytest.fixture(scope="module")
def few(tmp_path_factory):
    """Four nodes with a few labels each, and a held-apart set on node1."""
    exp = tmp_path_factory.mktemp("peers") / "exp"
    Cli().ok("partition", "--nodes", "4", "--image-size", "16", "--labeled-fraction", "0.15", "--held-apart-fraction",
             "0.1", "--held-apart-node", "node1", "--exp", exp)
    return exp


@pytest.fixture(scope="module")
def reference(few, tmp_path_factory):
    """SSFL, FedPerl (anonymised, validation policy) and FedMatch, in process."""
    exp = copy_exp(few, tmp_path_factory.mktemp("reference"))
    stage.run(FederateConfig(exp=exp, strategy=("fedavg", "fedperl", "fedmatch"), anonymize=True,
                             policy="validation", **RUN))
    return exp


def model_bytes(exp, name) -> bytes:
    return (exp / "federate" / name / "models" / "global.safetensors").read_bytes()


def linear(weight: list[list[float]]) -> nn.Module:
    model = nn.Sequential(nn.Flatten(), nn.Linear(2, 3, bias=False))
    with torch.no_grad():
        model[1].weight.copy_(torch.tensor(weight))
    return model


def test_peers_help_label_and_pull_as_a_hand_computation():
    torch.manual_seed(0)
    weak, strong = torch.randn(5, 1, 1, 2), torch.randn(5, 1, 1, 2)
    own = linear([[1.0, -1.0], [0.5, 2.0], [-1.0, 0.0]])
    peers = [linear([[2.0, 0.0], [0.0, 1.0], [-2.0, 1.0]]), linear([[0.0, 0.5], [1.0, -1.0], [0.5, 0.5]])]
    settings = FixMatchSettings(confidence=0.6, lambda_u=0.7)
    batch = SemiBatch(torch.zeros(0, 1, 1, 2), torch.zeros(0, dtype=torch.long), 0, weak, strong)
    objective = PeerFixMatch(settings, peers, "mean", "mse", beta=0.3)
    weak_logits, strong_logits = own(weak), own(strong)
    got = objective.unlabelled(weak_logits, strong_logits, batch)

    q = torch.exp(weak_logits) / torch.exp(weak_logits).sum(1, keepdim=True)
    p = [torch.exp(m(weak)) / torch.exp(m(weak)).sum(1, keepdim=True) for m in peers]
    mean = (q + p[0] + p[1]) / 3
    label = mean.argmax(1)
    kept = mean.max(1).values >= 0.6
    ce = -torch.log_softmax(strong_logits, 1)[torch.arange(5), label]
    expected = 0.7 * (ce * kept).sum() / 5 + 0.3 * (((q - p[0]) ** 2).mean() + ((q - p[1]) ** 2).mean()) / 2
    assert 0 < kept.sum() < 5  # the mask matters here
    assert torch.allclose(got, expected.detach(), atol=1e-6)

    # the consistency's gradient goes through the node's weak predictions (nothing is confident at threshold 1)
    logits = weak_logits.detach().requires_grad_(True)
    PeerFixMatch(FixMatchSettings(confidence=1.0), peers, "mean", "mse", beta=0.3).unlabelled(
        logits, strong_logits.detach(), batch).backward()
    manual = logits.detach().requires_grad_(True)
    soft = torch.softmax(manual, 1)
    (0.3 * (((soft - p[0].detach()) ** 2).mean() + ((soft - p[1].detach()) ** 2).mean()) / 2).backward()
    assert logits.grad.abs().sum() > 0 and torch.allclose(logits.grad, manual.grad, atol=1e-7)

    kl = PeerFixMatch(FixMatchSettings(confidence=1.0), peers, "agreement", "kl", beta=1.0).unlabelled(
        weak_logits, strong_logits, batch)
    by_hand = sum((pj * (pj.log() - q.log())).sum(1).mean() for pj in p) / 2
    assert torch.allclose(kl, by_hand.detach(), atol=1e-6)


def test_agreement_labels_by_the_confident_votes_ties_to_the_lower_class():
    own = torch.tensor([[0.9, 0.1, 0.0], [0.4, 0.3, 0.3], [0.0, 0.1, 0.9], [0.3, 0.3, 0.4]])
    peer_a = torch.tensor([[0.1, 0.9, 0.0], [0.3, 0.4, 0.3], [0.9, 0.1, 0.0], [0.3, 0.4, 0.3]])
    peer_b = torch.tensor([[0.0, 0.8, 0.2], [0.3, 0.3, 0.4], [0.2, 0.2, 0.6], [0.4, 0.3, 0.3]])
    mask, label = pseudo_labels("agreement", own, [peer_a, peer_b], 0.75)
    # two confident votes for class 1 beat one for 0; nobody confident; one vote each for 2 and 0: the lower
    assert mask.tolist() == [True, False, True, False]
    assert label[mask].tolist() == [1, 0]


@pytest.mark.parametrize("name", ["fedperl", "fedmatch"])
def test_no_peers_is_ssfl(name, reference, few, tmp_path):
    exp = copy_exp(few, tmp_path)
    stage.run(FederateConfig(exp=exp, strategy=(name,), peers=0, **RUN))
    assert model_bytes(exp, name) == model_bytes(reference, "fedavg")
    metrics = [pd.read_csv(e / "federate" / n / "metrics.csv").drop(columns="strategy")
               for e, n in ((exp, name), (reference, "fedavg"))]
    pd.testing.assert_frame_equal(*metrics)
    assert set(pd.read_csv(exp / "federate" / name / "comm.csv").kind) == {"all-reduce"}


def test_peers_change_what_is_learnt_and_are_chosen_as_the_policy_says(reference):
    assert model_bytes(reference, "fedperl") != model_bytes(reference, "fedavg")
    assert model_bytes(reference, "fedmatch") != model_bytes(reference, "fedavg")
    for name in ("fedperl", "fedmatch"):
        choices = pd.read_csv(reference / "federate" / name / "peers.csv")
        assert (choices.node != choices.peer).all() and set(choices["round"]) == {2, 3}  # round 1: no local models yet
        for _, chosen in choices.groupby(["round", "node"]):
            assert chosen["rank"].tolist() == list(range(1, len(chosen) + 1)) and len(chosen) <= 2
            assert chosen.similarity.is_monotonic_decreasing
    static = pd.read_csv(reference / "federate" / "fedmatch" / "peers.csv")
    assert static.groupby(["round", "node"]).size().eq(2).all()  # static: always T peers
    for round_, chosen in static.groupby("round"):  # only the round's participants choose, if they have a model
        trained = {node for r in range(1, round_) for node in participants(reference, r)}
        assert sorted(set(chosen.node)) == sorted(set(participants(reference, round_)) & trained)


def participants(exp, round_) -> list[str]:
    cfg = FederateConfig(exp=exp, strategy=("fedavg",), **RUN)
    return engine.build(cfg, Manifest.load(exp), 0).participants(round_)


def test_participants_are_drawn_per_seed_and_round_and_only_they_train(few, tmp_path, monkeypatch):
    drawn = [participants(few, round_) for round_ in range(4)]
    assert drawn[0] == ["node0", "node1", "node2", "node3"]  # round 0: everyone
    assert all(len(d) == 3 for d in drawn[1:]) and len({tuple(d) for d in drawn[1:]}) > 1
    assert drawn == [participants(few, round_) for round_ in range(4)]
    cfg = FederateConfig(exp=few, strategy=("fedavg",), **{**RUN, "participation": 0.2})
    assert len(engine.build(cfg, Manifest.load(few), 0).participants(1)) == 1  # at least one
    trained = []
    original = LocalTrainer.train

    def recording(self, model, key, round_, *args, **kwargs):
        trained.append((round_, key))
        return original(self, model, key, round_, *args, **kwargs)

    monkeypatch.setattr(LocalTrainer, "train", recording)
    exp = copy_exp(few, tmp_path)
    stage.run(FederateConfig(exp=exp, strategy=("fedavg",), **RUN))
    assert sorted(trained) == sorted((r, node) for r in (1, 2, 3) for node in participants(few, r))
    comm = pd.read_csv(exp / "federate" / "fedavg" / "comm.csv")
    assert comm.groupby("round").size().eq(4).all()  # every node joins the all-reduce, a left-out one with weight 0


def test_an_anonymised_peer_is_one_model_the_mean_of_the_peers(reference, few, tmp_path):
    comm = pd.read_csv(reference / "federate" / "fedperl" / "comm.csv")
    choices = pd.read_csv(reference / "federate" / "fedperl" / "peers.csv")
    anonymised = comm[comm.kind == "anonymised-peer"]
    # each node with peers downloads one model a round, from its most similar peer
    first = choices[choices["rank"] == 1]
    assert sorted(zip(anonymised["round"], anonymised.receiver, anonymised.sender)) == \
        sorted(zip(first["round"], first.node, first.peer))
    relayed = comm[comm.kind == "peer-model"]
    others = choices[choices["rank"] > 1]
    assert len(relayed) == len(others)
    checked = comm[comm.kind == "peer-check"]  # the validation policy: every other trained node's model to the holder
    assert set(checked.receiver) == {"node1"} and checked.groupby("round").size().le(3).all()
    # with one peer, the anonymised model is that peer's model: the same numbers as without anonymisation
    runs = {}
    for anonymize in (False, True):
        exp = copy_exp(few, tmp_path / str(anonymize))
        stage.run(FederateConfig(exp=exp, strategy=("fedperl",), peers=1, anonymize=anonymize, **RUN))
        runs[anonymize] = exp
    assert model_bytes(runs[True], "fedperl") == model_bytes(runs[False], "fedperl")
    kinds = [pd.read_csv(runs[a] / "federate" / "fedperl" / "comm.csv").groupby("kind").bytes.sum() for a in (0, 1)]
    assert kinds[1]["anonymised-peer"] == kinds[0]["peer-model"] and "peer-model" not in kinds[1]


def test_gated_similarity_keeps_only_peers_above_the_threshold(few, tmp_path):
    exp = copy_exp(few, tmp_path)
    stage.run(FederateConfig(exp=exp, strategy=("fedperl",), policy="gated-similarity", policy_threshold=0.5,
                             peers=3, **RUN))
    choices = pd.read_csv(exp / "federate" / "fedperl" / "peers.csv")
    assert len(choices) and (choices.similarity >= 0.5).all()


def test_peer_learning_gives_the_in_process_numbers_distributed(reference, few, tmp_path, cli):
    exp = copy_exp(few, tmp_path)
    cli.ok("federate", "--exp", exp, "--strategy", "fedavg", "--strategy", "fedperl", "--strategy", "fedmatch",
           "--anonymize", "--policy", "validation", *ARGS, "--engine", "distributed", "--launch", "local")
    for name in ("fedavg", "fedperl", "fedmatch"):
        folder, expected = exp / "federate" / name, reference / "federate" / name
        pd.testing.assert_frame_equal(pd.read_csv(folder / "metrics.csv"), pd.read_csv(expected / "metrics.csv"))
        assert model_bytes(exp, name) == model_bytes(reference, name), name
        assert (folder / "comm.csv").read_bytes() == (expected / "comm.csv").read_bytes(), name
        if name != "fedavg":
            assert (folder / "peers.csv").read_bytes() == (expected / "peers.csv").read_bytes(), name


def test_a_peer_learning_run_resumes_to_the_same_numbers(reference, few, tmp_path):
    exp = copy_exp(few, tmp_path)

    def crash(strategy, round_):
        if round_ == 2:
            raise KeyboardInterrupt

    options = dict(strategy=("fedperl",), anonymize=True, policy="validation", **RUN)
    with pytest.raises(KeyboardInterrupt):
        stage.run(FederateConfig(exp=exp, **options), after_round=crash)
    stage.run(FederateConfig(exp=exp, resume=True, **options))
    for file in ("metrics.csv", "comm.csv", "peers.csv", "models/global.safetensors"):
        assert (exp / "federate" / "fedperl" / file).read_bytes() == \
            (reference / "federate" / "fedperl" / file).read_bytes(), file
    assert load_tensors(exp / "federate" / "fedperl" / "models" / "global.safetensors", "model")


@pytest.mark.parametrize("args, says", [
    (["--policy", "gated-validation"], "needs --policy-threshold"),
    (["--participation", "0.5", "--strategy", "scaffold"], "which scaffold has no rule for"),
    (["--policy", "static", "--policy-threshold", "0.9"], "applies to the gated policies"),
])
def test_policy_mistakes_are_refused_in_one_line(few, cli, args, says):
    assert says in cli.user_error("federate", "--exp", few, "--strategy", "fedperl", *args, "--rounds", "1",
                                  "--threads", "1")


def test_a_validation_policy_without_a_held_apart_set_is_refused_in_one_line(cli, tmp_path):
    exp = tmp_path / "exp"
    cli.ok("partition", "--nodes", "3", "--image-size", "16", "--labeled-fraction", "0.2", "--exp", exp)
    assert "held-apart set, which this partition has none of" in cli.user_error(
        "federate", "--exp", exp, "--strategy", "fedperl", "--policy", "validation", "--rounds", "1", "--threads", "1")


def test_fixmatch_weighs_the_unlabelled_term_as_before():
    """FixMatch's own term (what T = 0 trains with) is lambda_u times the mean over all images of the masked CE."""
    logits = torch.tensor([[3.0, 0.0], [0.1, 0.0]])
    strong = torch.tensor([[0.5, 0.2], [0.0, 1.0]])
    batch = SemiBatch(torch.zeros(0, 1, 1, 2), torch.zeros(0, dtype=torch.long), 0, torch.zeros(2, 1, 1, 2),
                      torch.zeros(2, 1, 1, 2))
    got = PeerFixMatch(FixMatchSettings(confidence=0.9, lambda_u=2.0), [], "mean", "mse", 1.0).unlabelled(
        logits, strong, batch)
    assert torch.allclose(got, 2.0 * F.cross_entropy(strong[:1], torch.tensor([0])) / 2)


def fake_run(strategy: str, scores: list[float], sent: int, tmp_path, **config) -> Run:
    metrics = pd.DataFrame({"round": 3, "model_node": "global", "test_node": [f"node{i}" for i in range(len(scores))],
                            "f1_weighted": scores, "adaptive_ece": 0.1, "adaptive_mce": 0.2})
    comm = pd.DataFrame({"round": [1, 1], "sender": ["node0", "node0"], "receiver": ["all", "node1"],
                         "kind": ["all-reduce", "eval"], "bytes": [sent, 999]})
    folder = tmp_path / f"{strategy}-{len(list(tmp_path.iterdir()))}"
    folder.mkdir()
    return Run(strategy, None, {"ssl": "none", "labels": "visible", **config}, metrics, comm, folder)


def test_the_few_labels_table_reads_every_variant_with_its_ri_and_ac(tmp_path):
    manifest = {"nodes": [{"name": f"node{i}"} for i in range(3)],
                "labels": {"fraction": 0.1, "held_apart": {"fraction": 0.1, "holder": "node1"}}}
    lower = fake_run("fedavg", [0.5, 0.6, 0.7], 100, tmp_path)
    ssfl = fake_run("fedavg", [0.6, 0.7, 0.8], 100, tmp_path, ssl="fixmatch")
    perl = fake_run("fedperl", [0.66, 0.7, 0.86], 150, tmp_path, peers=2, anonymize=True, policy="static")
    upper = fake_run("fedavg", [0.8, 0.9, 1.0], 100, tmp_path, labels="all")
    subs = [SubExperiment(tmp_path, {}, manifest, [run], [], [], []) for run in (lower, ssfl, perl, upper)]
    table = few_labels_table(subs, "f1_weighted")
    frame = table.frame
    assert list(frame.index) == ["fedavg [labelled only]", "fedavg [FixMatch]", "fedperl (T=2, PA) [FixMatch]",
                                 "fedavg [all labels]"]
    perl_row = frame.loc["fedperl (T=2, PA) [FixMatch]"]
    assert perl_row["f1_weighted: mean (median) ± std over clients"] == \
        f"0.740 (0.700) ± {np.std([0.66, 0.7, 0.86]):.3f}"
    assert perl_row["RI (%)"] == f"{100 * (0.74 - 0.6) / 0.6:+.1f}" and perl_row["AC (%)"] == "+50"
    assert frame.loc["fedavg [FixMatch]", "AC (%)"] == "+0" and frame.loc["fedavg [labelled only]", "RI (%)"] == "+0.0"
    assert "node1 held the held-apart set: real labelled images" in table.note
    no_labels_hidden = [SubExperiment(tmp_path, {}, {"nodes": manifest["nodes"]}, [lower], [], [], [])]
    assert isinstance(few_labels_table(no_labels_hidden, "f1_weighted"), Missing)


def test_the_report_shows_the_few_labels_table_and_the_community_matrix(reference, cli):
    cli.ok("report", reference, "--metric", "f1-weighted")
    report = (reference / "report" / "report.md").read_text()
    assert "Few labels (FedPerl's Table 2)" in report and "fedperl (T=2, PA, validation, 75% participation)" in report
    assert (reference / "report" / "figures" / "calibration.png").is_file()
    table = pd.read_csv(reference / "report" / "few_labels.csv", index_col=0)
    assert table["AURC"].between(0, 1).all()
    matrix = pd.read_csv(next((reference / "report").glob("community__fedmatch*.csv")), index_col=0)
    choices = pd.read_csv(reference / "federate" / "fedmatch" / "peers.csv")
    assert int(matrix.to_numpy().sum()) == len(choices)


def test_risk_coverage_and_reliability_as_a_hand_computation():
    labels = np.array([0, 1, 1, 0])
    probs = np.array([[0.9, 0.1], [0.3, 0.7], [0.58, 0.42], [0.45, 0.55]])  # confidences .9 .7 .58 .55; 3rd, 4th wrong
    coverage, risk, aurc = risk_coverage(labels, probs)
    assert coverage.tolist() == [0.25, 0.5, 0.75, 1.0] and risk.tolist() == [0, 0, 1 / 3, 0.5]
    assert aurc == pytest.approx((0 + 0 + 1 / 3 + 0.5) / 4)
    confidence, accuracy, count = reliability(labels, probs)  # bins (8/15, 9/15]: .55 .58; (10/15, 11/15]: .7; .9
    assert count.tolist() == [2, 1, 1] and accuracy.tolist() == [0, 1, 1]
    assert confidence == pytest.approx([0.565, 0.7, 0.9])
