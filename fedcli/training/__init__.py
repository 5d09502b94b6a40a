"""A node's local training: the one loop, its objectives (FixMatch among them), the run's settings, split training."""
