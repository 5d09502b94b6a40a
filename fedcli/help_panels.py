"""The help panels `train-gan --help` and `federate --help` group their options in (each was one flat panel of
60-odd options): every option of the command is placed, so a new option cannot land outside a panel."""

from __future__ import annotations

import inspect

OUTPUT = "Experiment and output"
ENGINE = "Engine"

TRAIN_GAN = {
    OUTPUT: ("exp", "node", "seed", "config", "overwrite", "tensorboard", "sample_only", "phase1_from"),
    "Generator and training": ("generator", "iterations", "patience", "select", "fid_every", "fid_images", "batch",
                               "lr", "r1_gamma", "ada_target", "ada_kimg", "ema_kimg", "style_mixing", "z_dim",
                               "w_dim", "channel_base", "channel_max", "fid_weights"),
    "Privacy loss (phase 2)": ("pp_iterations", "fid_factor", "alpha", "privacy_loss", "privacy_scale", "lpips_net",
                               "lpips_weights"),
    "Buffer and fidelity": ("truncation", "buffer_size", "fidelity_model", "fidelity_epochs", "fidelity_lr",
                            "fidelity_batch", "fidelity_seeds"),
    "Audit references and controls": ("controls", "reference", "lira_references", "tiny_node"),
    "Differential privacy": ("dp_epsilon", "dp_delta", "dp_max_grad_norm", "dp_noise"),
    "VQ-VAE-2 (--generator vqvae2)": ("vq_lr", "vq_beta", "vq_decay", "vq_codebook", "vq_dim", "vq_channels",
                                      "prior_iterations", "prior_channels", "prior_layers"),
    ENGINE: ("device", "engine", "launch", "timeout", "threads"),
}

FEDERATE = {
    OUTPUT: ("exp", "seed", "config", "overwrite", "tensorboard", "resume"),
    "Strategies and local training": ("strategy", "rounds", "epochs", "init_epochs", "lr", "lr_schedule",
                                      "lr_step_epochs", "lr_step_factor", "optimizer", "sgd_momentum",
                                      "weight_decay", "batch", "node_batch", "steps_per_round", "partial_batch",
                                      "participation", "weighting", "model", "pretrained", "model_weights"),
    "Few labels (FixMatch)": ("ssl", "labels", "confidence", "lambda_u", "unlabeled_ratio"),
    "Evaluation": ("eval_every", "bootstrap", "eval_statistics", "fold", "cv", "cross_eval"),
    ENGINE: ("device", "engine", "launch", "node", "timeout", "threads"),
}


def grouped(panels: dict[str, tuple[str, ...]], extra=lambda name: None):
    """A decorator putting each option of the command in its panel (`extra(name)`: the panel of an option the
    table does not list, such as a strategy's); an option in no panel is an error when fedcli is imported."""
    place = {name: panel for panel, names in panels.items() for name in names}

    def decorate(command):
        for name, parameter in inspect.signature(command).parameters.items():
            info = parameter.default
            if not hasattr(info, "rich_help_panel"):
                continue  # the context, not an option
            panel = place.get(name) or extra(name)
            if not panel:
                raise ValueError(f"option {name!r} of {command.__name__} is in no help panel: place it in "
                                 "fedcli/help_panels.py")
            info.rich_help_panel = panel
        return command
    return decorate
