"""train-gan: the generator protocol, the kinds' registry and config (each kind a sub-package), buffers, FID, fidelity,
DP-SGD."""
