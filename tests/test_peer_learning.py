"""FedPerl and FedMatch (federate/strategies/peer_learning.py): peers' predictions help label a node's unlabelled images
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
from fedcli.data.manifest import Manifest
from fedcli.experiment.artifacts import load_tensors, save_tensors
from fedcli.federate import engine, stage
from fedcli.federate.config import FederateConfig
from fedcli.federate.strategies.peer_teaching import PeerFixMatch, agreement_loss, pseudo_labels
from fedcli.metrics.scores import predict
from fedcli.report.calibration import reliability, risk_coverage
from fedcli.report.collect import Run, SubExperiment, best_validation_scores
from fedcli.report.few_labels import few_labels_table, improvement, models_received
from fedcli.report.few_labels_paired import against_ssfl_table, regime_table
from fedcli.report.table import Missing
from fedcli.training.fixmatch import FixMatchSettings, SemiBatch
from fedcli.training.settings import LocalTrainer

# three of the four nodes train each round (--participation), so the engines and the resume are compared with it
RUN = dict(rounds=3, epochs=1, init_epochs=0, batch=8, bootstrap=10, threads=1, ssl="fixmatch", unlabeled_ratio=2,
           confidence=0.25, participation=0.75, steps_per_round=4)
ARGS = ["--rounds", "3", "--epochs", "1", "--init-epochs", "0", "--batch", "8", "--bootstrap", "10", "--threads", "1",
        "--ssl", "fixmatch", "--unlabeled-ratio", "2", "--confidence", "0.25", "--participation", "0.75",
        "--steps-per-round", "4"]


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

    everything = FixMatchSettings(confidence=0.0)
    kl = PeerFixMatch(everything, peers, "agreement", "kl", beta=1.0).unlabelled(
        weak_logits, strong_logits, batch)  # every image kept at threshold 0: the KL over all, plus the votes' CE
    votes = F.one_hot(q.argmax(1), 3) + F.one_hot(p[0].argmax(1), 3) + F.one_hot(p[1].argmax(1), 3)
    voted_ce = -torch.log_softmax(strong_logits, 1)[torch.arange(5), votes.argmax(1)].mean()
    by_hand = sum((pj * (pj.log() - q.log())).sum(1).mean() for pj in p) / 2
    assert torch.allclose(kl, (everything.lambda_u * voted_ce + by_hand).detach(), atol=1e-6)


def test_agreement_keeps_what_the_node_is_confident_of_and_lets_every_model_vote():
    # FedMatch's code: the node's own confidence keeps an image; there every model's top class votes
    own = torch.tensor([[0.96, 0.04], [0.60, 0.40], [0.97, 0.03], [0.98, 0.02]])
    helper_a = torch.tensor([[0.40, 0.60], [0.97, 0.03], [0.10, 0.90], [0.30, 0.70]])
    helper_b = torch.tensor([[0.45, 0.55], [0.97, 0.03], [0.99, 0.01], [0.50, 0.50]])
    mask, label = pseudo_labels("agreement", own, [helper_a, helper_b], 0.95)
    # votes 0, 1, 1 -> 1 (unconfident helpers vote); the node unconfident -> dropped whatever its helpers say;
    # 0, 1, 0 -> 0; 0, 1, 0 (a tie of the helper's probabilities goes to class 0) -> 0
    assert mask.tolist() == [True, False, True, True]
    assert label[mask].tolist() == [1, 0, 0]
    mask, label = pseudo_labels("agreement", own[:2], [helper_a[:2]], 0.95)
    assert label[mask].tolist() == [0]  # one vote each: the lower class


def test_fedmatch_consistency_runs_over_the_kept_images_only():
    weak_logits = torch.log(torch.tensor([[0.96, 0.04], [0.60, 0.40], [0.97, 0.03]]))
    helper = [torch.tensor([[0.40, 0.60], [0.97, 0.03], [0.10, 0.90]])]
    kept = torch.tensor([True, False, True])
    by_hand = sum(float((p * (p / q).log()).sum()) for p, q in ((helper[0][i], weak_logits[i].exp()) for i in (0, 2))) / 2
    assert abs(float(agreement_loss("kl", weak_logits, helper, kept)) - by_hand) < 1e-6
    assert float(agreement_loss("kl", weak_logits, helper, torch.zeros(3, dtype=torch.bool))) == 0.0


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


def recorded_training(monkeypatch) -> list[tuple[int, str]]:
    """The (round, key) of every LocalTrainer.train call from here on."""
    trained = []
    original = LocalTrainer.train

    def recording(self, model, key, round_, *args, **kwargs):
        trained.append((round_, key))
        return original(self, model, key, round_, *args, **kwargs)

    monkeypatch.setattr(LocalTrainer, "train", recording)
    return trained


def test_participants_are_drawn_per_seed_and_round_and_only_they_train(few, tmp_path, monkeypatch):
    drawn = [participants(few, round_) for round_ in range(4)]
    assert drawn[0] == ["node0", "node1", "node2", "node3"]  # round 0: everyone
    assert all(len(d) == 3 for d in drawn[1:]) and len({tuple(d) for d in drawn[1:]}) > 1
    assert drawn == [participants(few, round_) for round_ in range(4)]
    cfg = FederateConfig(exp=few, strategy=("fedavg",), **{**RUN, "participation": 0.2})
    assert len(engine.build(cfg, Manifest.load(few), 0).participants(1)) == 1  # at least one
    trained = recorded_training(monkeypatch)
    exp = copy_exp(few, tmp_path)
    stage.run(FederateConfig(exp=exp, strategy=("fedavg",), **RUN))
    assert sorted(trained) == sorted((r, node) for r in (1, 2, 3) for node in participants(few, r))
    comm = pd.read_csv(exp / "federate" / "fedavg" / "comm.csv")
    assert comm.groupby("round").size().eq(4).all()  # every node joins the all-reduce, a left-out one with weight 0


def test_local_baselines_train_every_round_whatever_the_participation(few, tmp_path, monkeypatch):
    trained = recorded_training(monkeypatch)
    stage.run(FederateConfig(exp=copy_exp(few, tmp_path), strategy=("standalone",), **RUN))
    nodes = ["node0", "node1", "node2", "node3"]
    assert sorted(trained) == sorted((r, node) for r in (0, 1, 2, 3) for node in nodes)  # 3 of 4 federate a round


def test_anonymised_peers_go_through_the_server_and_no_client_receives_a_peer_model(reference, few, tmp_path):
    # comm.csv is the transport's log of every transfer (both engines write the same: see the distributed test)
    comm = pd.read_csv(reference / "federate" / "fedperl" / "comm.csv")
    choices = pd.read_csv(reference / "federate" / "fedperl" / "peers.csv")
    server = "node1"  # the default: the node holding the held-apart set
    assert set(comm.kind) == {"all-reduce", "peer-model", "anonymised-peer"}  # the server validates on its own set
    assert set(comm[comm.kind == "peer-model"].receiver) == {server}  # only the server receives individual models
    anonymised = comm[comm.kind == "anonymised-peer"]
    assert set(anonymised.sender) == {server}  # a client's one model comes from the server, naming no peer
    served = choices[choices.node != server].groupby(["round", "node"]).size()
    assert sorted(zip(anonymised["round"], anonymised.receiver)) == sorted(served.index)
    assert anonymised.groupby(["round", "receiver"]).size().eq(1).all()  # one model, whatever T
    assert not set(comm[comm.receiver != server].kind) - {"all-reduce", "anonymised-peer"}
    # with one peer, the anonymised model is that peer's model: the same numbers as without anonymisation
    runs = {}
    for anonymize in (False, True):
        exp = copy_exp(few, tmp_path / str(anonymize))
        stage.run(FederateConfig(exp=exp, strategy=("fedperl",), peers=1, anonymize=anonymize, **RUN))
        runs[anonymize] = exp
    assert model_bytes(runs[True], "fedperl") == model_bytes(runs[False], "fedperl")
    direct = pd.read_csv(runs[False] / "federate" / "fedperl" / "comm.csv")
    peers_csv = pd.read_csv(runs[False] / "federate" / "fedperl" / "peers.csv")
    sent = direct[direct.kind == "peer-model"]  # without anonymisation each peer sends to the node that chose it
    assert sorted(zip(sent["round"], sent.sender, sent.receiver)) == \
        sorted(zip(peers_csv["round"], peers_csv.peer, peers_csv.node))


def test_ac_counted_from_real_transfers_is_100t_without_anonymisation_and_100_with_it(reference, few, tmp_path):
    exp = copy_exp(few, tmp_path)
    stage.run(FederateConfig(exp=exp, strategy=("fedperl",), peers=2, **RUN))
    manifest = Manifest.load(few).data

    def received(folder, **config):
        return models_received(Run("x", None, config, pd.DataFrame(), pd.read_csv(folder / "comm.csv"), folder),
                               manifest)

    ssfl = received(reference / "federate" / "fedavg")
    assert ssfl == 1.0  # the average, once a round
    assert improvement(received(exp / "federate" / "fedperl"), ssfl) == 200  # T = 2 peer models
    assert improvement(received(reference / "federate" / "fedperl", anonymize=True), ssfl) == 100
    assert improvement(received(reference / "federate" / "fedmatch", anonymize=True), ssfl) == 100


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
    (["--anonymize", "--policy", "validation", "--server-node", "node0"],
     "the server validates the peers on the held-apart set, which node1 holds, not --server-node node0"),
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


def fake_run(strategy: str, scores: list[float], comm: pd.DataFrame, tmp_path, **config) -> Run:
    metrics = pd.DataFrame({"round": 3, "model_node": "global", "test_node": [f"node{i}" for i in range(len(scores))],
                            "f1_weighted": scores, "adaptive_ece": 0.1, "adaptive_mce": 0.2})
    folder = tmp_path / f"{strategy}-{len(list(tmp_path.iterdir()))}"
    folder.mkdir()
    return Run(strategy, None, {"ssl": "none", "labels": "visible", **config}, metrics, comm, folder)


def transfers(rows: list[tuple[int, str, str, str]], size: int = 100) -> pd.DataFrame:
    averages = [(r, f"node{i}", "all", "all-reduce") for r in (1, 2) for i in range(3)]
    return pd.DataFrame(averages + rows + [(1, "node0", "node1", "eval")],
                        columns=["round", "sender", "receiver", "kind"]).assign(bytes=size)


# FedPerl's Table 2 (the paper), mean F1 over clients, and its printed RI (%) against the local lower bound
TABLE_2 = {"lower local": (0.647, None), "lower fedavg": (0.698, 7.88), "ssfl": (0.734, 13.44),
           "fedmatch": (0.739, 14.22), "fedperl T=1": (0.746, 15.30), "fedperl T=2": (0.747, 15.46),
           "fedperl T=4": (0.741, 14.53), "PA fedperl T=5": (0.749, 15.77), "upper fedavg": (0.773, 19.47)}


@pytest.mark.parametrize("row", [name for name, (_, ri) in TABLE_2.items() if ri is not None])
def test_ri_from_table_2s_f1_scores_gives_its_printed_ri(row):
    f1, printed = TABLE_2[row]
    assert abs(improvement(f1, TABLE_2["lower local"][0]) - printed) < 0.1


def test_the_few_labels_table_reads_ri_against_the_local_lower_bound_and_ac_in_models_received(tmp_path):
    manifest = {"nodes": [{"name": f"node{i}"} for i in range(3)],
                "labels": {"fraction": 0.1, "held_apart": {"fraction": 0.1, "holder": "node1"}}}
    peer_to_each = [(r, f"node{(i + k) % 3}", f"node{i}", "peer-model") for r in (1, 2) for i in range(3) for k in (1, 2)]
    through_server = ([(r, f"node{i}", "node1", "peer-model") for r in (1, 2) for i in (0, 2)]
                      + [(r, "node1", f"node{i}", "anonymised-peer") for r in (1, 2) for i in (0, 2)])
    runs = [fake_run("standalone", [0.6, 0.647, 0.694], transfers([]), tmp_path),
            fake_run("fedavg", [0.698] * 3, transfers([]), tmp_path),
            fake_run("fedavg", [0.734] * 3, transfers([]), tmp_path, ssl="fixmatch"),
            fake_run("fedperl", [0.747] * 3, transfers(peer_to_each), tmp_path, peers=2, policy="static"),
            fake_run("fedperl", [0.746] * 3, transfers(through_server), tmp_path, peers=2, anonymize=True),
            fake_run("fedavg", [0.773] * 3, transfers([]), tmp_path, labels="all")]
    subs = [SubExperiment(tmp_path, {}, manifest, [run], [], [], []) for run in runs]
    table = few_labels_table(subs, "f1_weighted")
    frame = table.frame
    assert list(frame.index) == ["standalone [labelled only]", "fedavg [labelled only]", "fedavg [FixMatch]",
                                 "fedperl (T=2) [FixMatch]", "fedperl (T=2, PA) [FixMatch]", "fedavg [all labels]"]
    assert frame.loc["fedavg [labelled only]", "f1_weighted: mean (median) ± std over clients"] == \
        "0.698 (0.698) ± 0.000"
    ri = frame["RI (%)"].astype(float)
    assert abs(ri["fedavg [labelled only]"] - 7.88) < 0.1 and abs(ri["fedperl (T=2) [FixMatch]"] - 15.46) < 0.1
    assert frame.loc["fedavg [labelled only]", "RI vs labelled-only FedAvg (%)"] == "+0.00"
    # AC: T = 2 peers are 2 models beyond SSFL's one a round; anonymised, one (the server node1 left out)
    assert frame["AC (%)"].tolist()[2:5] == ["+0", "+200", "+100"]
    assert frame.loc["fedperl (T=2, PA) [FixMatch]", "bytes beyond SSFL (%)"] == "+133"  # 6 + 8 rows against 6
    assert "node1 held the held-apart set: real labelled images" in table.note
    no_labels_hidden = [SubExperiment(tmp_path, {}, {"nodes": manifest["nodes"]}, [runs[0]], [], [], [])]
    assert isinstance(few_labels_table(no_labels_hidden, "f1_weighted"), Missing)


def predicting(strategy: str, right: int, tmp_path, moved: float = 0.0, **config) -> Run:
    """A run whose final models are right on the first `right` of each client's 20 test images, wrong on the
    rest; its client mean `moved` above the round before."""
    labels = torch.arange(20) % 2
    probs = F.one_hot(torch.where(torch.arange(20) < right, labels, 1 - labels), 2).double()
    run = fake_run(strategy, [right / 20] * 2, transfers([]), tmp_path, seed=0, bootstrap=200, **config)
    final = run.metrics.assign(accuracy=right / 20)
    run.metrics = pd.concat([final.assign(round=2, accuracy=right / 20 - moved), final])
    save_tensors(run.folder / "predictions.safetensors",
                 {f"{key}/node{i}": t.clone() for i in range(2) for key, t in (("global", probs), ("labels", labels))})
    return run


def test_the_paired_few_labels_tables_difference_each_variant_on_the_same_test_images(tmp_path):
    manifest = {"nodes": [{"name": "node0"}, {"name": "node1"}], "label_names": ["a", "b"],
                "labels": {"fraction": 0.1}, "content_hash": "one partition"}
    runs = [predicting("standalone", 10, tmp_path), predicting("fedavg", 20, tmp_path),
            predicting("fedavg", 10, tmp_path, ssl="fixmatch"),
            predicting("fedperl", 20, tmp_path, peers=2, policy="static"),
            predicting("fedmatch", 10, tmp_path, peers=2), predicting("fedavg", 20, tmp_path, 0.01, labels="all")]
    subs = [SubExperiment(tmp_path, {}, manifest, [run], [], [], []) for run in runs]
    cells = against_ssfl_table(subs, "accuracy").frame.iloc[:, 0]
    assert cells["fedmatch (T=2) [FixMatch]"] == "+0.000 [+0.000, +0.000]"  # the same predictions: no difference
    assert cells["fedperl (T=2) [FixMatch]"].startswith("+0.500 [") and "fedavg [FixMatch]" not in cells
    regime = regime_table(subs, "accuracy").frame
    assert regime["holds"].tolist() == ["yes", "no"]  # above local training; level with labelled-only FedAvg
    assert regime.iloc[:, 0].tolist()[1] == "+0.000 [+0.000, +0.000]"
    assert set(regime["upper bound's change over its last evaluation interval"]) == {"+0.010"}
    other_partition = dict(manifest, content_hash="another partition")  # other test sets: nothing to pair
    apart = [SubExperiment(tmp_path, {}, other_partition if run is runs[2] else manifest, [run], [], [], [])
             for run in runs]
    assert isinstance(against_ssfl_table(apart, "accuracy"), Missing)


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
    confidence, accuracy, count = reliability(labels, probs)  # 40 images or fewer: one adaptive bin
    assert count.tolist() == [4] and accuracy.tolist() == [0.5]
    assert confidence == pytest.approx([(0.9 + 0.7 + 0.58 + 0.55) / 4])


def test_best_validation_reads_each_clients_round_of_best_validation_accuracy_only():
    metrics = pd.DataFrame({"round": [1, 1, 2, 2, 3, 3], "model_node": "global",
                            "test_node": ["node0", "node1"] * 3, "f1_weighted": [0.1, 0.2, 0.3, 0.4, 0.5, 0.6],
                            "validation_accuracy": [0.5, 0.9, 0.8, 0.2, 0.8, 0.3]})
    assert best_validation_scores(metrics, "f1_weighted") == {"node0": 0.3, "node1": 0.2}  # the first of ties
    shuffled = metrics.assign(f1_weighted=metrics.f1_weighted[::-1].to_numpy())  # the test scores do not choose
    assert best_validation_scores(shuffled, "f1_weighted") == {"node0": 0.4, "node1": 0.5}
    assert best_validation_scores(metrics.drop(columns="validation_accuracy"), "f1_weighted") == {}


def test_every_evaluated_round_scores_each_clients_validation_part(cli, tmp_path):
    exp = tmp_path / "exp"
    cli.ok("partition", "--nodes", "3", "--image-size", "16", "--labeled-fraction", "0.3", "--validation-fraction",
           "0.3", "--exp", exp)
    cli.ok("federate", "--exp", exp, "--strategy", "fedavg", "--strategy", "standalone", "--rounds", "2",
           "--epochs", "1", "--init-epochs", "0", "--batch", "8", "--bootstrap", "10", "--threads", "1")
    fed = engine.build(FederateConfig(exp=exp, strategy=("fedavg",), threads=1), Manifest.load(exp), 0)
    for name, key in (("fedavg", lambda node: "global"), ("standalone", lambda node: node)):
        metrics = pd.read_csv(exp / "federate" / name / "metrics.csv")
        scored = metrics[metrics.model_node != "ensemble"]  # the ensemble has no one model to score
        assert set(metrics["round"]) == {0, 1, 2} and scored.validation_accuracy.notna().all()
        final = metrics[(metrics["round"] == 2) & (metrics.model_node == metrics.test_node.map(key))]
        assert len(final) == 3
        for row in final.itertuples():  # the saved final model, scored here on the node's validation part
            held = fed.data.validation[row.test_node]
            model = fed.trainer.new_model(row.test_node)
            model.load_state_dict(load_tensors(exp / "federate" / name / "models" / f"{row.model_node}.safetensors",
                                               "model"))
            predicted = predict(model, held.images).argmax(axis=1)
            assert len(held.labels) and row.validation_accuracy == pytest.approx(
                float((predicted == held.labels.numpy()).mean()))
    cli.ok("report", exp)
    assert "each client's best-validation model" in (exp / "report" / "report.md").read_text()
