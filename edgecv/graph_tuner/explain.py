"""``deploy --explain``: the graph tuner's choice, as lines of text."""

from __future__ import annotations


def describe(facts: dict | None) -> list[str]:
    """Each convolution's layout with its time in every candidate, and every transform
    inserted with its measured time, from the manifest's ``build.layouts``."""
    if not facts:
        return []
    if "predicted_s" not in facts:
        why = f" ({facts['reason']})" if facts.get("reason") else ""
        return [f"layouts ({facts['mode']}): {facts['chosen']}{why}"]
    uniform = ", ".join(f"all {k} {_ms(v)}" for k, v in facts["uniform_predicted_s"].items())
    sources = ", ".join(f"{n} {k}" for k, n in facts["costs"].items())
    lines = [
        f"layouts ({facts['mode']}): {facts['solver']} over {len(facts['convolutions'])} "
        f"convolutions, predicted {_ms(facts['predicted_s'])} ({uniform}); costs: {sources}"
    ]
    winograd = {name: c["side"] for c in facts.get("winograd", []) for name in c["convolutions"]}
    for conv in facts["convolutions"]:
        shape = "x".join(map(str, conv["shape"]))
        origins = conv.get("sources", {})
        times = ", ".join(
            f"{k} {_ms(v)}{' predicted' if origins.get(k) == 'predicted' else ''}"
            for k, v in conv["seconds"].items()
        )
        lines.append(
            f"  {conv['name']:<8} {conv.get('op', ''):<16} {shape:<16} {conv['layout']:<8} "
            f"({times})"
        )
        side = winograd.get(conv["name"])
        if side:
            lines.append(f"  {'':<8} runs Winograd F({side}x{side}, 3x3)")
        for layout, algorithms in conv.get("algorithms", {}).items():
            times = ", ".join(f"{k} {_ms(v)}" for k, v in algorithms.items())
            lines.append(f"  {'':<8} {layout} by algorithm: {times}")
    lines.append(f"transforms inserted: {facts['inserted_transforms']}")
    for t in facts["transforms"]:
        shape = "x".join(map(str, t["shape"]))
        lines.append(
            f"  {t['producer']} -> {t['consumer']}  {shape}  {t['src']} -> {t['dst']}  "
            f"{_ms(t['seconds'])}"
        )
    if facts.get("model_mismatch"):
        lines.append(f"  note: {facts['model_mismatch']}")
    return lines


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "n/a"
    return f"{seconds * 1e3:.3f} ms" if seconds >= 1e-5 else f"{seconds * 1e6:.1f} us"
