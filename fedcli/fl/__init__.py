"""Federated training: payloads, transport, topology, local training, strategies, evaluation."""
