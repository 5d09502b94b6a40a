"""FedPerl's peer machinery against hand computations on three tiny models: features, the similarity matrix,
top-T peers, each policy's peer set, and the anonymised average."""

from __future__ import annotations

import math

import pytest
import torch

from fedcli.federate.strategies.peers import allowed, anonymised, choose, features, similarity, top_peers


def tiny(values: list[list[float]]) -> list[torch.Tensor]:
    return [torch.tensor(v) for v in values]


MODELS = [tiny([[1.0, 3.0], [2.0]]), tiny([[0.0, 2.0], [4.0]]), tiny([[2.0, 2.0], [2.0]])]


def test_features_are_each_tensors_mean_and_standard_deviation():
    assert features(MODELS[0]).tolist() == [2.0, 1.0, 2.0, 0.0]
    assert features(MODELS[1]).tolist() == [1.0, 1.0, 4.0, 0.0]


def test_the_similarity_matrix_matches_a_hand_computation():
    rows = torch.stack([features(m) for m in MODELS])  # [2,1,2,0], [1,1,4,0], [2,0,2,0]
    # min-max per feature: mean1 [1,0,1], std1 [1,1,0], mean2 [0,1,0], std2 constant -> [1,1,1]
    normalised = [[1, 1, 0, 1], [0, 1, 1, 1], [1, 0, 0, 1]]

    def cos(a, b):
        return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))

    expected = [[cos(a, b) for b in normalised] for a in normalised]
    assert torch.allclose(similarity(rows), torch.tensor(expected, dtype=torch.float64), atol=1e-12)


def test_top_peers_are_the_most_similar_others_with_ties_to_the_lower_index():
    sim = torch.tensor([[1.0, 0.2, 0.9, 0.9], [0.2, 1.0, 0.1, 0.3], [0.9, 0.1, 1.0, 0.5], [0.9, 0.3, 0.5, 1.0]])
    assert top_peers(0, sim, 2, [1, 2, 3]) == [2, 3]
    assert top_peers(0, sim, 1, [1, 2, 3]) == [2]  # the tie of 2 and 3 goes to 2
    assert top_peers(1, sim, 2, [0, 2, 3]) == [3, 0]
    assert top_peers(1, sim, 5, [0]) == [0]


@pytest.mark.parametrize("policy, threshold, expected", [
    ("static", None, [1, 2, 3]),
    ("validation", None, [2, 3]),            # at least client 0's own 0.7
    ("gated-validation", 0.75, [3]),
    ("gated-similarity", 0.85, [2, 3]),
    ("gated-similarity", 0.95, []),
])
def test_each_policy_allows_its_peers_on_a_constructed_case(policy, threshold, expected):
    sim = torch.tensor([[1.0, 0.2, 0.9, 0.9], [0.2, 1.0, 0.1, 0.3], [0.9, 0.1, 1.0, 0.5], [0.9, 0.3, 0.5, 1.0]])
    accuracy = [0.7, 0.6, 0.7, 0.8]
    assert allowed(0, policy, sim, [1, 2, 3], accuracy, threshold) == expected


@pytest.mark.parametrize("policy, threshold, expected", [
    ("static", None, [1]), ("validation", None, []), ("gated-validation", 0.85, []), ("gated-similarity", 0.5, [1])])
def test_a_policy_filters_the_top_peers_and_never_reaches_further_down_the_ranking(policy, threshold, expected):
    # the paper's order: top-T by similarity first, then the policy. Client 0 (accuracy 0.70) has T = 1: its top
    # peer, client 1 (0.9), validates at 0.60, so the validation policies keep no one, although client 3 (at
    # similarity 0.1) validates at 0.90
    sim = torch.tensor([[1.0, 0.9, 0.8, 0.1], [0.9, 1.0, 0.5, 0.2], [0.8, 0.5, 1.0, 0.3], [0.1, 0.2, 0.3, 1.0]])
    accuracy = [0.70, 0.60, 0.65, 0.90]
    assert choose(0, sim, 1, policy, accuracy, threshold) == expected
    assert choose(0, sim, 3, "validation", accuracy) == [3]  # with T = 3 the ranking reaches client 3


def test_the_anonymised_peer_is_the_mean_of_the_peers_models():
    states = [{"w": torch.tensor([1.0, 2.0]), "n": torch.tensor(3)}, {"w": torch.tensor([3.0, 6.0]), "n": torch.tensor(4)},
              {"w": torch.tensor([5.0, 1.0]), "n": torch.tensor(5)}]
    mean = anonymised(states)
    assert torch.allclose(mean["w"], torch.tensor([3.0, 3.0])) and mean["n"].item() == 4
    assert torch.equal(anonymised(states[::-1])["w"], mean["w"])  # whichever order the peers arrive in
