"""The runtime between nodes: transports, payloads, exact averaging, the torch.distributed group, the launcher and a
node's process. It knows no strategy and no generator: the kinds of transfer are passed in."""
