#!/usr/bin/env python3
# Plot or tabulate the JSON written by `farmem bench raw`: p50 latency and throughput per case.
# Usage: plot_raw_bench.py raw_bench.json [out.png]   (without out.png or matplotlib: a markdown table)
import json
import sys


def label(c):
    return f"{c['backend']} {c['op']} {c['size']}B x{c['inflight']}"


def fmt(v, spec):
    return "n/a" if v is None else format(v, spec)


def table(doc):
    m = doc.get("machine", {})
    print(f"# farmem bench raw — {m.get('date', '?')}, {m.get('nproc', '?')} CPUs, {m.get('kernel', '?')}\n")
    print("| backend | op | size | inflight | p50 µs | p99 µs | ops/s | ratios |")
    print("|---|---|---|---|---|---|---|---|")
    for c in doc["cases"]:
        if "error" in c:
            print(f"| {c['backend']} | {c['op']} | {c['size']} | {c['inflight']} | | | | {c['error']} |")
            continue
        ratios = ", ".join(f"{k} {fmt(v, '.2f')}" for k, v in c.get("ratios", {}).items())
        print(f"| {c['backend']} | {c['op']} | {c['size']} | {c['inflight']} | {fmt(c.get('p50_us'), '.2f')} "
              f"| {fmt(c.get('p99_us'), '.2f')} | {fmt(c.get('ops_per_sec'), ',.0f')} | {ratios} |")
    for u in doc.get("unavailable", []):
        print(f"| {u['backend']} | unavailable | | | | | | {u['reason']} |")
    print("\n| target | result | value | baseline | ratio |")
    print("|---|---|---|---|---|")
    for t in doc.get("targets", []):
        print(f"| {t['name']} | {t['result']} | {fmt(t.get('value'), '.4g')} | {fmt(t.get('baseline'), '.4g')} "
              f"| {fmt(t.get('ratio'), '.2f')} |")


def plot(doc, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = [c for c in doc["cases"] if "error" not in c and c.get("p50_us") is not None]
    names = [label(c) for c in cases]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(16, max(4, 0.28 * len(cases))), sharey=True)
    ax1.barh(names, [c["p50_us"] for c in cases], color="tab:blue", label="p50")
    ax1.barh(names, [c["p99_us"] - c["p50_us"] for c in cases], left=[c["p50_us"] for c in cases],
             color="tab:orange", alpha=0.5, label="p99")
    ax1.set_xscale("log")
    ax1.set_xlabel("latency (µs, log)")
    ax1.legend()
    ax2.barh(names, [c["ops_per_sec"] for c in cases], color="tab:green")
    ax2.set_xscale("log")
    ax2.set_xlabel("throughput (ops/s, log)")
    ax1.invert_yaxis()
    m = doc.get("machine", {})
    fig.suptitle(f"farmem bench raw — {m.get('date', '?')}, {m.get('nproc', '?')} CPUs")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")


def main():
    if len(sys.argv) not in (2, 3):
        print("usage: plot_raw_bench.py raw_bench.json [out.png]", file=sys.stderr)
        return 2
    with open(sys.argv[1]) as f:
        doc = json.load(f)
    if len(sys.argv) == 3:
        try:
            plot(doc, sys.argv[2])
            return 0
        except ImportError:
            print("matplotlib is not installed; printing a table instead", file=sys.stderr)
    table(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
