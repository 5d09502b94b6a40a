"""The generative-replay study's VQ-VAE-2 (Qu et al.), trained serially across the nodes, with each node's
class-conditional PixelCNN prior over its codes: one generator kind (kind.py declares KIND, options.py
its OPTIONS), discovered by fedcli/generators/registry.py."""
