"""Per-node conditional StyleGAN2-style GAN with the LPIPS privacy loss, and the synthetic buffer."""
