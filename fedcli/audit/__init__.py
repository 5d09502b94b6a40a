"""Privacy audit: latent backprojection, distances, membership inference, buffer nearest neighbours."""
