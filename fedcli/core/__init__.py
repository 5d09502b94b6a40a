"""The lowest layer: errors, consoles, keyed random streams, devices, progress, the recorded environment, pretrained
weights."""
