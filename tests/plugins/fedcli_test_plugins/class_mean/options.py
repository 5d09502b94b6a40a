"""The class-mean kind's options: OPTIONS, as train-gan's config looks for them."""

from __future__ import annotations

import dataclasses

from fedcli.generators.shared_options import LpipsOptions


@dataclasses.dataclass(frozen=True)
class ClassMeanOptions(LpipsOptions):
    """It reads the LPIPS options alone (its training records the perceptual network, as the audit needs)."""


OPTIONS = ClassMeanOptions
