"""Printing and plotting what ``edgecv bench`` measured."""

from __future__ import annotations

from tabulate import tabulate

from ..board.errors import EdgecvError
from ..board.precision import Precision


def _summary(report: dict) -> None:
    shape = "x".join(map(str, report["input_shape"]))
    print(
        f"{report['model']} ({report['profile']} package) on {report['device']}, "
        f"input {shape}, batch 1, {report.get('precision', Precision.FP32.value).upper()}, "
        f"{report['threads']} threads"
    )
    print(
        f"load {report['load_s']:.2f} s; peak RSS {report['peak_rss_mib']:.0f} MiB "
        f"(+{report['rss_growth_mib']:.0f} MiB loading and running the package)"
    )


def _agreement(r: dict) -> str:
    agree = r.get("agreement")
    if agree is None:
        return "(reference)"
    if "error" in agree:
        return agree["error"]
    return f"max |diff|/scale {agree['max_rel_diff']:.1e}, same top-1: {agree['same_top1']}"


def _table(headers: list[str], rows: list[list], floatfmt: tuple, note: str = "") -> None:
    """One runtime per row, numbers right-aligned in each column's format."""
    print(tabulate(rows, headers=headers, tablefmt="simple", floatfmt=floatfmt))
    if note:
        print(note)


def print_report(report: dict, top: int = 10) -> None:
    """The bench report as text: summary, runtimes table, not-run list, top kernels."""
    _summary(report)
    ours = report["runtimes"]["edgecv"]["p50_ms"]
    rows = [
        [
            f"{name} {r['version']}",
            r["p50_ms"],
            r["p90_ms"],
            r["p99_ms"],
            r["throughput_per_s"],
            r["load_s"],
            r["p50_ms"] / ours,
            _agreement(r),
        ]
        for name, r in report["runtimes"].items()
    ]
    headers = ["runtime", "p50 ms", "p90 ms", "p99 ms", "inf/s", "load s", "edgecv x"]
    formats = ("", ".2f", ".2f", ".2f", ".1f", ".2f", ".2f")
    _table([*headers, "agreement with edgecv"], rows, formats)
    _notes_and_kernels(report, top)


def print_throughput_report(report: dict, top: int = 10) -> None:
    """The ``--streams`` report: throughput of each runtime under N callers at once
    (median over the rounds, and the worst round), per-call latency, the ratio."""
    _summary(report)
    streams = report["streams"]
    print(f"{streams} callers at once; edgecv loaded with streams={streams}")
    ours = report["runtimes"]["edgecv"]["throughput_per_s"]
    rows = [
        [
            f"{name} {r['version']}",
            r["throughput_per_s"],
            r["throughput_min_per_s"],
            r["p50_ms"],
            r["p90_ms"],
            f"{ours / r['throughput_per_s']:.2f}x",
            _agreement(r),
        ]
        for name, r in report["runtimes"].items()
    ]
    headers = ["runtime", "inf/s", "worst", "p50 ms", "p90 ms", "vs edgecv"]
    note = "vs edgecv: edgecv's throughput over the runtime's (above 1: edgecv serves more)"
    formats = ("", ".1f", ".1f", ".2f", ".2f")
    _table([*headers, "agreement with edgecv"], rows, formats, note)
    _notes_and_kernels(report, top)


def _notes_and_kernels(report: dict, top: int) -> None:
    notes: dict[str, list[str]] = {}  # one line per note, naming the runtimes it concerns
    for name, r in report["runtimes"].items():
        for note in r.get("notes", []):
            notes.setdefault(note, []).append(name)
    for note, names in notes.items():
        print(f"note: {', '.join(names)}: {note}")
    for name, why in report["not_run"].items():
        print(f"not run: {name}: {why}")
    kernels = report["kernels"]
    total = sum(k["seconds"] for k in kernels) or 1.0
    print(f"top kernels ({len(kernels)} in all, {total * 1e3:.2f} ms per inference summed):")
    for k in kernels[:top]:
        ops = ", ".join(k["ops"]) if k["ops"] else "-"
        print(
            f"  {k['seconds'] * 1e3:8.3f} ms {100 * k['seconds'] / total:5.1f}%  {k['device']:<4} "
            f"x{k['launches']:<3} {k['kernel'][:48]:<48} [{ops[:60]}] ({k['how']})"
        )


def plot(report: dict, path: str) -> None:
    """A bar chart of p50 latency per runtime with p90/p99 marks, written to ``path``."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise EdgecvError("--plot needs matplotlib: pip install 'edgecv[bench]'") from None
    names = list(report["runtimes"])
    rows = [report["runtimes"][n] for n in names]
    fig, ax = plt.subplots(figsize=(6, 3.2))
    ax.bar(names, [r["p50_ms"] for r in rows], color="#3a7dc9", label="p50")
    ax.scatter(names, [r["p90_ms"] for r in rows], marker="_", s=400, color="k", label="p90")
    ax.scatter(names, [r["p99_ms"] for r in rows], marker="_", s=400, color="r", label="p99")
    ax.set_ylabel("latency (ms)")
    ax.set_title(f"{report['model']} ({report['profile']}), batch 1")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
