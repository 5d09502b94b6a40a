"""Data sources, partition schemes, the manifest, and the Dataset later stages train on."""
