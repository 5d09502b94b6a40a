"""scikit-learn's bundled handwritten digits: real images that need no download (1,797 of 8x8)."""

from __future__ import annotations

import numpy as np

from fedcli.data.records import Sample, SourceData


def load_digit_images() -> tuple[np.ndarray, np.ndarray]:
    """Images as float in [0, 1] (N, 8, 8) and integer labels."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    return bunch.images.astype(np.float32) / 16.0, bunch.target.astype(np.int64)


def read() -> SourceData:
    _, labels = load_digit_images()
    samples = [Sample(id=f"digit-{i:04d}", label=int(y), site="digits", index=i) for i, y in enumerate(labels)]
    return SourceData(
        name="digits",
        samples=samples,
        label_names=[str(d) for d in range(10)],
        channels=1,
        augment=(),  # a mirrored or rotated digit is another symbol
        default_scheme="site-shift",
    )
