"""The `fedcli` command line: option parsing and pretty output only; the stages hold the logic."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Optional

import typer
from typer.core import TyperGroup

from fedcli import __version__
from fedcli.cli_options import options_from, strategy_parameters
from fedcli.core import console
from fedcli.core.errors import UserError, environment_message
from fedcli.experiment import events
from fedcli.experiment.config import AuditConfig, PartitionConfig, PredictConfig, ReportConfig, read_recipe, resolve
from fedcli.experiment.panels import OUTPUT
from fedcli.federate.config import FederateConfig, SharedOptions
from fedcli.federate.strategies import REGISTRY
from fedcli.generators.config import GanConfig
from fedcli.pipeline.recipe import RunOptions
from fedcli.pipeline.shipped import shipped_recipes

CONFIG_HELP = "TOML recipe; its \\[stage] table sets options, which options given here override."
TENSORBOARD_HELP = ("Also write a few of the stage's numbers as TensorBoard runs under <exp>/logs/tensorboard/, one "
                    "per strategy or node with the same tags, so they overlay; needs the tensorboard extra: "
                    "pip install 'fedcli\\[tensorboard]'.")


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
@options_from(PartitionConfig)
def partition(
    ctx: typer.Context,
    config: Optional[Path] = typer.Option(None, "--config", help=CONFIG_HELP, show_default=False),
    **options: Any,
) -> None:
    """Split a dataset into federated nodes with class-balanced test sets and CV folds.

    Writes <exp>/partition/manifest.json, summary.csv, summary.png and config.json.
    """
    from fedcli.data.partition import run
    from fedcli.data.summary import partition_table, short_test_notes, untested_class_notes
    from fedcli.federate.strategies import REGISTRY

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
@options_from(GanConfig, grouped=True)
def train_gan(
    ctx: typer.Context,
    config: Optional[Path] = typer.Option(None, "--config", help=CONFIG_HELP, show_default=False,
                                          rich_help_panel=OUTPUT),
    tensorboard: bool = typer.Option(False, help=TENSORBOARD_HELP, rich_help_panel=OUTPUT),
    **options: Any,
) -> None:
    """Train each node's conditional GAN with the LPIPS privacy loss and sample its synthetic buffer (or, with
    --generator vqvae2, a VQ-VAE-2 serially across the nodes, and each node's codes and prior).

    Writes <exp>/gan/<node>/: generator.safetensors, generator_phase1.safetensors, buffer.safetensors,
    metrics.csv, samples.png, config.json (vqvae2: generator.safetensors, codes.safetensors, buffer.safetensors,
    metrics.csv, samples.png, config.json).
    """
    from fedcli.generators.stage import run
    from fedcli.report.tables import gan_table, vqvae2_table

    cfg = resolved_config(ctx, GanConfig, "train_gan")
    with events.tensorboard(tensorboard):
        summaries = run(cfg)
    if not cfg.sample_only and all("phase1" in s for s in summaries):  # the table reads the StyleGAN kind's record
        console.out.print(gan_table(summaries))
    elif summaries and all("serial" in s for s in summaries):
        console.out.print(vqvae2_table(summaries))
    console.out.print(f"wrote {cfg.exp / 'gan'}")


STRATEGY_LIST = "\n\n".join(f"{d.name}: {d.summary}." for d in REGISTRY)


@app.command(epilog="Example: fedcli federate --strategy feder --strategy fedavg --exp results/demo",
             help="Run FedER and the baselines on the partition.\n\nWrites <exp>/federate/<strategy>/: metrics.csv, "
             "bn_statistics.csv, comm.csv, models/, config.json.\n\nStrategies (--strategy):\n\n" + STRATEGY_LIST)
@options_from(SharedOptions, grouped=True, extra=strategy_parameters)
def federate(
    ctx: typer.Context,
    config: Optional[Path] = typer.Option(None, "--config", help=CONFIG_HELP, show_default=False,
                                          rich_help_panel=OUTPUT),
    tensorboard: bool = typer.Option(False, help=TENSORBOARD_HELP, rich_help_panel=OUTPUT),
    **options: Any,
) -> None:
    from fedcli.federate.stage import run
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


@app.command("audit-privacy", epilog="Example: fedcli audit-privacy --exp results/demo --node node0 --steps 200")
@options_from(AuditConfig)
def audit_privacy(
    ctx: typer.Context,
    config: Optional[Path] = typer.Option(None, "--config", help=CONFIG_HELP, show_default=False),
    **options: Any,
) -> None:
    """Project real images into each generator's latent space and score what the buffers reveal.

    Empirical attack scores, not a formal privacy guarantee. Writes <exp>/audit/<node>/:
    distances.csv, summary.json, histogram.png, pairs.png, nearest.png, roc.png, config.json. A generator with
    no latent (a VQ-VAE-2) is attacked through its buffer: each image's nearest buffer image.
    """
    from fedcli.audit.stage import audit
    from fedcli.report.tables import attacks_table, audit_node_lines, audit_table

    cfg = resolved_config(ctx, AuditConfig, "audit")
    summaries, attacked = audit(cfg)
    if summaries:
        console.out.print(audit_table(summaries))
    for s in summaries:
        for line in audit_node_lines(s):
            console.out.print(line)
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
@options_from(ReportConfig)
def report(
    ctx: typer.Context,
    folder: Optional[Path] = typer.Argument(None, help="Experiment folder (or pass --exp).", show_default=False),
    config: Optional[Path] = typer.Option(None, "--config", help=CONFIG_HELP, show_default=False),
    **options: Any,
) -> None:
    """Turn an experiment's artifacts into the study's tables (Markdown, CSV, LaTeX) and figures.

    Writes <exp>/report/: report.md, one CSV per table, tex/*.tex (booktabs), figures/*.png.
    Tables whose inputs are missing are listed at the end of report.md.
    """
    from fedcli.report.build import run
    from fedcli.report.render import rich_table

    exp = options["exp"]
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


RUN_HELP = """Run a recipe's stages in order (partition, train-gan, federate, audit-privacy, report) into one folder.

    A stage whose resolved config and inputs are unchanged since the last run is skipped; changing an
    option reruns that stage and everything downstream of it. A \\[sweep] makes sub-experiments under
    <exp>/runs/, sharing the stages they have in common; a \\[select] table picks each strategy's
    rounds/epochs/lr/mu by cross-validation on the train folds before the final run.

    Relative paths in a recipe (partition.data-dir) are read from the current folder, as on the command
    line, also in a shipped recipe."""


@app.command(epilog="Example: fedcli run quickstart --set federate.rounds=3", help=RUN_HELP)
@options_from(RunOptions)
def run(
    recipe: Path = typer.Argument(..., help="TOML recipe: \\[partition], \\[train_gan], \\[federate], \\[audit], "
                                  "\\[report], optionally \\[sweep] and \\[select]; a file, or the name of a recipe "
                                  f"shipped with fedcli: {', '.join(shipped_recipes())}."),
    tensorboard: bool = typer.Option(False, help=TENSORBOARD_HELP),
    **options: Any,
) -> None:
    import time

    from fedcli.pipeline.runner import Runner, prepared

    start = time.perf_counter()
    given = RunOptions(**options)
    loaded, exp = prepared(recipe, given)
    if given.dry_run:
        counts = Runner(loaded, exp, dry_run=True).run()
        return console.out.print(f"dry run: {len(loaded.points())} sub-experiment(s), {sum(counts.values())} units: "
                                 f"{counts['ran']} would run, {counts['skipped']} up to date, {counts['shared']} would "
                                 "be shared with another sub-experiment; nothing was written", soft_wrap=True)
    loaded.check_size(given.yes)
    runner = Runner(loaded, exp)
    with events.tensorboard(tensorboard):
        counts = runner.run()
    print_ran(runner, counts, time.perf_counter() - start)


def print_ran(runner, counts: dict[str, int], seconds: float) -> None:
    """What `fedcli run` did: the report's headline table, the units run, skipped and shared, the report."""
    from fedcli.report.build import headline_table
    from fedcli.report.render import rich_table

    headline = headline_table(runner.report_config)
    if headline is not None:
        console.out.print(rich_table(headline))
    console.out.print(f"{counts['ran']} ran, {counts['skipped']} up to date (skipped), {counts['shared']} shared "
                      f"with another sub-experiment; {seconds:.0f} s")
    console.out.print(f"report: {runner.exp / 'report' / 'report.md'}")


@app.command(epilog="Example: fedcli predict --exp results/demo --strategy feder --ensemble --data-dir new_scans")
@options_from(PredictConfig, required=True)
def predict(
    **options: Any,
) -> None:
    """Classify a folder of new images with a trained federated model.

    Images are resized and converted as in training. Writes a CSV with one row per image:
    file, predicted, predicted_index, p_<label> for each class.
    """
    from fedcli.core.devices import torch_threads
    from fedcli.predict import run

    cfg = PredictConfig(**options)
    with torch_threads(cfg.threads):
        result = run(cfg.exp, cfg.strategy, cfg.data_dir, node=cfg.node, ensemble=cfg.ensemble, out=cfg.out,
                     device=cfg.device, batch=cfg.batch, skip_bad=cfg.skip_bad, groups=list(cfg.group),
                     labels_from_folders=cfg.labels_from_folders)
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

    from fedcli.core import weights

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
    from fedcli.core import weights

    names = names or ["vgg", "alex", "inception"]
    unknown = [name for name in names if name not in weights.BACKBONES]
    if unknown:
        raise UserError(f"unknown backbone {unknown[0]!r}; choose from {', '.join(weights.BACKBONES)}")
    for name in dict.fromkeys(names):
        console.out.print(f"{name}: fetching into {weights.hub_dir()} ...", markup=False, soft_wrap=True)
        console.out.print(f"{name}: {weights.fetch(weights.BACKBONES[name])}", markup=False, soft_wrap=True)



deploy_app = typer.Typer(help="A Flower federation across hospitals (docs/deploy.md): its keys and bundles, and the "
                         "coordinator's relay. Each hospital then runs fedcli federate --engine flower --bundle DIR.",
                         no_args_is_help=True)
app.add_typer(deploy_app, name="deploy")


@deploy_app.command("setup", epilog="Example: fedcli deploy setup federation --superlink hub.example.org:9092 "
                                    "--node montgomery --node shenzhen")
def deploy_setup(
    folder: Path = typer.Argument(..., help="Where the federation's keys and bundles are kept (the coordinator's)."),
    superlink: str = typer.Option(..., help="host:port the hospitals connect out to (the SuperLink's certificate "
                                            "names this host)."),
    hospitals: list[str] = typer.Option(..., "--node", help="A hospital's node name, as the partition names it "
                                                         "(repeat)."),
) -> None:
    """Make the certificate authority, the SuperLink's certificate, each node's key and the allow-list, and one
    bundle per hospital; keys already made are kept (a listed node keeps its key)."""
    from fedcli.comm.bundles import make_federation
    from fedcli.experiment.names import check_names

    host, _, port = superlink.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UserError(f"--superlink {superlink} is not host:port (e.g. hub.example.org:9092)")
    make_federation(folder, check_names("node", hospitals, "--node"), superlink)
    for name in hospitals:
        console.out.print(f"{name}: copy {folder / 'bundles' / name} to its machine, then run fedcli federate "
                          f"--engine flower --bundle <that folder> (its key stays there)", markup=False, soft_wrap=True)
    console.out.print(f"coordinator: fedcli deploy relay {folder} (keep {folder / 'ca'} off the SuperLink's machine "
                      "once the certificates are made)", markup=False, soft_wrap=True)


@deploy_app.command("relay", epilog="Example: fedcli deploy relay federation --timeout 600")
def deploy_relay(
    folder: Path = typer.Argument(..., help="The folder fedcli deploy setup made."),
    port: Optional[int] = typer.Option(None, min=1, max=65535, help="Port to listen on \\[default: the bundles' "
                                                                     "address]."),
    silence: float = typer.Option(300.0, "--timeout", min=1, help="Seconds a node may stay silent before the "
                                                                  "others stop."),
) -> None:
    """Run the coordinator's SuperLink (TLS, node authentication by the allow-list; the only inbound port of the
    federation) and one relay run for every listed node, until it ends. The relay cannot read what it carries."""
    from fedcli.comm.flower_launcher import coordinate

    coordinate(folder, port, silence)
    console.out.print("relay run completed: every node has ended", markup=False)


@app.command("plugins", epilog="Example: fedcli plugins")
def plugins_list() -> None:
    """List the installed plugins (strategies, generator kinds, data sources, classifiers from other
    distributions' entry points; docs/python.md): one line each, with the distribution and where it is installed."""
    from fedcli.core import plugins

    found = plugins.every()
    for plugin in found:
        console.out.print(f"{plugins.WHAT[plugin.group]} {plugin.name}: {plugin.value} from {plugin.distribution} "
                          f"{plugin.version} ({plugin.location})", markup=False, soft_wrap=True)
    if not found:
        console.out.print("no plugins installed (entry points in the groups "
                          f"{', '.join(f'fedcli.{group}' for group in plugins.GROUPS)})", markup=False, soft_wrap=True)
