"""The `report` stage: `<exp>/report/` with report.md, one CSV per table, booktabs tables in tex/,
and figures/. A table whose inputs are missing is listed at the end with what would produce it.

The report only reads artifacts, so it is redrawn in full every time (the folder is replaced).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from fedcli.core import console
from fedcli.core.devices import with_threads
from fedcli.experiment.artifacts import atomic_write_bytes, staged_output, write_csv
from fedcli.experiment.config import METRIC_COLUMNS, ReportConfig
from fedcli.experiment.locking import locked
from fedcli.experiment.paths import report_dir
from fedcli.report import (calibration, feder_study, few_labels, few_labels_paired, figures, frontier, notes,
                           privacy_tables, skew_study, summaries)
from fedcli.report.collect import SubExperiment, load_experiment, replicate_groups
from fedcli.report.render import latex, markdown, numeric
from fedcli.report.table import Missing, ReportTable

GROUP_TABLES = (feder_study.headline, feder_study.table1, feder_study.table2, feder_study.table3, feder_study.table4, feder_study.table4_paired,
                feder_study.table5, feder_study.table7, feder_study.table8, feder_study.paired_table, feder_study.batchnorm_table)


@dataclasses.dataclass
class Report:
    path: Path
    headline: ReportTable | None
    tables: list[ReportTable]
    missing: list[Missing]


def slug(text: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-=." else "_" for ch in text)


class Writer:
    """Accumulates report.md while writing each table's CSV and LaTeX files."""

    def __init__(self, out: Path):
        self.out = out
        self.lines: list[str] = []
        self.tables: list[ReportTable] = []
        self.missing: dict[str, Missing] = {}

    def table(self, built, suffix: str = "") -> ReportTable | None:
        if isinstance(built, Missing):
            self.missing.setdefault(built.title, built)
            return None
        if suffix:
            built = dataclasses.replace(built, key=f"{built.key}__{slug(suffix)}", title=f"{built.title} ({suffix})")
        self.tables.append(built)
        write_csv(self.out / f"{built.key}.csv", numeric(built))
        atomic_write_bytes(self.out / "tex" / f"{built.key}.tex", latex(built).encode())
        self.lines += [markdown(built), f"[csv]({built.key}.csv) · [tex](tex/{built.key}.tex)", ""]
        return built

    def figure(self, name: str, caption: str) -> None:
        self.lines += [f"![{caption}](figures/{name})", "", f"*{caption}*", ""]

    def copy_figure(self, source: Path, name: str, caption: str) -> None:
        if source.is_file():
            atomic_write_bytes(self.out / "figures" / name, source.read_bytes())
            self.figure(name, caption)


@with_threads
def run(cfg: ReportConfig) -> Report:
    subs = load_experiment(cfg.exp)
    stale = stale_notes(subs, Path(cfg.exp))
    metric = METRIC_COLUMNS[cfg.metric]
    groups = replicate_groups(subs)
    first = next(iter(groups.values()))
    with locked(cfg.exp, [report_dir(cfg.exp)]), staged_output(report_dir(cfg.exp), overwrite=True) as out:
        (out / "tex").mkdir()
        (out / "figures").mkdir()
        w = Writer(out)
        w.lines += [f"# fedcli report: {Path(cfg.exp).resolve().name}", "",
                    f"Metric: {cfg.metric}. {len(subs)} sub-experiment(s) in {len(groups)} group(s); numbers are "
                    "mean ± std over seeds or folds where several exist.", ""]
        w.lines += ["## Data and generators", ""]
        w.table(summaries.partition_table(first))
        w.copy_figure(first[0].folder / "partition" / "summary.png", "partition.png", "Example images per node")
        w.table(summaries.gan_summary(first))
        for node in first[0].gan_nodes:
            w.copy_figure(first[0].folder / "gan" / node / "samples.png", f"gan_{node}.png",
                          f"Node {node}: samples of its generators")
        headline = None
        for label, reps in groups.items():
            w.lines += [f"## Federated learning{f' ({label})' if label else ''}", ""]
            said = [notes.architecture_note(reps), notes.budget_note(reps), notes.engine_note(reps),
                    notes.disclosure_note(reps)]
            w.lines += [" ".join(note for note in said if note), ""]
            for builder in GROUP_TABLES:
                made = w.table(builder(reps, metric), label)
                if builder is feder_study.headline and headline is None:
                    headline = made
            name = f"rounds{'_' + slug(label) if label else ''}.png"
            if figures.rounds_figure(reps, metric, out / "figures" / name, f"{cfg.metric} per round {label}".strip()):
                w.figure(name, f"{cfg.metric} per round per strategy (mean over nodes, own test sets)")
        before = len(w.lines)
        w.table(feder_study.table6(subs, metric))
        w.table(feder_study.alpha_table(subs, metric))
        w.table(feder_study.dp_table(subs, metric))
        w.table(skew_study.skew_table(subs, metric))
        w.table(skew_study.paired_table(subs, metric))
        w.table(skew_study.budget_table(subs))
        w.table(skew_study.forgetting_table(subs))
        if few_labels.few_labels_runs(subs):  # FedPerl's readings, for experiments that hide labels
            aurc = calibration.calibration_figure(few_labels.variants(subs), out / "figures" / "calibration.png")
            w.table(few_labels.few_labels_table(subs, metric, aurc))
            w.table(few_labels.few_labels_table(subs, metric, model="best-validation"))
            w.table(few_labels_paired.against_ssfl_table(subs, metric))
            w.table(few_labels_paired.regime_table(subs, metric))
            if aurc:
                w.figure("calibration.png", "Reliability per client on Ding et al.'s adaptive bins, every variant a "
                         "line (each client's own test set under its final model, seeds pooled), and each variant's "
                         "risk-coverage curve (clients pooled)")
            for table in few_labels.community_tables(subs):
                w.table(table)
        if figures.skew_figure(subs, metric, out / "figures" / "label_skew.png"):
            w.figure("label_skew.png", f"{cfg.metric} against the label skew per method (mean ± std over seeds)")
        if figures.dp_figure(subs, metric, out / "figures" / "dp_utility.png"):
            w.figure("dp_utility.png", "Privacy against utility per DP setting (mean ± std over nodes)")
        if figures.scalability_figure(subs, metric, out / "figures" / "scalability.png"):
            w.figure("scalability.png", f"Scalability: {cfg.metric} against the number of nodes")
        else:
            w.missing.setdefault("Scalability figure", Missing("Scalability figure", "runs with several numbers of "
                                                               "nodes (recipes/scalability.toml)"))
        if len(w.lines) > before:
            w.lines[before:before] = ["## Across the sweep", ""]
        w.lines += ["## Privacy", ""]
        if (Path(cfg.exp) / "regime" / "regime.json").is_file():
            w.table(frontier.regime_table(cfg.exp))
        w.table(frontier.frontier_table(subs, metric))
        if frontier.frontier_figure(subs, metric, out / "figures" / "privacy_frontier.png"):
            w.figure("privacy_frontier.png", f"Privacy against {cfg.metric}: membership and reconstruction per method "
                     "(mean ± std over nodes and seeds)")
        attacked = next((s for s in subs if s.attacks), None)
        for strategy in attacked.attacks if attacked is not None else ():
            w.copy_figure(attacked.folder / "attacks" / strategy / "reconstructions.png",
                          f"attacks_{strategy}.png", f"{strategy}: what a white-box attacker rebuilds from what it saw")
        for label, reps in groups.items():
            w.table(privacy_tables.privacy_table(reps), label if len(groups) > 1 else "")
            w.table(privacy_tables.controls_table(reps), label if len(groups) > 1 else "")
        audited = next((s for s in subs if s.audits), None)
        if audited is not None:
            privacy_figures(w, audited)
        w.missing |= {m.title: m for m in stale}
        if w.missing:
            w.lines += ["## Not in this report", ""]
            w.lines += [f"- {m.title}: needs {m.needs}" for m in w.missing.values()] + [""]
        atomic_write_bytes(out / "report.md", "\n".join(w.lines).encode())
    return Report(report_dir(cfg.exp) / "report.md", headline, w.tables, list(w.missing.values()))


def stale_notes(subs: list[SubExperiment], exp: Path) -> list[Missing]:
    """Artifacts left out because they were made from inputs the experiment no longer holds (another
    partition, a retrained GAN): listed at the end of report.md and printed now."""
    notes = [Missing(f"{s.folder.relative_to(exp).as_posix()} (stale: made from {' and '.join(s.inputs)})",
                     f"a rerun of fedcli {s.stage} --overwrite") for sub in subs for s in sub.stale]
    for note in notes:
        console.out.print(f"left out of the report: {note.title}; it needs {note.needs}", markup=False,
                          soft_wrap=True)
    return notes


def privacy_figures(w: Writer, sub: SubExperiment) -> None:
    for audit in sub.audits:
        node = audit["node"]
        folder = sub.folder / "audit" / node
        w.copy_figure(folder / "histogram.png", f"audit_{node}_histogram.png",
                      f"Node {node}: members' projection distance under the control and privacy generators")
        w.copy_figure(folder / "pairs.png", f"audit_{node}_pairs.png",
                      f"Node {node}: real images and their best projections")


def headline_table(cfg: ReportConfig) -> ReportTable | None:
    """The headline table (every strategy's node performance) of the first sweep group."""
    first = next(iter(replicate_groups(load_experiment(cfg.exp)).values()))
    built = feder_study.headline(first, METRIC_COLUMNS[cfg.metric])
    return None if isinstance(built, Missing) else built
