"""What ``edgecv deploy --explain`` prints, read from the package's manifest: the tuning
databases, the placement and copies, the precision, the layouts and the schedules."""

from __future__ import annotations

from ..board.manifest import Manifest


def explain(manifest: Manifest) -> None:
    """Print every section of ``deploy --explain``, in the order a reader follows the
    build: what it read, where each launch runs, in which precision, layouts, schedules."""
    explain_tuning(manifest)
    explain_placement(manifest)
    explain_precision(manifest)
    explain_layouts(manifest)
    explain_schedules(manifest)


def explain_tuning(manifest: Manifest) -> None:
    """Print the tuning databases the build read, highest priority first."""
    folders = manifest.tuning_databases or ["none"]
    print(f"tuning databases: {', '.join(folders)}")


def explain_precision(manifest: Manifest) -> None:
    """Print which launches run in which precision, or what fp16 would save."""
    from ..pipelines.fp16 import explain_lines

    for line in explain_lines(manifest):
        print(line)


def explain_layouts(manifest: Manifest) -> None:
    """Print each convolution's layout and every transform inserted, with their times."""
    from ..graph_tuner.explain import describe

    for line in describe(manifest.layouts):
        print(line)


def explain_schedules(manifest: Manifest) -> None:
    """Print which rule scheduled each kernel, and why earlier rules were passed over;
    kernels of operators registered with ``--ops`` always (the user's own kernels)."""
    from ..op_registry import registered_names

    registered = set(registered_names())
    for device, facts in manifest.schedules.items():
        counts = ", ".join(f"{rule} {n}" for rule, n in facts["rules"].items())
        print(f"schedules ({device}): {counts}")
        for name, kernel in facts["kernels"].items():
            mine = registered & set(kernel["ops"])
            if kernel["passed_over"] or kernel["rule"] in (None, "tuned") or mine:
                why = "; ".join(f"{r}: {w}" for r, w in kernel["passed_over"])
                print(
                    f"  {name} ({', '.join(kernel['ops'])}): {kernel['rule']}"
                    + (f"  [{why}]" if why else "")
                )


def explain_placement(manifest: Manifest) -> None:
    """Print where each launch runs and every device copy."""
    placement = manifest.placement
    if placement is None:
        print(f"placement: every launch on the {manifest.runtime} device")
        return
    counts = placement["launches"]
    print(f"placement: {counts['gpu']} launches on the GPU, {counts['cpu']} on the CPU")
    for node in placement["cpu_nodes"]:
        from ..fallback import REASONS

        detail = f" [{node['detail']}]" if node["detail"] else ""
        print(
            f"  cpu  {node['kernel']} ({', '.join(node['ops'])}): {REASONS[node['reason']]}{detail}"
        )
    print(f"copies: {len(placement['copies'])}, {placement['copy_bytes']:,} bytes per inference")
    for c in placement["copies"]:
        shape = "x".join(map(str, c["shape"]))
        print(f"  {c['from']}->{c['to']}  {shape} {c['dtype']}  {c['bytes']:,} bytes")
