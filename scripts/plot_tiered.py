#!/usr/bin/env python3
# Plot or tabulate the JSON written by `farmem bench tiered`: the hot-set-move timeline, the
# ablation ladder, every case's median throughput per subject, and the targets.
# Usage: plot_tiered.py tiered.json [out.png]   (without out.png or matplotlib: a markdown table)
import json
import sys

from bench_plot import fmt_ratio as _fmt_ratio
from bench_plot import print_targets


def fmt_ratio(t):
    return _fmt_ratio(t, spec=".3g", unit="")


def table(doc):
    m = doc.get("machine", {})
    c = doc["config"]
    print(f"# farmem bench tiered — {m.get('date', '?')}, {m.get('nproc', '?')} CPUs, "
          f"{c['capacity_bytes'] >> 20} MiB region, {c['rounds']} rounds x {c['slice_seconds']} s, "
          f"disk {json.dumps(doc.get('disk', {}))}\n")
    print_targets(doc, fmt_ratio)
    print("\n| workload | subject | median ops/s | vs all-dram | hit ratio |")
    print("|---|---|---|---|---|")
    for case in doc["cases"]:
        for name, s in case["subjects"].items():
            r = s.get("ratio_vs_all-dram")
            h = s.get("pages", {}).get("hit_ratio")
            print(f"| {case['workload']} | {name} | {s['median_ops_per_second'] or 0:.0f} | "
                  f"{'' if r is None else f'{r:.2f}x'} | {'' if h is None else f'{h:.3f}'} |")


def plot(doc, out):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(17, 4.8))
    # Hot-set move timeline.
    ax = axes[0]
    hs = doc.get("hot_set_move") or {}
    if hs.get("ops_per_bucket"):
        b = hs["bucket_ms"]
        xs = [i * b / 1000 for i in range(len(hs["ops_per_bucket"]))]
        ys = [v * 1000 / b / 1000 for v in hs["ops_per_bucket"]]
        ax.plot(xs, ys, drawstyle="steps-post")
        ax.axvline(hs["move_ms"] / 1000, color="red", linestyle="--", label="hot set moved")
        ax.axhline(hs["before_mean"] * 1000 / b / 1000 * 0.95, color="gray", linestyle=":",
                   label="95 % of before")
        ax.legend(loc="lower right")
    ax.set_xlabel("s")
    ax.set_ylabel("k ops/s")
    ax.set_title(f"hot-set move ({hs.get('subject', '?')}, 4 KiB Zipf reads)")
    # Ablation ladder.
    ax = axes[1]
    lad = doc.get("ladder") or []
    ax.bar([s["mode"] for s in lad], [s["median_ops_per_second"] / 1000 for s in lad])
    ax.set_ylabel("k ops/s (median round)")
    ax.set_title("ablation ladder, DRAM 50 %, 4 KiB Zipf reads")
    # Ratios vs all-DRAM per case and subject.
    ax = axes[2]
    labels, vals = [], []
    for case in doc["cases"]:
        for name, s in case["subjects"].items():
            r = s.get("ratio_vs_all-dram")
            if r is not None and name.startswith("tier-"):
                labels.append(f"{case['workload']} {name}")
                vals.append(r)
    ax.barh(range(len(vals)), vals)
    ax.set_yticks(range(len(vals)))
    ax.set_yticklabels(labels, fontsize=6)
    ax.axvline(1.0, color="gray", linestyle=":")
    ax.set_xlabel("median per-round ratio vs all-DRAM")
    ax.set_title("tier vs all-DRAM")
    m = doc.get("machine", {})
    passed = sum(t["result"] == "PASS" for t in doc["targets"])
    fig.suptitle(f"farmem bench tiered — {doc['config']['capacity_bytes'] >> 20} MiB, "
                 f"{m.get('nproc', '?')} CPUs, {passed}/{len(doc['targets'])} targets PASS")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main():
    if len(sys.argv) < 2:
        print(__doc__ or "usage: plot_tiered.py tiered.json [out.png]", file=sys.stderr)
        sys.exit(2)
    with open(sys.argv[1]) as f:
        doc = json.load(f)
    if len(sys.argv) > 2:
        try:
            plot(doc, sys.argv[2])
            return
        except ImportError:
            pass
    table(doc)


if __name__ == "__main__":
    main()
