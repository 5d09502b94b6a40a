"""The VQ-VAE-2 that train-gan's vqvae2 kind trains (fedcli/gan/vqvae2.py) and federate's replay strategies
decode with: its networks and codebooks, a node's codes, and a node's decoder as federate loads it."""
