"""Tables of ``zoo_coverage.py``: one CSV row per model, a Markdown summary per family.

Run as a script, it merges the CSVs of several sweeps (sweeps of other families, a
retry of failed models) into one table; a model's row in a later file replaces its row
in an earlier one:

    python benchmarks/zoo_coverage_tables.py OUT first.csv second.csv retry.csv
    python benchmarks/zoo_coverage_tables.py OUT sweep.csv --probes benchmarks/results/probes
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

STAGES = ("build", "import", "compile", "parity")


def _passed(row: dict, column: str) -> bool:
    """``tie``: a mismatch ``zoo_probe.py`` proved a tie MXNet's own rounding also breaks."""
    if column == "tie":
        return row.get("parity") == "tie"
    return row.get(column) == "ok"


def summarize(rows: list[dict], columns: list[str]) -> list[str]:
    families = sorted({r["family"] for r in rows if r.get("build") != "skipped"})
    lines = [
        "| family | models | " + " | ".join(columns) + " |",
        "|---|---|" + "---|" * len(columns),
    ]
    totals = [0] * (len(columns) + 1)
    for fam in families + ["all"]:
        sub = rows if fam == "all" else [r for r in rows if r["family"] == fam]
        sub = [r for r in sub if r.get("build") != "skipped"]
        counts = [len(sub)] + [sum(_passed(r, c) for r in sub) for c in columns]
        if fam == "all":
            counts = totals
            fam = "**all**"
        else:
            totals = [a + b for a, b in zip(totals, counts, strict=True)]
        lines.append(f"| {fam} | {counts[0]} | " + " | ".join(map(str, counts[1:])) + " |")
    return lines


def write_tables(rows: list[dict], out: Path, import_only: bool) -> None:
    before = ["import_before"] if any("import_before" in r for r in rows) else []
    columns = ["build", *before, "import"] + ([] if import_only else ["compile", "parity"])
    ties = ["tie"] if any(r.get("parity") == "tie" for r in rows) else []
    fields = [
        "model",
        "family",
        *columns,
        "build_s",
        "import_s",
        "compile_s",
        "latency_ms",
        "loosen",
        "cut_tie_rows",
        "probe",
        "error",
        "error_before",
    ]
    with open(out.with_suffix(".csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    skipped = [r for r in rows if r.get("build") == "skipped"]
    lines = ["# GluonCV zoo coverage", "", *summarize(rows, columns + ties), ""]
    if ties:
        lines += [
            "`tie`: outputs differ from MXNet's, and `benchmarks/zoo_probe.py` found no stage "
            "departing beyond MXNet's own one-step drift (verdict file in the CSV's `probe`).",
            "",
        ]
    if skipped:
        lines += [f"Skipped {len(skipped)} models: {skipped[0]['error']}.", ""]
    lines += [
        "| model | family | " + " | ".join(columns) + " | latency ms | failure |",
        "|---|---|" + "---|" * (len(columns) + 2),
    ]
    for r in rows:
        if r.get("build") == "skipped":
            continue
        cells = [r.get(c, "-") for c in columns]
        error = str(r.get("error", "")).replace("|", "\\|")
        lines.append(
            f"| {r['model']} | {r['family']} | "
            + " | ".join(cells)
            + f" | {r.get('latency_ms', '')} | {error} |"
        )
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")


def merge(paths: list[Path]) -> list[dict]:
    """The rows of ``paths`` by model, a later file's row replacing an earlier one's."""
    rows: dict[str, dict] = {}
    for path in paths:
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                rows[row["model"]] = row
    return list(rows.values())


def main() -> None:
    parser = argparse.ArgumentParser(description="merge zoo_coverage.py sweeps into one table")
    parser.add_argument("out", type=Path, help="writes OUT.csv and OUT.md")
    parser.add_argument("csvs", type=Path, nargs="+", help="sweep CSVs, later ones win")
    parser.add_argument(
        "--probes",
        type=Path,
        help="zoo_probe.py's verdicts (benchmarks/results/probes): a mismatch proved a tie "
        "counts as parity=tie",
    )
    parser.add_argument("--seed", type=int, default=0, help="the sweeps' seed (with --probes)")
    parser.add_argument("--profile", default="cpu", help="the sweeps' profile (with --probes)")
    args = parser.parse_args()
    rows = merge(args.csvs)
    if args.probes:
        from zoo_probe import apply_probe_verdict

        for row in rows:
            apply_probe_verdict(row, args.probes, args.seed, args.profile)
    write_tables(rows, args.out, import_only=not any(r.get("compile") for r in rows))
    print("\n".join(summarize(rows, ["build", "import", "compile", "parity", "tie"])))


if __name__ == "__main__":
    main()
