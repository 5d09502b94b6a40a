"""The stages' summaries in the report: the partition, and each node's generators (StyleGAN2 phases, VQ-VAE-2 chain,
or any other kind's buffer and fidelity)."""

from __future__ import annotations

from collections import defaultdict

import pandas as pd

from fedcli.report.collect import Stat, SubExperiment, decoded_fidelity, own_scores
from fedcli.report.table import Built, Missing, ReportTable


def partition_table(subs: list[SubExperiment]) -> Built:
    title = "Partition summary"
    sub = next((s for s in subs if s.manifest), None)
    if sub is None:
        return Missing(title, "fedcli partition")
    manifest = sub.manifest
    rows = {}
    for node in manifest["nodes"]:
        counts = {split: defaultdict(int) for split in ("train", "test")}
        for split in counts:
            for record in node[split]:
                counts[split][record["label"]] += 1
        rows[node["name"]] = {"site": node.get("site", ""), "train": sum(counts["train"].values()),
                              "test": sum(counts["test"].values()),
                              "classes": f"{len(counts['train'])}/{len(manifest['label_names'])}",
                              "smallest class (train)": min(counts["train"].values()) if counts["train"] else 0}
    skew = (manifest.get("statistics") or {}).get("label_skew_js")
    return ReportTable("partition_summary", title, pd.DataFrame(rows).T,
                       f"{manifest['source']}, scheme {manifest['scheme']}, {manifest['image_size']} px, seed "
                       f"{manifest['seed']}; label skew of the training splits (mean pairwise Jensen-Shannon "
                       f"distance) {skew}",
                       rows_are="node")


def gan_summary(subs: list[SubExperiment]) -> Built:
    title = "GAN summary per node"
    gans = [g for s in subs for g in s.gans]
    if not gans:
        return Missing(title, "fedcli train-gan")
    if all("serial" in g for g in gans):
        return vqvae2_summary(subs, gans)
    if not all("phase1" in g for g in gans):
        return kind_summary(gans)
    standalone = [own_scores(run.metrics, "accuracy") for s in subs if (run := s.run("standalone")) is not None]
    rows = {}
    for node in dict.fromkeys(g["node"] for g in gans):
        mine = [g for g in gans if g["node"] == node]
        rows[node] = {"FID standard": Stat.of([g["phase1"]["fid"] for g in mine]),
                      "FID privacy": Stat.of([g["phase2"]["fid"] for g in mine]),
                      "iterations": f"{mine[0]['phase1']['iterations']} + {mine[0]['phase2']['iterations']}",
                      "phase 1 kept": ", ".join(dict.fromkeys(phase1_kept(g["phase1"]) for g in mine)),
                      "phase 2 kept": ", ".join(dict.fromkeys(phase2_kept(g["phase2"]) for g in mine)),
                      "buffer": str(mine[0]["buffer"]["size"])}
        scored = [g["fidelity"] for g in mine if g.get("fidelity")]
        if scored:
            rows[node] |= {"fidelity ratio": Stat.of([f["ratio"] for f in scored]),
                           "ratio standard": Stat.of([f["phase1"]["ratio"] for f in scored]),
                           "ratio control": Stat.of([f.get("control", {}).get("ratio") for f in scored]),
                           "synthetic acc": Stat.of([f["synthetic_accuracy"] for f in scored]),
                           "real acc": Stat.of([f["real_accuracy"] for f in scored]),
                           "class fidelity": Stat.of([f["class_fidelity"] for f in scored]),
                           "flags": flag_counts(scored)}
        if standalone:
            rows[node]["standalone acc"] = Stat.of([sc.get(node) for sc in standalone])
        private = [g["dp"] for g in mine if g.get("dp")]
        if private:
            rows[node]["DP epsilon"] = Stat.of([d["epsilon"] for d in private])
    note = (f"{gans[0]['metric_names']['fid']}; the privacy generator trades FID for distance to the real images. "
            "Fidelity (no pretrained network): the federate classifier trained on the released buffer only "
            "(synthetic acc) or on the node's real training images (real acc), both tested on the node's real "
            "test images, mean of the classifier seeds; ratio = synthetic / real, for the released buffer, the "
            "standard (phase 1) generator and the control (phase 2 at alpha 0), each from the same draws; class "
            "fidelity = the real classifier's accuracy on the buffer.")
    flagged = [node for node, row in rows.items() if row.get("flags")]
    if flagged:
        note += (f" Flagged released buffers: {', '.join(flagged)} (below chance: its classifier did no better than "
                 "always answering the test set's most frequent class; below control: below the control's ratio by "
                 "more than the 95% interval of a difference of two accuracies on the same test images).")
    stopped = sorted({g["node"] for g in gans if g["phase2"]["stopped"] == "fid-factor"})
    if stopped:
        note += (" Phase 2 exceeded its FID limit (--fid-factor x the kept phase-1 snapshot's FID) on "
                 f"{', '.join(stopped)}: the privacy generator is the last snapshot within the limit, and the "
                 "standard generator itself where none was (kept iteration 0).")
    if any(g.get("dp") for g in gans):
        note += (" DP epsilon: the RDP accountant's for the discriminator's DP-SGD steps (train-gan --dp-epsilon), "
                 "per training image, at delta 1 / (10 N) unless set; no phase 2 runs under DP, so the privacy "
                 "generator is the last EMA of phase 1.")
    settings = gans[0].get("settings")
    if settings:
        note += " " + settings_note(settings, gans[0]["config"], gans[0]["buffer"].get("truncation", 1.0))
    return ReportTable("gan_summary", title, pd.DataFrame(rows).T, note, rows_are="node")


def kind_summary(gans: list[dict]) -> ReportTable:
    """Generators of a kind without a table of its own here (a generator plugin's, or kinds mixed): each node's
    kind and buffer, and the fidelity score train-gan gives every kind."""
    rows = {}
    for node in dict.fromkeys(g["node"] for g in gans):
        mine = [g for g in gans if g["node"] == node]
        rows[node] = {"kind": ", ".join(dict.fromkeys(g["config"]["generator"] for g in mine)),
                      "buffer": str(mine[0]["buffer"]["size"])}
        scored = [g["fidelity"] for g in mine if g.get("fidelity")]
        if scored:
            rows[node] |= {"fidelity ratio": Stat.of([f["ratio"] for f in scored]),
                           "synthetic acc": Stat.of([f["synthetic_accuracy"] for f in scored]),
                           "real acc": Stat.of([f["real_accuracy"] for f in scored])}
    note = ("Fidelity: the federate classifier trained on the released buffer only (synthetic acc) or on the node's "
            "real training images (real acc), both tested on the node's real test images; ratio = synthetic / real.")
    return ReportTable("gan_summary", "Generator summary per node", pd.DataFrame(rows).T, note, rows_are="node")


def vqvae2_summary(subs: list[SubExperiment], gans: list[dict]) -> Built:
    """The VQ-VAE-2 kind's nodes: where each stood in the serial chain, its codes, and the fidelity of its buffer
    and of its decoded codes, saying which buffers are reconstructions of real patients."""
    standalone = [own_scores(run.metrics, "accuracy") for s in subs if (run := s.run("standalone")) is not None]
    rows = {}
    for node in dict.fromkeys(g["node"] for g in gans):
        mine = [g for g in gans if g["node"] == node]
        rows[node] = {"chain position": str(mine[0]["serial"]["position"]),
                      **{name: Stat.of([g["codes"][key] for g in mine if "codes" in g])  # none under DP
                         for name, key in (("reconstruction MSE", "reconstruction_mse"),
                                           ("perplexity top", "perplexity_top"),
                                           ("perplexity bottom", "perplexity_bottom"))},
                      "buffer": f"{mine[0]['buffer']['size']} {mine[0]['buffer_kind']}"}
        scored = [g["fidelity"] for g in mine if g.get("fidelity")]
        if scored:
            rows[node] |= {"fidelity ratio": Stat.of([f["ratio"] for f in scored]),
                           "ratio decoded codes": Stat.of([d["ratio"] for g in mine if (d := decoded_fidelity(g))]),
                           "real acc": Stat.of([f["real_accuracy"] for f in scored]),
                           "class fidelity": Stat.of([f["class_fidelity"] for f in scored])}
        if standalone:
            rows[node]["standalone acc"] = Stat.of([sc.get(node) for sc in standalone])
    decoded = sorted({g["node"] for g in gans if g["buffer_kind"] == "decoded codes"})
    note = ("VQ-VAE-2 (train-gan --generator vqvae2), trained serially across the nodes in the chain's order; "
            "reconstruction MSE: the final decoder's on the node's codes against its real training images ([-1, 1] "
            "units); perplexity: how many codes its codes use, as if equally. Fidelity ratio: as for GAN buffers, "
            "the federate classifier trained on the released buffer over one trained on real images, both tested "
            "on the node's real test images; ratio decoded codes: the same for decoded codes of the node's images. "
            "Codes of real images, decoded, are reconstructions of real patients' images: any replay of codes "
            "(cwt-replay, fedavg-replay) hands them to every node.")
    private = sorted({g["node"] for g in gans if g.get("dp")})
    if private:
        note += (f" The VQ-VAE-2s of {', '.join(private)} were trained under --dp-epsilon: no "
                 "codes left those nodes, their codes are not summarised, and their buffers are prior samples.")
    if decoded:
        note += (f" The buffers of {', '.join(decoded)} are decoded codes (no prior was trained): reconstructions of "
                 "real patients, not synthetic images.")
    return ReportTable("gan_summary", "VQ-VAE-2 summary per node", pd.DataFrame(rows).T, note, rows_are="node")


def phase1_kept(phase1: dict) -> str:
    """The kept standard snapshot's iteration of those run, why phase 1 stopped, and the rule that kept it."""
    rule = f", {phase1['select']}" if "select" in phase1 else ""
    return f"{phase1.get('best_iteration', '?')}/{phase1['iterations']} ({phase1['stopped']}{rule})"


def flag_counts(scores: list[dict]) -> str:
    """Each flag the node's released buffers carried (generators/fidelity.py shortfalls), in how many of its runs."""
    flags = [flag for f in scores for flag in f.get("flags", [])]
    return ", ".join(f"{flag} {flags.count(flag)}/{len(scores)}" for flag in dict.fromkeys(flags))


def phase2_kept(phase2: dict) -> str:
    """The kept privacy snapshot's iteration of those run, and why phase 2 stopped."""
    return f"{phase2['kept_iteration']}/{phase2['iterations']} ({phase2['stopped']})"


def settings_note(settings: dict, config: dict, truncation: float) -> str:
    """The generator's training settings, each `auto` shown with the value it resolved to."""
    def shown(name: str, label: str) -> str:
        value = settings[name]
        return f"{label} {value:.4g}" + (" (auto)" if config.get(name) == "auto" else "")

    form, scale = settings.get("privacy_loss", "all-pairs"), settings.get("privacy_scale", "absolute")
    departures = [text for text, departs in (
        ("each synthetic image pushed from its nearest real training image", form != "all-pairs"),
        ("L_PP divided by the node's real-vs-real LPIPS of the same form", scale != "absolute")) if departs]
    return ("Settings: " + ", ".join([shown("r1_gamma", "R1 gamma"), shown("ada_kimg", "ADA kimg"),
                                      shown("ema_kimg", "EMA half-life kimg"), shown("style_mixing", "style mixing")])
            + f", buffer truncation {truncation:g}, privacy loss alpha {settings.get('alpha', 1):g} {form} {scale}"
            + (f" (departures: {'; '.join(departures)})." if departures else " (the study's form)."))
