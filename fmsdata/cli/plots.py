"""Pictures of a data root and of a loader state, for ``--plot`` (the ``plot`` extra).

``plot_documents``: the document-length distribution of each dataset (log-spaced bins, log
axes) beside the tokens each dataset holds. ``plot_state``: per dataset, how far through
its epoch each logical shard has read, beside the token shares the run delivered against
the weights it asked for. matplotlib is imported only here, with its file-only backend.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

from fmsdata.cli.progress import human
from fmsdata.errors import ConfigError
from fmsdata.util.extras import require
from fmsdata.util.urls import local_path

__all__ = ["check_plot_target", "plot_documents", "plot_state"]

_FORMATS = (".png", ".svg", ".pdf")


def check_plot_target(path: str) -> None:
    """Fail before any work when the picture cannot be written (no matplotlib, no such
    folder, a format matplotlib does not write)."""
    path = local_path(path, "--plot")
    _pyplot()
    if not path.lower().endswith(_FORMATS):
        raise ConfigError(f"--plot {path!r}: the file name must end in {', '.join(_FORMATS)}")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ConfigError(f"--plot {path!r}: folder {folder!r} does not exist")


def _pyplot() -> Any:
    matplotlib = require("matplotlib", "--plot")
    matplotlib.use("Agg")  # files only: no display needed, nothing pops up
    import matplotlib.pyplot as plt

    return plt


def plot_documents(lengths: Mapping[str, Any], path: str, title: str = "") -> None:
    """Document lengths (``{dataset: array of lengths}``) of a root into the image ``path``."""
    import numpy as np

    plt = _pyplot()
    from matplotlib.ticker import FuncFormatter, NullFormatter

    names = list(lengths)
    fig, (hist, bars) = plt.subplots(
        1, 2, figsize=(13, 4.8), gridspec_kw={"width_ratios": [3, 2]}, layout="constrained"
    )
    longest = max((int(v.max()) for v in lengths.values() if len(v)), default=1)
    edges = np.unique(np.logspace(0, math.log10(max(longest, 2)) + 0.05, 40).astype(np.int64))
    for name in names:
        values = np.asarray(lengths[name])
        values = values[values > 0]
        if len(values):
            hist.hist(values, bins=edges, histtype="step", linewidth=1.8, label=name)
    hist.set_xscale("log")
    hist.set_yscale("log")
    plain = FuncFormatter(lambda v, _pos: human(v) if v >= 1 else f"{v:g}")
    hist.xaxis.set_major_formatter(plain)
    hist.yaxis.set_major_formatter(plain)
    hist.yaxis.set_minor_formatter(NullFormatter())
    hist.set_xlabel("document length (tokens, log scale)")
    hist.set_ylabel("documents (log scale)")
    hist.set_title("document-length distribution per dataset")
    hist.grid(True, which="major", alpha=0.3)
    if names:
        hist.legend(fontsize="small")

    tokens = [int(np.asarray(lengths[n]).sum()) for n in names]
    docs = [len(lengths[n]) for n in names]
    ys = np.arange(len(names))
    bars.barh(ys, tokens, color=[f"C{i % 10}" for i in range(len(names))])
    bars.set_yticks(ys, names)
    bars.invert_yaxis()
    bars.set_xlabel("tokens")
    bars.set_title("tokens per dataset")
    for y, (t, d) in enumerate(zip(tokens, docs)):
        bars.annotate(f" {human(t)} tokens, {human(d)} docs", (t, y), va="center", fontsize="small")
    bars.set_xlim(0, max(tokens, default=1) * 1.45 or 1)
    bars.xaxis.set_major_formatter(lambda v, _pos: human(v))
    if title:
        fig.suptitle(title)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_state(summary: Mapping[str, Any], path: str, title: str = "") -> None:
    """A loader state's ``summarize`` output into the image ``path``."""
    import numpy as np

    plt = _pyplot()
    names = list(summary["datasets"])
    shards: Sequence[Mapping[str, Any]] = summary["shards"]
    history = summary.get("mix_history") or []
    ratios = [3, 2, 3] if history else [3, 2]  # a mix that followed the loss: its weights third
    shape = {"figsize": (5 * len(ratios) + 3, 4.8), "gridspec_kw": {"width_ratios": ratios}}
    fig, (progress, shares, *mix) = plt.subplots(1, len(ratios), layout="constrained", **shape)
    if history:
        _plot_mix_history(mix[0], history, names, int(summary.get("steps") or 0))
    ids = np.array([int(row["id"]) for row in shards])
    few = len(ids) <= 32
    width = 0.8 / max(len(names), 1)
    for i, name in enumerate(names):
        reached = [row["datasets"][name].get("epochs_done") or 0.0 for row in shards]
        if few:  # grouped bars: one group per logical shard
            offset = (i - (len(names) - 1) / 2) * width
            progress.bar(ids + offset, reached, width, color=f"C{i % 10}", label=name)
        else:
            progress.plot(
                ids, reached, drawstyle="steps-mid", linewidth=1.0, color=f"C{i % 10}", label=name
            )
    if few:
        progress.set_xticks(ids)
    progress.set_xlabel("logical shard")
    progress.set_ylabel("epochs read (epoch + fraction of the next)")
    progress.set_title("how far each logical shard has read, per dataset")
    progress.set_ylim(bottom=0)
    progress.grid(True, alpha=0.3)
    if names:
        progress.legend(fontsize="small")

    tokens = np.array([float(summary["datasets"][n]["tokens"]) for n in names])
    realised = tokens / tokens.sum() if tokens.sum() > 0 else np.zeros(len(names))
    target, target_label = _target_shares(summary, len(names))
    xs = np.arange(len(names))
    width = 0.38
    shares.bar(xs - width / 2, realised, width, label="delivered share of tokens", color="C0")
    if target is not None:
        shares.bar(xs + width / 2, target, width, label=target_label, color="C1", alpha=0.7)
    for x, value in zip(xs, realised):
        shares.annotate(f"{value:.1%}", (x - width / 2, value), ha="center", va="bottom")
    for x, value in zip(xs, target or []):
        shares.annotate(f"{value:.1%}", (x + width / 2, value), ha="center", va="bottom")
    shares.set_xticks(xs, names)
    shares.set_ylabel("share of tokens")
    shares.set_ylim(0, max(1e-9, float(max(realised.max(initial=0), *(target or [0])))) * 1.25)
    shares.yaxis.set_major_formatter(lambda v, _pos: f"{v:.0%}")
    left_out = summary.get("left_out")
    shares.set_title(
        "token shares: delivered vs asked" + (" (not every line counted)" if left_out else "")
    )
    shares.legend(fontsize="small")
    if title:
        fig.suptitle(title)
    if left_out:
        # The shares of a short run with lines in flight can be far from the weights: the
        # figure says what it leaves out, as the text does.
        import textwrap

        fig.text(0.01, 0.005, textwrap.fill(f"note: {left_out}", 160), fontsize="small")
        fig.get_layout_engine().set(rect=(0, 0.06, 1, 0.94))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_mix_history(
    axes: Any, history: Sequence[Sequence[Any]], names: Sequence[str], steps: int
) -> None:
    """Each dataset's weight as applied, a step line from each update to the state's step."""
    xs = [int(at) for at, _ in history]
    end = max(steps, xs[-1])
    for i, name in enumerate(names):
        ys = [float(weights[i]) for _, weights in history if i < len(weights)]
        if len(ys) != len(xs):
            continue
        axes.step([*xs, end], [*ys, ys[-1]], where="post", color=f"C{i % 10}", label=name)
    axes.set_xlabel("step")
    axes.set_ylabel("weight (share of tokens)")
    axes.set_title("weights as applied (mix that follows the loss)")
    axes.set_ylim(0, 1)
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize="small")


def _target_shares(summary: Mapping[str, Any], n: int) -> tuple[list[float] | None, str]:
    """The weights the run asked for, as shares; for a schedule, its last point's."""
    schedule = summary.get("weight_schedule")
    weights = summary.get("weights")
    label = "weights (config)"
    history = summary.get("mix_history")
    if history:
        weights, label = history[-1][1], "weights (as applied last)"
    elif schedule:
        weights = schedule[-1][1]
        label = "weights (last point of the schedule)"
    if weights is None:
        weights, label = [1.0] * n, "weights (equal)"
    if len(weights) != n or sum(weights) <= 0:
        return None, label
    total = float(sum(weights))
    return [float(w) / total for w in weights], label
