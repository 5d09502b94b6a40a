"""The `fedcli` command line: option parsing and pretty output only; the stages hold the logic."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path
from typing import Any, Optional

import typer
from typer.core import TyperGroup

from fedcli import __version__, console, events, help_panels
from fedcli.config import (AuditConfig, Device, DpNoise, Engine, GanConfig, Launch, LpipsNet, Metric, ModelName,
                           PartitionConfig, PredictConfig, Preprocess, PrivacyLoss, PrivacyScale, ReportConfig, Scheme,
                           SelectRule, Source, Task, number_or_keyword, read_recipe, resolve)
from fedcli.errors import UserError, environment_message
from fedcli.fl.federate_config import (EvalStatistics, FederateConfig, Labels, LrSchedule, Optimizer, PartialBatch,
                                       Ssl, Weighting)
from fedcli.fl.strategies import REGISTRY
from fedcli.help_panels import grouped
from fedcli.layout import check_experiment_folder
from fedcli.pipeline.shipped import locate, shipped_recipes

EXP_HELP = "Experiment folder; the stage reads and writes only inside it."
CONFIG_HELP = "TOML recipe; its \\[stage] table sets options, which options given here override."
THREADS_HELP = "CPU threads torch may use \\[default: torch's, every core]; CPU results depend on it."
TENSORBOARD_HELP = ("Also write the stage's events (<exp>/logs/<stage>/events.jsonl) as TensorBoard scalars under "
                    "<exp>/logs/tensorboard/; needs the tensorboard extra: pip install 'fedcli\\[tensorboard]'.")


class OneLineErrors(TyperGroup):
    """Every error a user can cause ends in one line and exit code 2, with no traceback."""

    def main(self, *args: Any, standalone_mode: bool = True, **kwargs: Any) -> Any:
        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **kwargs)
        try:
            code = super().main(*args, standalone_mode=False, **kwargs)
        except UserError as exc:
            console.error(str(exc))
            sys.exit(2)
        except OSError as exc:  # the environment's failures: disk full, no permission, a file in the way
            console.error(environment_message(exc))
            sys.exit(2)
        except typer.Abort:
            console.error("aborted")
            sys.exit(1)
        except Exception as exc:  # the CLI parser's own usage errors
            if not hasattr(exc, "format_message") or not hasattr(exc, "exit_code"):
                raise
            if type(exc).__name__ == "NoArgsIsHelpError":  # a bare command asks for its help, printed already
                sys.exit(0)
            command = getattr(getattr(exc, "ctx", None), "command_path", "fedcli")
            console.error(f"{usage_message(exc.format_message())} (see '{command} --help')")
            sys.exit(exc.exit_code)
        sys.exit(code if isinstance(code, int) else 0)


def usage_message(message: str) -> str:
    """The parser's message; values left over after an option are most often a list written after one option,
    which each value needs repeated before it."""
    if message.startswith("Got unexpected extra argument"):
        return (f"{message}: an option takes one value, so repeat a repeatable option before each of its values "
                "(e.g. --communities 5 --communities 3)")
    return message


app = typer.Typer(
    cls=OneLineErrors,
    help="Decentralized federated learning on medical images with experience replay of "
    "privacy-preserving synthetic data (FedER).\n\n"
    "Stages, each reading the previous one's artifacts from --exp DIR: "
    "partition -> train-gan -> federate -> audit-privacy -> report.",
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},  # every command inherits it
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)


def show_version(value: bool) -> None:
    if value:
        console.out.print(f"fedcli {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: bool = typer.Option(False, "--version", callback=show_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    """fedcli."""


def resolved_config(ctx: typer.Context, cls: type, table: str):
    """The command's config: options given on the command line, else the recipe's [table], else defaults."""
    params = dict(ctx.params)
    given = {name for name in params if (src := ctx.get_parameter_source(name)) and src.name == "COMMANDLINE"}
    recipe = params.pop("config")
    cfg = resolve(cls, params, given, recipe, table)
    ignored = [f"[{t}]" for t in ("sweep", "select") if recipe is not None and t in read_recipe(recipe)]
    if ignored:
        console.out.print(f"note: {recipe}'s {' and '.join(ignored)} apply only under fedcli run; this command used "
                          f"its [{table}] table as it stands", markup=False, soft_wrap=True)
    return cfg


@app.command(epilog="Example: fedcli partition --source digits --nodes 3 --exp results/demo")
def partition(
    ctx: typer.Context,
    exp: Optional[Path] = typer.Option(None, "--exp", help=EXP_HELP, show_default=False),
    source: Source = typer.Option(PartitionConfig.source, help="Dataset reader: digits (built in, offline), tuberculosis, "
                                  "isic2019, medmnist, folders, csv, retinopathy (Kaggle DR, the generative-replay "
                                  "study's binary task)."),
    data_dir: Optional[Path] = typer.Option(None, help="Where the real data lies (a folder; a .npz or .csv "
                                            "file for medmnist/csv). Not used by digits."),
    scheme: Optional[Scheme] = typer.Option(None, help="How samples become nodes. Default: site-shift for "
                                            "digits, iid for medmnist, source otherwise.", show_default=False),
    nodes: Optional[int] = typer.Option(None, help="Number of nodes for iid, dirichlet, skew and site-shift "
                                        "\\[default: 3].", show_default=False),
    alpha: float = typer.Option(PartitionConfig.alpha, help="Dirichlet concentration; smaller = stronger label skew."),
    ks: Optional[float] = typer.Option(None, help="--scheme skew: the mean pairwise label skew the equal-sized nodes "
                                       "reach within 0.02: the Kolmogorov-Smirnov statistic for two classes, total "
                                       "variation (KS's value for two classes, independent of class order) for more.",
                                       show_default=False),
    shared_fraction: float = typer.Option(PartitionConfig.shared_fraction, help="Share of all training images set "
                                          "apart as a class-balanced globally shared set (fedavg-share gives it to "
                                          "every node; for every strategy those images leave their nodes' training "
                                          "sets). 0: none."),
    global_test: int = typer.Option(PartitionConfig.global_test, help="Images set apart first as a fixed, "
                                    "class-balanced global test set (the same images at every seed and --ks), "
                                    "held by every node for evaluation only; federate scores every model on it "
                                    "(global_test.csv) beside the nodes' own test sets. 0: none."),
    labeled_fraction: float = typer.Option(PartitionConfig.labeled_fraction, help="Few labels: share of each "
                                           "node's training images whose labels stay visible, per class, at least "
                                           "one per class present; the rest become its unlabelled part (labels "
                                           "hidden from every stage). 1: all visible."),
    validation_fraction: float = typer.Option(PartitionConfig.validation_fraction, help="Few labels: share of each "
                                              "labelled node's training images, per class, set apart as its "
                                              "labelled validation part."),
    communities: list[int] = typer.Option([], help="site-shift: repeatable group sizes of consecutive nodes that "
                                          "share a simulated scanner, one option per group, e.g. --communities 5 "
                                          "--communities 3 --communities 1 --communities 1 (FedPerl's communities) "
                                          "\\[default: every node its own].", show_default=False),
    scanners: list[str] = typer.Option([], help="site-shift: repeatable names of the simulated scanners, in the "
                                       "order nodes (or communities) take them: gamma0.5, blur, invert, noise, "
                                       "contrast, gamma2 \\[default: all six, in that order].", show_default=False),
    labeled_nodes: Optional[list[str]] = typer.Option(None, help="Few labels: only these nodes keep labels (repeat "
                                                      "the option); none: no node does (labels only in the "
                                                      "held-apart set) \\[default: every node].", show_default=False),
    held_apart_fraction: float = typer.Option(PartitionConfig.held_apart_fraction, help="Few labels: share of all "
                                              "training images set apart, class-balanced with their labels, as the "
                                              "global validation set (FedPerl's), held by --held-apart-node."),
    held_apart_node: Optional[str] = typer.Option(None, help="The node that holds the held-apart set (real "
                                                  "labelled images of every node) \\[default: the first].",
                                                  show_default=False),
    site: Optional[str] = typer.Option(None, help="Keep one site of a multi-site source before an iid split "
                                       "(e.g. shenzhen)."),
    task: Task = typer.Option(PartitionConfig.task, help="isic2019 only: melanoma (binary, FedER) or multiclass (8)."),
    retina_balanced: bool = typer.Option(PartitionConfig.retina_balanced, help="retinopathy only: the "
                                         "generative-replay study's selection, --retina-per-class images of each "
                                         "class drawn at random (the same images for every --seed and --ks); the "
                                         "rest are counted as dropped. Default: every left-eye image of grade 0 "
                                         "and 2-4."),
    retina_per_class: int = typer.Option(PartitionConfig.retina_per_class, help="retinopathy only: the images of "
                                         "each class --retina-balanced keeps (the study's 3000 training + 1500 "
                                         "validation + 1500 test; the partition splits them)."),
    retina_preprocess: Preprocess = typer.Option(PartitionConfig.retina_preprocess, help="retinopathy only: graham "
                                                 "(Graham's: the eye's radius scaled to 300 px, the local average "
                                                 "colour subtracted, the rim masked and cropped, as the study) or "
                                                 "none; applied whenever an image is read."),
    positive_class: Optional[str] = typer.Option(None, help="A binary task's positive class, whose sensitivity "
                                                 "and specificity federate reports \\[default: the second class: the "
                                                 "finding of every built-in binary source].", show_default=False),
    test_fraction: float = typer.Option(PartitionConfig.test_fraction, help="Share of each node held out as a class-balanced test set."),
    train_size: Optional[int] = typer.Option(None, help="Keep at most this many training images per node, a "
                                             "class-stratified draw (a smaller hospital, its test set unchanged) "
                                             "\\[default: all].", show_default=False),
    class_mix: list[str] = typer.Option([], help="NODE=CLASS:SHARE, repeatable: that node's images drawn, before "
                                        "its test split, so that CLASS makes SHARE of them (a node whose case mix "
                                        "differs, FedPerl's client 8), e.g. node8=normal:0.75.", show_default=False),
    folds: int = typer.Option(PartitionConfig.folds, help="Stratified cross-validation folds over each node's train part."),
    image_size: int = typer.Option(PartitionConfig.image_size, help="Image side in pixels for every later stage: a power "
                                   "of two from 16 to 1024 (every stage holds a node's images in memory)."),
    channels: Optional[int] = typer.Option(None, help="1 (grayscale) or 3 (RGB). Default: what the images "
                                           "are.", show_default=False),
    bit_depth: str = typer.Option(PartitionConfig.bit_depth, parser=number_or_keyword, help="Deeper-than-8-bit "
                                  "files' full scale, 2^N - 1, one for the whole dataset: 8, 10, 12, 14, 16, or auto "
                                  "(the smallest that holds the data's largest value). 8-bit and DICOM files keep "
                                  "their own."),
    seed: int = typer.Option(PartitionConfig.seed, help="Seed of every random choice."),
    threads: Optional[int] = typer.Option(None, help=THREADS_HELP, show_default=False),
    config: Optional[Path] = typer.Option(None, "--config", help=CONFIG_HELP, show_default=False),
    overwrite: bool = typer.Option(PartitionConfig.overwrite, help="Replace an existing <exp>/partition."),
) -> None:
    """Split a dataset into federated nodes with class-balanced test sets and CV folds.

    Writes <exp>/partition/manifest.json, summary.csv, summary.png and config.json.
    """
    from fedcli.data.partition import run
    from fedcli.data.summary import partition_table, short_test_notes, untested_class_notes
    from fedcli.fl.strategies import REGISTRY

    cfg = resolved_config(ctx, PartitionConfig, "partition")
    manifest = run(cfg, REGISTRY.reserved_names())
    console.out.print(partition_table(manifest))
    for key, count in (manifest["dropped"] or {}).items():
        if count:
            console.out.print(f"dropped {count} images with {key}")
    if manifest.scale.bit_depth != 8:
        console.out.print(f"files deeper than 8 bits are read on one scale: {manifest.scale.describe()}")
    for note in short_test_notes(manifest) + untested_class_notes(manifest):
        console.out.print(f"note: {note}")
    console.out.print(f"wrote {manifest.path.parent}")


@app.command("train-gan", epilog="Example: fedcli train-gan --exp results/demo --node node0")
@grouped(help_panels.TRAIN_GAN)
def train_gan(
    ctx: typer.Context,
    exp: Optional[Path] = typer.Option(None, "--exp", help=EXP_HELP, show_default=False),
    node: Optional[str] = typer.Option(None, "--node", "--node-name", help="Train this node only (hospitals can run "
                                       "separately); distributed: the node this process is \\[default: by rank]. "
                                       "Default: every node in turn.", show_default=False),
    generator: str = typer.Option(GanConfig.generator, help="Kind of generator: stylegan2 (FedER's GAN, per node) "
                                  "or vqvae2 (the generative-replay study's VQ-VAE-2, trained serially across the "
                                  "nodes: --iterations steps at each, --batch; its own options say vqvae2). The "
                                  "options below are the stylegan2 kind's unless said otherwise."),
    seed: Optional[int] = typer.Option(None, help="Seed \\[default: the partition's].", show_default=False),
    iterations: int = typer.Option(GanConfig.iterations, help="Phase 1 (standard GAN) iteration cap."),
    patience: int = typer.Option(GanConfig.patience, help="Phase 1 stops when no check has come within the "
                                 "noise of the lowest FID (--select stable), or matched the best reading (--select "
                                 "fidelity), for this many iterations."),
    select: SelectRule = typer.Option(GanConfig.select, help="Phase 1's snapshot: stable (the latest whose FID is "
                                      "within the checks' own noise, the median change of log FID between checks, "
                                      "of the lowest reading; --patience counts from it), last (every "
                                      "--iterations, the last snapshot: a fixed-iteration generator) or fidelity "
                                      "(at each FID check the snapshot's buffer trains one --fidelity-* classifier, "
                                      "scored on the node's training images; the highest is kept: costs a "
                                      "classifier per check). Under --dp-epsilon always last (fidelity refused)."),
    pp_iterations: Optional[int] = typer.Option(None, help="Phase 2 (privacy loss) iteration cap \\[default: 100; 0 "
                                                "under --dp-epsilon, which refuses any other].", show_default=False),
    fid_every: int = typer.Option(GanConfig.fid_every, help="Iterations between FID evaluations."),
    fid_images: int = typer.Option(GanConfig.fid_images, help="Generated (and at most real) images per FID evaluation."),
    fid_factor: float = typer.Option(GanConfig.fid_factor, help="Phase 2 stops when FID exceeds this times the kept "
                                     "phase-1 snapshot's FID."),
    alpha: float = typer.Option(GanConfig.alpha, help="Weight of the privacy loss: G minimises L_G - alpha * L_PP."),
    privacy_loss: PrivacyLoss = typer.Option(GanConfig.privacy_loss, help="L_PP: all-pairs (the study: each synthetic "
                                             "image's mean LPIPS to the batch's real images) or nearest (its LPIPS "
                                             "to its nearest real training image)."),
    privacy_scale: PrivacyScale = typer.Option(GanConfig.privacy_scale, help="L_PP in LPIPS units (absolute, the "
                                               "study) or divided by the node's own real-vs-real distance of the "
                                               "same form (relative), so alpha means the same for every backbone."),
    batch: int = typer.Option(GanConfig.batch, help="Real and synthetic images per step (L_PP grows with it)."),
    lr: float = typer.Option(GanConfig.lr, help="Adam learning rate of G and D."),
    r1_gamma: str = typer.Option(GanConfig.r1_gamma, parser=number_or_keyword,
                                 help="R1 regularisation weight; auto: 0.0002 x resolution^2 / batch (StyleGAN2-ADA)."),
    ada_target: float = typer.Option(GanConfig.ada_target, help="ADA target for E[sign(D(real))]."),
    ada_kimg: str = typer.Option(GanConfig.ada_kimg, parser=number_or_keyword,
                                 help="ADA speed: thousands of images for p to go from 0 to 1; auto: a tenth of "
                                 "phase 1's images."),
    ema_kimg: str = typer.Option(GanConfig.ema_kimg, parser=number_or_keyword,
                                 help="Half-life of the EMA generator in thousands of images (ramped up over the "
                                 "first twentieth of the images seen); auto: the reference's 10 x batch / 32."),
    style_mixing: float = typer.Option(GanConfig.style_mixing, help="Share of training batches whose blocks take "
                                       "their w from two latents (style-mixing regularisation)."),
    truncation: float = typer.Option(GanConfig.truncation, help="Buffer sampling: pull each w towards its class's "
                                     "mean w (1: none, 0: the mean image of each class)."),
    z_dim: int = typer.Option(GanConfig.z_dim, help="Latent z size."),
    w_dim: int = typer.Option(GanConfig.w_dim, help="Intermediate latent w size."),
    channel_base: int = typer.Option(GanConfig.channel_base, help="Feature maps at resolution r: min(base / r, max)."),
    channel_max: int = typer.Option(GanConfig.channel_max, help="Most feature maps per layer."),
    lpips_net: LpipsNet = typer.Option(GanConfig.lpips_net, help="LPIPS backbone: alex (quick default) or vgg (the study)."),
    lpips_weights: Optional[Path] = typer.Option(None, help="torchvision ImageNet weights of the LPIPS backbone "
                                                 "\\[default: the torch hub cache, else a named random fallback].",
                                                 show_default=False),
    fid_weights: Optional[Path] = typer.Option(None, help="torch-fidelity's TF-ported Inception-v3 weights for FID, "
                                               "as published FIDs \\[default: the torch hub cache, else a "
                                               "classifier of the node's images].", show_default=False),
    buffer_size: int = typer.Option(GanConfig.buffer_size, help="Synthetic images in the shared buffer (class-interleaved)."),
    fidelity_model: ModelName = typer.Option(GanConfig.fidelity_model, help="Fidelity score's classifier (use "
                                             "federate's --model)."),
    fidelity_epochs: int = typer.Option(GanConfig.fidelity_epochs, help="Fidelity classifier's epochs over the real "
                                        "training images (federate's init epochs + rounds x epochs); the buffer "
                                        "gets as many steps."),
    fidelity_lr: float = typer.Option(GanConfig.fidelity_lr, help="Fidelity classifier's learning rate (federate's --lr)."),
    fidelity_batch: int = typer.Option(GanConfig.fidelity_batch, help="Fidelity classifier's batch (federate's --batch)."),
    fidelity_seeds: int = typer.Option(GanConfig.fidelity_seeds, help="Classifier seeds the fidelity score averages "
                                       "over; 0 skips it."),
    controls: bool = typer.Option(GanConfig.controls, help="Also train the reseeded control (phase 2 at alpha 0 "
                                  "from the same snapshot with another random stream): the null pair that "
                                  "audit-privacy --controls needs, and a GAN trained as long on a tiny subset of "
                                  "the node: the tiny-node control."),
    reference: int = typer.Option(GanConfig.reference, help="Also train a reference GAN (phase 1's recipe) on the "
                                  "node's train images minus the first N that audit-privacy scores as members, for "
                                  "the calibrated attack (GAN-Leaks-cal; audit with --max-images at most N). 0: none."),
    lira_references: int = typer.Option(GanConfig.lira_references, help="Also train K reference generators per node "
                                        "for audit-privacy's LiRA membership game, each exactly as the released one "
                                        "(phase 1 and 2, or DP) on the node's train images outside the audited "
                                        "members plus a random half of its members and as many class-matched test "
                                        "images (complementary halves: every image IN for K/2). Even; 0: none. "
                                        "Costs K x the node's training."),
    tiny_node: int = typer.Option(GanConfig.tiny_node, help="Training images of the tiny-node control (--controls; at "
                                  "most a quarter of the node's), class by class."),
    dp_epsilon: Optional[str] = typer.Option(None, parser=number_or_keyword, show_default=False, help=(
        "Train each discriminator with DP-SGD (Opacus: Poisson sampling, per-image clipping, Gaussian noise "
        "solved for this epsilon over the planned iterations, RDP accountant); the generator and buffer are then "
        "(epsilon, delta)-DP per training image. inf: the DP code path without noise; off: no DP. Turns off ADA, "
        "FID early stopping and snapshot choice, phase 2 and minibatch std; fake labels uniform. vqvae2: the "
        "chain hands on weights alone, the VQ-VAE-2 (gradient codebooks) and each node's prior train by DP-SGD "
        "under one guarantee, and only prior samples are released (needs --prior-iterations).")),
    dp_delta: Optional[float] = typer.Option(None, help="DP delta \\[default: 1 / (10 x the node's training images); "
                                             "at least 1 / N is refused].", show_default=False),
    dp_max_grad_norm: float = typer.Option(GanConfig.dp_max_grad_norm, help="DP clipping bound C: each real image's "
                                           "gradient over all discriminator (vqvae2: VQ-VAE-2, prior) parameters "
                                           "is clipped to this L2 norm."),
    dp_noise: DpNoise = typer.Option(GanConfig.dp_noise, help="Where DP-SGD's Gaussian noise comes from: keyed (a "
                                     "stream of the run's seed: reproducible, but private only while the seed, which "
                                     "config.json records, stays secret) or secure (ChaCha20 seeded by the OS's "
                                     "entropy, for deployment: the run is not reproducible). Needs --dp-epsilon."),
    vq_lr: float = typer.Option(GanConfig.vq_lr, help="vqvae2: Adam learning rate of the VQ-VAE-2 and its priors."),
    vq_beta: float = typer.Option(GanConfig.vq_beta, help="vqvae2: commitment weight beta."),
    vq_decay: float = typer.Option(GanConfig.vq_decay, help="vqvae2: the codebooks' EMA decay."),
    vq_codebook: int = typer.Option(GanConfig.vq_codebook, help="vqvae2: codes in each level's codebook."),
    vq_dim: int = typer.Option(GanConfig.vq_dim, help="vqvae2: size of a code vector."),
    vq_channels: int = typer.Option(GanConfig.vq_channels, help="vqvae2: feature maps of its encoders and decoders."),
    prior_iterations: int = typer.Option(GanConfig.prior_iterations, help="vqvae2: steps of each node's "
                                         "class-conditional PixelCNN prior over its codes, whose samples are then "
                                         "the buffer; 0: no prior, the buffer is the decoded codes (reconstructions "
                                         "of real images)."),
    prior_channels: int = typer.Option(GanConfig.prior_channels, help="vqvae2: feature maps of the prior."),
    prior_layers: int = typer.Option(GanConfig.prior_layers, help="vqvae2: gated masked layers of the prior."),
    sample_only: bool = typer.Option(GanConfig.sample_only, help="Only re-sample the buffer (e.g. another --buffer-size) from "
                                     "the saved generator."),
    phase1_from: Optional[Path] = typer.Option(None, help="An experiment whose train-gan ran the same phase 1 (the "
                                               "same options but --alpha, --privacy-loss, --privacy-scale, "
                                               "--pp-iterations, --fid-factor, the buffer's and the side GANs', on "
                                               "the same partition): phase 2 and the control start from its kept "
                                               "phase-1 state instead of retraining it, with the same results. "
                                               "Refused where phase 1 would differ.", show_default=False),
    device: Device = typer.Option(GanConfig.device, help="auto (CUDA when present), cpu or cuda."),
    engine: Engine = typer.Option(GanConfig.engine, help="vqvae2: inprocess (the chain runs here) or distributed "
                                  "(one torch.distributed process per node; each waits for its predecessor's "
                                  "training). stylegan2 trains each node alone: --node on each node's machine."),
    launch: Launch = typer.Option(GanConfig.launch, help="local: start one process per node on this machine "
                                  "(loopback); none: this process is one node, started by torchrun."),
    timeout: float = typer.Option(GanConfig.timeout, help="Distributed: seconds a transfer waits for a peer, and a "
                                  "peer's heartbeat may stay silent, before the run stops."),
    threads: Optional[int] = typer.Option(None, help=THREADS_HELP, show_default=False),
    config: Optional[Path] = typer.Option(None, "--config", help=CONFIG_HELP, show_default=False),
    overwrite: bool = typer.Option(GanConfig.overwrite, help="Replace existing <exp>/gan/<node> folders."),
    tensorboard: bool = typer.Option(False, help=TENSORBOARD_HELP),
) -> None:
    """Train each node's conditional GAN with the LPIPS privacy loss and sample its synthetic buffer (or, with
    --generator vqvae2, a VQ-VAE-2 serially across the nodes, and each node's codes and prior).

    Writes <exp>/gan/<node>/: generator.safetensors, generator_phase1.safetensors, buffer.safetensors,
    metrics.csv, samples.png, config.json (vqvae2: generator.safetensors, codes.safetensors, buffer.safetensors,
    metrics.csv, samples.png, config.json).
    """
    from fedcli.gan.stage import run
    from fedcli.report.tables import gan_table, vqvae2_table

    cfg = resolved_config(ctx, GanConfig, "train_gan")
    with events.tensorboard(tensorboard):
        summaries = run(cfg)
    if not cfg.sample_only and all("phase1" in s for s in summaries):  # the table reads the StyleGAN kind's record
        console.out.print(gan_table(summaries))
    elif summaries and all("serial" in s for s in summaries):
        console.out.print(vqvae2_table(summaries))
    console.out.print(f"wrote {cfg.exp / 'gan'}")


def with_strategy_options(command):
    """`command` with one option per strategy option of the registry (fl/strategies/) in place of its
    `**strategy_options`: the help names the strategies that take each one and their defaults."""
    signature = inspect.signature(command)
    params = [p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]
    at = next(i for i, p in enumerate(params) if p.name == "weighting")
    added = []
    for name, field in REGISTRY.options().items():
        defaults: dict[str, list[str]] = {}
        for declaration in REGISTRY.declaring(name):
            default = getattr(declaration.options(), name)
            defaults.setdefault("all" if default is None else str(default), []).append(declaration.name)
        who = "; ".join(f"{', '.join(names)}: {default}" for default, names in defaults.items())
        option = typer.Option(None, help=f"{field.metadata['help']} \\[{who}]",
                              show_default=False)
        added.append(inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=option,
                                       annotation=Optional[REGISTRY.option_type(name)]))
    command.__signature__ = signature.replace(parameters=params[:at] + added + params[at:])
    command.__annotations__ = {**command.__annotations__, **{p.name: p.annotation for p in added}}
    return command


STRATEGY_LIST = "\n\n".join(f"{d.name}: {d.summary}." for d in REGISTRY)


@app.command(epilog="Example: fedcli federate --strategy feder --strategy fedavg --exp results/demo",
             help="Run FedER and the baselines on the partition.\n\nWrites <exp>/federate/<strategy>/: metrics.csv, "
             "bn_statistics.csv, comm.csv, models/, config.json.\n\nStrategies (--strategy):\n\n" + STRATEGY_LIST)
@grouped(help_panels.FEDERATE, extra=lambda name: name in REGISTRY.options() and REGISTRY.declaring(name)[0].panel)
@with_strategy_options
def federate(
    ctx: typer.Context,
    exp: Optional[Path] = typer.Option(None, "--exp", help=EXP_HELP, show_default=False),
    strategy: list[str] = typer.Option(list(FederateConfig.strategy), help="Repeatable: "
                                       f"{', '.join(REGISTRY.names())} (listed above)."),
    rounds: int = typer.Option(FederateConfig.rounds, help="Federated rounds R."),
    epochs: int = typer.Option(FederateConfig.epochs, help="Local epochs E per round."),
    init_epochs: Optional[int] = typer.Option(None, help="Epochs before round 1 (round 0): each node trains its "
                                              "own model (FedER's M^0), or the common initial model, then averaged "
                                              "(FedAvg, FedProx, FedBN) \\[default: E].", show_default=False),
    lr: float = typer.Option(FederateConfig.lr, help="Learning rate (a fresh optimiser every round)."),
    lr_schedule: LrSchedule = typer.Option(FederateConfig.lr_schedule, help="constant; cosine: from --lr down "
                                           "to 0, step by step, over the whole budget (init-epochs + R x E), the "
                                           "same for every strategy, so the final weights are at rest; step: --lr "
                                           "times --lr-step-factor every --lr-step-epochs epochs of that budget."),
    lr_step_epochs: int = typer.Option(FederateConfig.lr_step_epochs, help="--lr-schedule step: epochs between "
                                       "decays (the generative-replay study: 35)."),
    lr_step_factor: float = typer.Option(FederateConfig.lr_step_factor, help="--lr-schedule step: the factor of "
                                         "each decay (the generative-replay study: 0.1)."),
    optimizer: Optimizer = typer.Option(FederateConfig.optimizer, help="adam (FedER's study), or sgd with "
                                        "--sgd-momentum (the generative-replay study's)."),
    sgd_momentum: float = typer.Option(FederateConfig.sgd_momentum, help="--optimizer sgd: momentum."),
    weight_decay: float = typer.Option(FederateConfig.weight_decay, help="L2 weight decay of either optimiser."),
    batch: int = typer.Option(FederateConfig.batch, help="Real images per mini-batch (FedER adds as many "
                              "buffer images)."),
    node_batch: list[str] = typer.Option([], help="Repeatable NODE=B: a node's own batch size (the study: "
                                         "shenzhen=32, montgomery=8)."),
    weighting: Weighting = typer.Option(FederateConfig.weighting, help="Averaging strategies: weight each node's "
                                        "model by its train-set size (samples) or equally (equal, as FedBN's code "
                                        "and the study)."),
    ssl: Ssl = typer.Option(FederateConfig.ssl, help="Few labels (partition --labeled-fraction): fixmatch trains each "
                            "node also on its unlabelled images (FixMatch: standalone is local FixMatch, fedavg is "
                            "SSFL); none: the visible labels only (the lower bound)."),
    labels: Labels = typer.Option(FederateConfig.labels, help="Few labels: all gives every training image its hidden "
                                  "label (partition/hidden_labels.json), the oracle of the upper bounds; visible: "
                                  "only the labels the partition shows."),
    confidence: float = typer.Option(FederateConfig.confidence, help="FixMatch: the confidence a weak view's "
                                     "prediction needs to become a pseudo label (tau; FedPerl's code 0.6)."),
    lambda_u: float = typer.Option(FederateConfig.lambda_u, help="FixMatch: the unlabelled loss's weight (FedPerl's "
                                   "code 0.5)."),
    unlabeled_ratio: int = typer.Option(FederateConfig.unlabeled_ratio, help="FixMatch: unlabelled images per "
                                        "labelled one in a batch (mu; FedPerl's code 1)."),
    steps_per_round: Optional[int] = typer.Option(None, help="Each local epoch is this many batches, the labelled "
                                                  "images cycled without replacement, whatever a node's size (FedVC; "
                                                  "FedPerl's 100) \\[default: one pass over them].",
                                                  show_default=False),
    partial_batch: Optional[PartialBatch] = typer.Option(None, help="An epoch's last, partial batch for every "
                                                         "strategy: keep (ceil(n/b) steps) or drop (floor(n/b), "
                                                         "full batches only, the generative-replay study's) "
                                                         "\\[default: each strategy's own: cwt, cwt-replay drop, "
                                                         "the others keep].", show_default=False),
    participation: float = typer.Option(FederateConfig.participation, help="Averaging strategies: the share of the "
                                        "nodes that train in each round after round 0, round(share x nodes) of them "
                                        "(at least one), drawn per seed and round (FedPerl's 30%)."),
    model: list[str] = typer.Option(list(FederateConfig.model), help="Repeatable. Classifier: cnn (quick), "
                                    "resnet18 (the FedER study), resnet34 (the generative-replay study), resnet50, "
                                    "densenet121, efficientnet_b0 (FedPerl's); NODE=ARCH gives a node its own "
                                    f"({' and '.join(d.name for d in REGISTRY if d.own_architectures)} only: their "
                                    "models never move)."),
    pretrained: bool = typer.Option(FederateConfig.pretrained, help="Start from ImageNet weights (torch hub "
                                    "cache or --model-weights)."),
    model_weights: Optional[Path] = typer.Option(None, help="torchvision ImageNet state dict for --pretrained.",
                                                 show_default=False),
    eval_every: int = typer.Option(FederateConfig.eval_every, help="Rounds between evaluations (and the last)."),
    bootstrap: int = typer.Option(FederateConfig.bootstrap, help="Bootstrap resamples for 95% intervals."),
    eval_statistics: EvalStatistics = typer.Option(FederateConfig.eval_statistics, help="BatchNorm statistics "
                                                   "every model is scored with: stored (its running statistics, as "
                                                   "trained and averaged) or local (re-estimated on the evaluating "
                                                   "node's own training images, labels unread: a hospital "
                                                   "calibrating a received model)."),
    fold: Optional[int] = typer.Option(None, help="Train on the other train folds, evaluate on fold k (model "
                                       "selection without the test set).", show_default=False),
    cv: bool = typer.Option(FederateConfig.cv, help="Run every fold and report mean and std."),
    seed: Optional[int] = typer.Option(None, help="Seed \\[default: the partition's].", show_default=False),
    device: Device = typer.Option(FederateConfig.device, help="auto (CUDA when present), cpu or cuda."),
    engine: Engine = typer.Option(FederateConfig.engine, help="inprocess (every node simulated here) or "
                                  "distributed (one torch.distributed process per node: gloo on CPU, nccl on CUDA)."),
    launch: Launch = typer.Option(FederateConfig.launch, help="local: start one process per node on this machine "
                                  "(loopback); none: this process is one node, started by torchrun."),
    node: Optional[str] = typer.Option(None, "--node", "--node-name", help="Distributed: the node this process is "
                                       "\\[default: by rank]. Under torchrun write --node-name (torchrun reads --node "
                                       "as its --node-rank).", show_default=False),
    timeout: float = typer.Option(FederateConfig.timeout, help="Distributed: seconds any transfer or collective "
                                  "waits for a peer before the run stops."),
    cross_eval: bool = typer.Option(FederateConfig.cross_eval, help="Distributed: send every node's model to every "
                                    "node to fill the model x test-set matrix (counted as eval traffic)."),
    threads: Optional[int] = typer.Option(None, help="CPU threads per process \\[default: torch's; distributed "
                                          "local: cores / nodes].", show_default=False),
    resume: bool = typer.Option(FederateConfig.resume, help="Continue from the last completed round (either "
                                "engine's checkpoint)."),
    config: Optional[Path] = typer.Option(None, "--config", help=CONFIG_HELP, show_default=False),
    overwrite: bool = typer.Option(FederateConfig.overwrite, help="Replace existing strategy folders."),
    tensorboard: bool = typer.Option(False, help=TENSORBOARD_HELP),
    **strategy_options: Any,
) -> None:
    from fedcli.fl.stage import run
    from fedcli.report.tables import cv_table, ensemble_table, node_convergence_table, node_performance_table

    cfg = resolved_config(ctx, FederateConfig, "federate")
    with events.tensorboard(tensorboard):
        runs = run(cfg)
    if not runs:  # a distributed rank other than 0: rank 0 reports
        return
    nodes = runs[0].nodes
    for fold in sorted({r.fold for r in runs}, key=lambda f: -1 if f is None else f):
        chosen = [r for r in runs if r.fold == fold]
        if fold is not None:
            console.out.print(f"fold {fold} (validation on train fold {fold}; the GAN buffers have seen it)")
        console.out.print(node_performance_table(chosen, nodes))
        console.out.print(node_convergence_table(chosen, nodes))
        ensemble = ensemble_table(chosen, nodes)
        if ensemble is not None:
            console.out.print(ensemble)
    if cfg.cv:
        console.out.print(cv_table(runs, nodes))
    console.out.print(f"wrote {cfg.exp / 'federate'}")


def audit_phase2_note(summary: dict) -> str:
    """Why the privacy generator is the standard one, where it is."""
    if "dp" in summary and summary.get("attack") == "latent projection":  # a VQ-VAE-2 has no phase 2 at all
        return "; under DP no phase 2 runs: the released generator is the DP one, and the control is the same"
    if summary.get("phase2_kept_iteration") == 0:
        return ("; phase 2 kept no privacy snapshot (its first FID check exceeded the limit), so the privacy "
                "generator is the standard one")
    return ""


@app.command("audit-privacy", epilog="Example: fedcli audit-privacy --exp results/demo --node node0 --steps 200")
def audit_privacy(
    ctx: typer.Context,
    exp: Optional[Path] = typer.Option(None, "--exp", help=EXP_HELP, show_default=False),
    node: Optional[str] = typer.Option(None, help="Audit this node only \\[default: every node].",
                                       show_default=False),
    max_images: int = typer.Option(AuditConfig.max_images, help="Images per group (members, non-members), "
                                   "size-matched and class-stratified."),
    steps: int = typer.Option(AuditConfig.steps, help="Projection steps per image (the study: 1000)."),
    batch_size: int = typer.Option(AuditConfig.batch_size, help="Images projected at once."),
    lr: float = typer.Option(AuditConfig.lr, help="Peak Adam learning rate of the projector."),
    optimize_noise: bool = typer.Option(AuditConfig.optimize_noise, help="Also optimise per-layer noise "
                                        "(warns below 128 px)."),
    lpips_weights: Optional[Path] = typer.Option(None, help="The LPIPS backbone weights train-gan used \\[default: "
                                                 "the torch hub cache, else the named random fallback].",
                                                 show_default=False),
    max_auroc: float = typer.Option(AuditConfig.max_auroc, help="Verdict, two-sided: fail on a membership AUROC "
                                    "or buffer member share significantly beyond this or below 1 minus it (a "
                                    "reversed leak); pass needs their 95% intervals within [1 - this, this] "
                                    "(0.5 = no leak)."),
    min_distance: float = typer.Option(AuditConfig.min_distance, help="Verdict: fail if members' median LPIPS to "
                                       "the buffer is below this (0 disables)."),
    standard: bool = typer.Option(AuditConfig.standard, help="Also project the standard (phase-1) generator: the "
                                  "study's comparison, which the control replaces because the control is trained "
                                  "as long as the privacy generator; half as much projection time again."),
    controls: bool = typer.Option(AuditConfig.controls, help="Also audit generators whose answer is known: a "
                                  "memoriser of the members (expected: fail), an untrained generator (not fail) "
                                  "and the reseeded control against the control (privacy effect none; needs "
                                  "train-gan --controls)."),
    strict: bool = typer.Option(AuditConfig.strict, help="Exit with code 1 when the verdict is fail."),
    shared: bool = typer.Option(AuditConfig.shared, help="Also attack what the federations in <exp>/federate shared "
                                "(white box): model inversion of FedReplay's latents and SplitNN's activations, "
                                "gradient inversion of one local step of an averaging strategy at batch 1, 4 and 8; "
                                "writes <exp>/attacks/<strategy>/. Without generators, only these."),
    attack_images: int = typer.Option(AuditConfig.attack_images, help="--shared: latents attacked per node."),
    attack_iterations: int = typer.Option(AuditConfig.attack_iterations, help="--shared: optimiser steps per "
                                          "attack and restart (the reference study: 20,000)."),
    attack_restarts: int = typer.Option(AuditConfig.attack_restarts, help="--shared: random starts per attack; "
                                        "the best match is kept."),
    classifier_references: int = typer.Option(AuditConfig.classifier_references, help="--shared: reference "
                                              "classifiers per node for the LiRA membership game on the shared "
                                              "classifiers, each trained as a standalone node on half the node's "
                                              "audited images; even and at least 4, 0 = the loss attack alone "
                                              "(each costs about one standalone run of the node)."),
    seed: Optional[int] = typer.Option(None, help="Seed \\[default: the partition's].", show_default=False),
    device: Device = typer.Option(AuditConfig.device, help="auto (CUDA when present), cpu or cuda."),
    threads: Optional[int] = typer.Option(None, help=THREADS_HELP, show_default=False),
    config: Optional[Path] = typer.Option(None, "--config", help=CONFIG_HELP, show_default=False),
    overwrite: bool = typer.Option(AuditConfig.overwrite, help="Replace existing <exp>/audit/<node> folders "
                                   "(and <exp>/attacks/<strategy> with --shared)."),
) -> None:
    """Project real images into each generator's latent space and score what the buffers reveal.

    Empirical attack scores, not a formal privacy guarantee. Writes <exp>/audit/<node>/:
    distances.csv, summary.json, histogram.png, pairs.png, nearest.png, roc.png, config.json. A generator with
    no latent (a VQ-VAE-2) is attacked through its buffer: each image's nearest buffer image.
    """
    from fedcli.audit.stage import audit
    from fedcli.report.tables import attacks_table, audit_table

    cfg = resolved_config(ctx, AuditConfig, "audit")
    summaries, attacked = audit(cfg)
    if summaries:
        console.out.print(audit_table(summaries))
    for s in summaries:
        verdict, effect = s["verdict"], s.get("privacy_effect")
        colour = {"pass": "green", "fail": "red"}.get(verdict["result"], "yellow")
        reasons = f" ({'; '.join(verdict['reasons'])})" if verdict["reasons"] else ""
        compared = (f"privacy effect vs control: {effect['verdict']} (median ratio {effect['median_ratio']:.3f}, 95% "
                    f"CI {effect['ci_low']:.3f}-{effect['ci_high']:.3f}, p = {effect['p_value']:.2g}; pixel "
                    f"{effect['pixel']['verdict']}, independent network {effect['independent']['verdict']})"
                    if effect else "attacked through its buffer alone (no latent to project, no control)")
        console.out.print(f"node {s['node']}: [{colour}]{verdict['result']}[/{colour}]{reasons}; {compared}"
                          + audit_phase2_note(s))
        if "dp" in s:
            dp = s["dp"]
            check = dp["audit_bound"]
            bound = ("holds" if check["holds"] else "[red]does NOT hold: check the DP training[/red]") + (
                "" if check["informative"] else f" but says nothing: at the FPRs {check['non_members']} non-members "
                "resolve, e^epsilon x FPR + delta is at least 1")
            console.out.print(f"node {s['node']}: (epsilon {dp['epsilon']:.3g}, delta {dp['delta']:.2g})-DP per "
                              f"training image for the generator and buffer ({dp['accountant']}); the attack's TPR "
                              f"<= e^epsilon x FPR + delta {bound}")
        for name, control in s.get("controls", {}).items():
            mark = "[green]holds[/green]" if control["holds"] else "[red]does not hold[/red]"
            console.out.print(f"node {s['node']} control {name}: expected {control['expected']}, "
                              f"{control['observed']}: {mark}")
    if attacked:
        console.out.print(attacks_table(attacked))
        for strategy, summary in attacked.items():
            for note in summary["notes"]:
                console.out.print(f"{strategy}: {note}", soft_wrap=True, markup=False)
    console.out.print("empirical attack scores, not a formal privacy guarantee"
                      + (" (except the DP lines above)" if any("dp" in s for s in summaries) else ""))
    console.out.print(f"wrote {', '.join(str(cfg.exp / f) for f in ('audit', 'attacks') if (cfg.exp / f).is_dir())}")
    if cfg.strict and any(s["verdict"]["result"] == "fail" for s in summaries):
        raise typer.Exit(1)


@app.command(epilog="Example: fedcli report results/demo --metric balanced-accuracy")
def report(
    ctx: typer.Context,
    folder: Optional[Path] = typer.Argument(None, help="Experiment folder (or pass --exp).", show_default=False),
    exp: Optional[Path] = typer.Option(None, "--exp", help=EXP_HELP, show_default=False),
    metric: Metric = typer.Option(ReportConfig.metric, help="Metric of the tables and figures: accuracy (the "
                                  "study), balanced-accuracy, f1 (macro) or auroc."),
    threads: Optional[int] = typer.Option(None, help=THREADS_HELP, show_default=False),
    config: Optional[Path] = typer.Option(None, "--config", help=CONFIG_HELP, show_default=False),
) -> None:
    """Turn an experiment's artifacts into the study's tables (Markdown, CSV, LaTeX) and figures.

    Writes <exp>/report/: report.md, one CSV per table, tex/*.tex (booktabs), figures/*.png.
    Tables whose inputs are missing are listed at the end of report.md.
    """
    from fedcli.report.build import run
    from fedcli.report.render import rich_table

    if folder is not None and exp is not None and folder != exp:
        raise UserError(f"two experiment folders given ({folder} and --exp {exp}); pass one")
    if folder is not None:
        ctx.params["exp"] = folder
    ctx.params.pop("folder")
    result = run(resolved_config(ctx, ReportConfig, "report"))
    if result.headline is not None:
        console.out.print(rich_table(result.headline))
    console.out.print(f"wrote {result.path} ({len(result.tables)} tables; {len(result.missing)} not made, listed "
                      "at its end)")


@app.command(epilog="Example: fedcli run quickstart --set federate.rounds=3")
def run(
    recipe: Path = typer.Argument(..., help="TOML recipe: \\[partition], \\[train_gan], \\[federate], \\[audit], "
                                  "\\[report], optionally \\[sweep] and \\[select]; a file, or the name of a recipe "
                                  f"shipped with fedcli: {', '.join(shipped_recipes())}."),
    exp: Optional[Path] = typer.Option(None, "--exp", help="Experiment folder \\[default: results/<recipe name>].",
                                       show_default=False),
    set_: list[str] = typer.Option([], "--set", help="Repeatable table.key=value overriding the recipe, e.g. "
                                   "federate.rounds=3 or sweep.seeds=[0,1,2]."),
    threads: Optional[int] = typer.Option(None, help="CPU threads of every stage, over the recipe's \\[default: "
                                          "torch's, every core]; no part of the up-to-date check.", show_default=False),
    yes: bool = typer.Option(False, "--yes", help="Start a recipe with more units of work than fedcli run "
                             "starts unasked (a large \\[sweep]); the refusal says how many."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Only say which units would run, be skipped as up to "
                                 "date or be shared, and the sweep's size; write nothing."),
    tensorboard: bool = typer.Option(False, help=TENSORBOARD_HELP),
) -> None:
    """Run a recipe's stages in order (partition, train-gan, federate, audit-privacy, report) into one folder.

    A stage whose resolved config and inputs are unchanged since the last run is skipped; changing an
    option reruns that stage and everything downstream of it. A \\[sweep] makes sub-experiments under
    <exp>/runs/, sharing the stages they have in common; a \\[select] table picks each strategy's
    rounds/epochs/lr/mu by cross-validation on the train folds before the final run.

    Relative paths in a recipe (partition.data-dir) are read from the current folder, as on the command
    line, also in a shipped recipe.
    """
    import time

    from fedcli.pipeline.recipe import Recipe
    from fedcli.pipeline.runner import Runner
    from fedcli.report.build import headline_table
    from fedcli.report.render import rich_table

    start = time.perf_counter()
    recipe = locate(recipe)
    exp = exp if exp is not None else Path("results") / recipe.stem
    check_experiment_folder(exp)
    loaded = Recipe.load(recipe, set_, threads)
    if dry_run:
        counts = Runner(loaded, exp, dry_run=True).run()
        console.out.print(f"dry run: {len(loaded.points())} sub-experiment(s), {sum(counts.values())} units: "
                          f"{counts['ran']} would run, {counts['skipped']} up to date, {counts['shared']} would be "
                          "shared with another sub-experiment; nothing was written", soft_wrap=True)
        return
    loaded.check_size(yes)
    runner = Runner(loaded, exp)
    with events.tensorboard(tensorboard):
        counts = runner.run()
    headline = headline_table(runner.report_config)
    if headline is not None:
        console.out.print(rich_table(headline))
    console.out.print(f"{counts['ran']} ran, {counts['skipped']} up to date (skipped), {counts['shared']} shared "
                      f"with another sub-experiment; {time.perf_counter() - start:.0f} s")
    console.out.print(f"report: {runner.exp / 'report' / 'report.md'}")


@app.command(epilog="Example: fedcli predict --exp results/demo --strategy feder --ensemble --data-dir new_scans")
def predict(
    exp: Path = typer.Option(..., "--exp", help=EXP_HELP),
    strategy: str = typer.Option(..., help="The federated strategy whose trained model(s) to apply "
                                 "(a folder under <exp>/federate)."),
    node: Optional[str] = typer.Option(None, help="Use this node's model (strategies with one model per node). "
                                       "Default: the shared global/central model.", show_default=False),
    ensemble: bool = typer.Option(False, help="Average the softmax of every node's model, as federate's "
                                  "ensemble rows do."),
    data_dir: Path = typer.Option(..., help="Folder of images to classify (searched recursively)."),
    out: Optional[Path] = typer.Option(None, help="CSV to write \\[default: <exp>/predict/<strategy>_<model>.csv].",
                                       show_default=False),
    device: Device = typer.Option("auto", help="auto (CUDA when present), cpu or cuda."),
    batch: int = typer.Option(PredictConfig.batch, help="Images per forward pass."),
    threads: Optional[int] = typer.Option(None, help=THREADS_HELP, show_default=False),
    skip_bad: bool = typer.Option(False, "--skip-bad", help="Leave out files that are not usable images "
                                  "(unreadable, corrupt, too many pixels), listing each, instead of stopping."),
    group: list[str] = typer.Option([], help="Repeatable NAME=CLASS+CLASS: merge the model's classes into groups "
                                    "(every class in one; e.g. malignant=MEL+BCC+SCC), each group's probability the "
                                    "sum of its classes'."),
    labels_from_folders: bool = typer.Option(False, "--labels-from-folders", help="Score the predictions: each "
                                             "image's label is its first folder under --data-dir (a group's name "
                                             "with --group, else a class name); writes <out>_scores.csv with 95% "
                                             "intervals."),
) -> None:
    """Classify a folder of new images with a trained federated model.

    Images are resized and converted as in training. Writes a CSV with one row per image:
    file, predicted, predicted_index, p_<label> for each class.
    """
    from fedcli.devices import torch_threads
    from fedcli.predict import run

    numbers = PredictConfig(batch=batch, threads=threads)
    with torch_threads(numbers.threads):
        result = run(exp, strategy, data_dir, node=node, ensemble=ensemble, out=out, device=device,
                     batch=numbers.batch, skip_bad=skip_bad, groups=group, labels_from_folders=labels_from_folders)
    for name, why in result.skipped:
        console.out.print(f"note: skipped {name}: {why}", markup=False, soft_wrap=True)
    console.out.print(result.summary(), markup=False, soft_wrap=True)
    console.out.print(f"wrote {result.out}" + (f" and {result.scores_out}" if result.scores_out else ""), markup=False,
                      soft_wrap=True)


weights_app = typer.Typer(help="Pretrained ImageNet weights (LPIPS, FID, classifiers): what is present, and "
                          "fetching them. `fetch` is the only fedcli command that downloads.", no_args_is_help=True)
app.add_typer(weights_app, name="weights")


@weights_app.command("status", epilog="Example: fedcli weights status")
def weights_status() -> None:
    """Which backbones are in the torch hub cache (hash-checked), and what fedcli uses where one is not."""
    from rich.table import Table

    from fedcli import weights

    table = Table(title=f"pretrained weights in {weights.hub_dir()}")
    for column in ("name", "used for", "file", "state", "in use"):
        table.add_column(column, overflow="fold")
    for backbone in weights.BACKBONES.values():
        state = weights.state_of(backbone)
        in_use = {"present": "calibrated (ImageNet weights)", "absent": f"fallback: {backbone.without}",
                  "corrupt": "sha256 mismatch: delete it and run fedcli weights fetch"}[state]
        table.add_row(backbone.name, backbone.use, backbone.filename, state, in_use)
    console.out.print(table)


@weights_app.command("fetch", epilog="Example: fedcli weights fetch vgg inception")
def weights_fetch(
    names: Optional[list[str]] = typer.Argument(None, help="Backbones to fetch \\[default: vgg, alex, inception] "
                                                "(also resnet18, resnet34, resnet50, densenet121, efficientnet_b0).",
                                                show_default=False),
) -> None:
    """Download backbones into the torch hub cache from the URLs torchvision and torch-fidelity publish
    (sha256-checked), where every stage looks for them. Needs the internet; stages themselves never download."""
    from fedcli import weights

    names = names or ["vgg", "alex", "inception"]
    unknown = [name for name in names if name not in weights.BACKBONES]
    if unknown:
        raise UserError(f"unknown backbone {unknown[0]!r}; choose from {', '.join(weights.BACKBONES)}")
    for name in dict.fromkeys(names):
        console.out.print(f"{name}: fetching into {weights.hub_dir()} ...", markup=False, soft_wrap=True)
        console.out.print(f"{name}: {weights.fetch(weights.BACKBONES[name])}", markup=False, soft_wrap=True)


def main() -> None:
    app()
