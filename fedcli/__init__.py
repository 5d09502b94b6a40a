"""fedcli: decentralized federated learning with experience replay of synthetic data (FedER)."""

__version__ = "0.1.0"
