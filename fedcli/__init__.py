"""fedcli: decentralized federated learning with experience replay of synthetic data (FedER)."""

__version__ = "0.1.0"  # the one place: pyproject.toml reads it (dynamic version)
