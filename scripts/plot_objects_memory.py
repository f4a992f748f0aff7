#!/usr/bin/env python3
# Plot or tabulate the JSON written by `farmem bench objects-memory`: active memory per series
# (allocator accounting and RSS growth) for the synthetic traces and the Redis-like traces, with
# the live payload, glibc after malloc_trim, jemalloc after purge and hybrid after trim (issue 15).
# Usage: plot_objects_memory.py objects_memory.json [out.png]   (no out.png or matplotlib: tables)
import json
import sys

# Series in drawing order: (key, label, colour, line style).
SERIES = [
    ("ideal", "ideal", "black", ":"),
    ("no_compaction", "no compaction", "tab:gray", "--"),
    ("corm0", "CoRM-0", "tab:brown", "-"),
    ("corm8", "CoRM-8", "tab:orange", "-"),
    ("corm12", "CoRM-12", "tab:olive", "-"),
    ("corm16", "CoRM-16", "tab:cyan", "-"),
    ("hybrid", "hybrid", "tab:blue", "-"),
    ("glibc", "glibc", "tab:red", "-."),
    ("jemalloc", "jemalloc", "tab:purple", "-."),
    ("glibc_trim", "glibc-trim", "salmon", ":"),
    ("jemalloc_purge", "jemalloc-purge", "plum", ":"),
    ("hybrid_trim", "hybrid-trim (RSS)", "navy", "--"),
    ("live", "live payload", "tab:green", ":"),
]
MIB = float(1 << 20)


def value(trace, key, metric):
    if key == "live":  # the trace's live payload bytes (the issue-15 targets' yardstick)
        return trace.get("live_payload_bytes", 0) / MIB
    if key == "hybrid_trim":  # hybrid after compaction and malloc_trim(0): RSS only
        s = trace["series"].get("hybrid", {}).get("after_compaction_released")
        if metric != "rss_bytes" or not s or s.get("rss_bytes") is None:
            return None
        return s["rss_bytes"] / MIB
    s = trace["series"].get(key)
    if not s or metric not in s or s[metric] is None:
        return None
    return s[metric] / MIB


def fmt(v):
    return "n/a" if v is None else f"{v:.2f}"


def geometry(doc):
    """The run's block geometry: per trace before per-class blocks, one for the run since."""
    o = doc.get("options", {})
    if "max_block_size" in o:
        return (f"{o['block_size'] // 1024} KiB base blocks, blocks up to "
                f"{o['max_block_size'] // 1024} KiB of >= {o['min_slots_per_block']} slots")
    return None


def block_label(doc, t):
    return f"{t['block_size'] // 1024} KiB blocks" if "block_size" in t else geometry(doc)


def table(doc):
    m = doc.get("machine", {})
    print(f"# farmem bench objects-memory — {m.get('date', '?')}, {m.get('nproc', '?')} CPUs\n")
    for metric, title in (("accounted_bytes", "allocator accounting"), ("rss_bytes", "RSS growth")):
        print(f"## Active memory, {title} (MiB)\n")
        print("| trace | blocks | " + " | ".join(label for _, label, _, _ in SERIES) + " |")
        print("|---|---|" + "---|" * len(SERIES))
        for t in doc["traces"]:
            cells = [fmt(value(t, k, metric)) for k, _, _, _ in SERIES]
            print(f"| {t['label']} | {block_label(doc, t)} | " + " | ".join(cells) + " |")
        print()
    print("| target | value (MiB) | baseline (MiB) | ratio | limit | result | detail |")
    print("|---|---|---|---|---|---|---|")
    for t in doc.get("targets", []):
        r = "n/a" if t.get("ratio") is None else f"{t['ratio']:.2f}x"
        v = "" if t.get("value") is None else f"{t['value'] / MIB:.2f}"
        b = "" if t.get("baseline") is None else f"{t['baseline'] / MIB:.2f}"
        lim = "" if t.get("limit") is None else f"<= {t['limit']:.2f}x"
        print(f"| {t['name']} | {v} | {b} | {r} | {lim} | {t['result']} | {t.get('detail', '')} |")


def plot(doc, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    synth = [t for t in doc["traces"] if t["trace"] == "synthetic"]
    redis = [t for t in doc["traces"] if t["trace"] != "synthetic"]
    sizes = sorted({t["size"] for t in synth})
    kinds = [k for k in ("t1", "t2", "t3") if any(t["trace"] == k for t in redis)]
    cols = max(len(sizes), len(kinds), 1)
    rows = (2 if sizes else 0) + (2 if kinds else 0)
    if rows == 0:
        raise SystemExit("no traces in the document")
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.6 * rows), squeeze=False)
    for ax in axes.flat:
        ax.set_visible(False)
    row = 0
    metrics = (("accounted_bytes", "allocator accounting"), ("rss_bytes", "RSS growth"))
    if sizes:
        for metric, what in metrics:
            for c, size in enumerate(sizes):
                ax = axes[row][c]
                ax.set_visible(True)
                ts = sorted((t for t in synth if t["size"] == size), key=lambda t: t["free_fraction"])
                xs = [t["free_fraction"] * 100 for t in ts]
                for key, label, colour, style in SERIES:
                    ys = [value(t, key, metric) for t in ts]
                    if all(y is None for y in ys):
                        continue
                    ax.plot(xs, [float("nan") if y is None else y for y in ys], style, color=colour,
                            label=label, marker="o", markersize=3,
                            linewidth=2.5 if key == "hybrid" else 1.2)
                ax.set_title(f"synthetic {size} B ({block_label(doc, ts[0])})", fontsize=8)
                ax.set_xlabel("objects freed (%)")
                ax.set_ylabel(f"MiB, {what}")
                ax.set_ylim(bottom=0)
                ax.grid(alpha=0.3)
            row += 1
    if kinds:
        bar_series = [s for s in SERIES]
        for metric, what in metrics:
            for c, kind in enumerate(kinds):
                ax = axes[row][c]
                ax.set_visible(True)
                ts = sorted((t for t in redis if t["trace"] == kind), key=lambda t: t["threads"])
                width = 0.8 / len(bar_series)
                for i, (key, label, colour, _) in enumerate(bar_series):
                    ys = [value(t, key, metric) for t in ts]
                    if all(y is None for y in ys):
                        continue
                    xs = [j + (i - len(bar_series) / 2 + 0.5) * width for j in range(len(ts))]
                    ax.bar(xs, [0 if y is None else y for y in ys], width, color=colour, label=label,
                           hatch="//" if key == "hybrid" else None)
                ax.set_xticks(range(len(ts)))
                ax.set_xticklabels([f"{t['threads']} thr" for t in ts])
                ax.set_title(f"{ts[0]['label'].rsplit(',', 1)[0]} ({block_label(doc, ts[0])})",
                             fontsize=8)
                ax.set_ylabel(f"MiB, {what}")
                ax.grid(axis="y", alpha=0.3)
            row += 1
    handles, labels = [], []
    for ax in axes.flat:
        if ax.get_visible():
            for h, l in zip(*ax.get_legend_handles_labels()):
                if l not in labels:
                    handles.append(h)
                    labels.append(l)
    fig.legend(handles, labels, loc="upper center", ncol=len(labels), fontsize=9,
               bbox_to_anchor=(0.5, 0.995))
    m = doc.get("machine", {})
    lines = [f"farmem bench objects-memory — {m.get('date', '?')}, {m.get('nproc', '?')} CPUs; "
             "CoRM after compacting until nothing merges, malloc after the trace"]
    for t in doc.get("targets", []):
        r = "n/a" if t.get("ratio") is None else f"{t['ratio']:.2f}x"
        lines.append(f"[{t['result']}] {t['name']}: {r}")
    fig.text(0.5, 0.005, "\n".join(lines), ha="center", va="bottom", fontsize=8)
    fig.tight_layout(rect=(0, 0.03 + 0.012 * len(lines), 1, 0.965))
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


def main():
    usage = "usage: plot_objects_memory.py objects_memory.json [out.png]"
    if len(sys.argv) == 2 and sys.argv[1] in ("-h", "--help"):
        print(usage)
        return 0
    if len(sys.argv) not in (2, 3):
        print(usage, file=sys.stderr)
        return 2
    try:
        with open(sys.argv[1]) as f:
            doc = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        print(f"plot_objects_memory.py: cannot read {sys.argv[1]}: {e}", file=sys.stderr)
        return 1
    if len(sys.argv) == 3:
        try:
            plot(doc, sys.argv[2])
            return 0
        except ImportError:
            print("matplotlib is not installed; printing tables instead", file=sys.stderr)
    table(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
