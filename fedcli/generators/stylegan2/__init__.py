"""FedER's per-node class-conditional StyleGAN2 with the LPIPS privacy loss: one generator kind (kind.py declares KIND,
options.py
its OPTIONS), discovered by
fedcli/generators/registry.py."""
