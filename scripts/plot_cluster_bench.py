#!/usr/bin/env python3
# Plot or tabulate the JSON written by `farmem bench cluster`: each target's farmem value next to
# its baseline, with the median per-round ratio and its min-max.
# Usage: plot_cluster_bench.py cluster.json [out.png]   (without out.png or matplotlib: a markdown table)
import json
import sys


def table(doc):
    m = doc.get("machine", {})
    print(f"# farmem bench cluster — {m.get('date', '?')}, {m.get('nproc', '?')} CPUs\n")
    print("| target | farmem | baseline | ratio (min-max) | limit | result |")
    print("|---|---|---|---|---|---|")
    for t in doc["targets"]:
        r = t.get("ratio")
        rr = "n/a" if r is None else f"{r:.2f}x ({t['ratio_min']:.2f}-{t['ratio_max']:.2f})"
        print(f"| {t['name']} | {t['value']:.3f} | {t['baseline']:.3f} | {rr} | {t['limit']} | {t['result']} |")


def plot(doc, out):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    targets = doc["targets"]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    ys = range(len(targets))
    ax.barh([y + 0.2 for y in ys], [t["value"] for t in targets], height=0.4, label="farmem")
    ax.barh([y - 0.2 for y in ys], [t["baseline"] for t in targets], height=0.4, label="baseline")
    for y, t in zip(ys, targets):
        r = t.get("ratio")
        txt = "n/a" if r is None else f"{r:.2f}x {t['result']}"
        ax.text(max(t["value"], t["baseline"]) * 1.1, y, txt, va="center", fontsize=8)
    ax.set_yticks(list(ys))
    ax.set_yticklabels([t["name"] for t in targets], fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("ms (log scale)")
    ax.set_title("farmem bench cluster: control-plane latency vs etcd's tools (median of per-round ratios)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main():
    if len(sys.argv) < 2:
        print(__doc__ or "usage: plot_cluster_bench.py cluster.json [out.png]", file=sys.stderr)
        return 2
    with open(sys.argv[1]) as f:
        doc = json.load(f)
    if len(sys.argv) > 2:
        try:
            plot(doc, sys.argv[2])
            return 0
        except ImportError:
            print("matplotlib not installed; printing a table", file=sys.stderr)
    table(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
