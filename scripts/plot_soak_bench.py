#!/usr/bin/env python3
# Plot or tabulate the JSON written by `farmem bench soak`: legitimate ops/s per round without and
# with hostile clients, farmemd's peak RSS per round against the budget, and the four targets.
# Usage: plot_soak_bench.py soak.json [out.png]   (without out.png or matplotlib: a markdown table)
import json
import sys

from bench_plot import fmt_ratio, print_targets


def table(doc):
    m = doc.get("machine", {})
    print(f"# farmem bench soak — {m.get('date', '?')}, {m.get('nproc', '?')} CPUs, "
          f"{doc['options']['rounds']} rounds, wall {doc.get('wall_seconds', 0):.0f} s\n")
    print_targets(doc)
    print("\n| round | baseline ops/s | hostile ops/s | ratio | RSS baseline MiB | RSS hostile MiB |")
    print("|---|---|---|---|---|---|")
    for i, r in enumerate(doc["rounds"], 1):
        ratio = r["hostile_ops_per_sec"] / r["baseline_ops_per_sec"] if r["baseline_ops_per_sec"] else 0
        print(f"| {i} | {r['baseline_ops_per_sec']:.0f} | {r['hostile_ops_per_sec']:.0f} | {ratio:.2f} | "
              f"{r['baseline_peak_rss_bytes'] / 2**20:.1f} | {r['hostile_peak_rss_bytes'] / 2**20:.1f} |")


def plot(doc, out):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rounds = doc["rounds"]
    xs = list(range(1, len(rounds) + 1))
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.5))
    w = 0.38
    a1.bar([x - w / 2 for x in xs], [r["baseline_ops_per_sec"] / 1e3 for r in rounds], w,
           label="baseline (legitimate only)")
    a1.bar([x + w / 2 for x in xs], [r["hostile_ops_per_sec"] / 1e3 for r in rounds], w,
           label="with hostile clients")
    a1.set_xlabel("round (A then B)")
    a1.set_ylabel("legitimate k ops/s")
    a1.set_xticks(xs)
    t0 = doc["targets"][0]
    a1.set_title(f"throughput: {fmt_ratio(t0)} {t0['result']} (>= 0.8x)", fontsize=10)
    a1.legend(fontsize=8)

    mib = 2 ** 20
    a2.plot(xs, [r["baseline_peak_rss_bytes"] / mib for r in rounds], "o-", label="baseline peak")
    a2.plot(xs, [r["hostile_peak_rss_bytes"] / mib for r in rounds], "s-", label="hostile peak")
    t1 = doc["targets"][1]
    if t1.get("baseline") is not None:
        a2.axhline(t1["baseline"], color="gray", ls="--", lw=1, label="budget")
        a2.axhline(t1["baseline"] * 1.1, color="red", ls=":", lw=1, label="1.1x budget")
    a2.set_xlabel("round")
    a2.set_ylabel("farmemd RSS (MiB)")
    a2.set_xticks(xs)
    a2.set_ylim(bottom=0)
    r1 = "n/a" if t1.get("ratio") is None else f"{t1['ratio']:.2f}x"
    a2.set_title(f"peak RSS vs budget: {r1} {t1['result']} (<= 1.1x)", fontsize=10)
    a2.legend(fontsize=8)
    others = "; ".join(f"{t['name']}: {'n/a' if t['value'] is None else format(t['value'], 'g')} "
                       f"{t['result']}" for t in doc["targets"][2:])
    fig.suptitle(f"farmem bench soak ({doc['options']['rounds']} interleaved rounds)\n{others}",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main():
    if len(sys.argv) < 2:
        print("usage: plot_soak_bench.py soak.json [out.png]", file=sys.stderr)
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
