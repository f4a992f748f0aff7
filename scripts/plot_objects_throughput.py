#!/usr/bin/env python3
# Plot or tabulate the JSON of `farmem bench objects-throughput` (bars per client count) or of
# `farmem bench objects-compaction` (reads/s per bucket over time, compaction shaded).
# Usage: plot_objects_throughput.py RESULT.json [OUT.png]   (no OUT.png or no matplotlib: a table)
import json
import math
import sys

OPS = [("raw_read", "farmem", "raw transport read"), ("direct_read", "farmem", "direct_read (one-sided)"),
       ("read", "farmem", "read (RPC)"), ("get", "redis", "Redis GET")]


def fmt(v, spec):
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def title(doc):
    m, o = doc.get("machine", {}), doc.get("options", {})
    return (f"{doc.get('benchmark', '?')} — {o.get('backend', '?')}, {o.get('objects', '?')} x "
            f"{o.get('size', '?')} B, {m.get('nproc', '?')} CPUs, {m.get('date', '?')}")


def throughput_table(doc):
    print(f"# {title(doc)}\n")
    print("| dist | clients | op | ops/s |")
    print("|---|---|---|---|")
    for c in doc["cases"]:
        v = c.get("ops_per_sec")
        print(f"| {c['dist']} | {c['clients']} | {c['system']} {c['op']} | "
              f"{fmt(v, ',.0f') if v is not None else c.get('error', '')} |")
    print(f"\nRedis: {doc.get('redis', '?')}")


def compaction_table(doc):
    print(f"# {title(doc)}\n")
    print("| correction | compaction ms | merges | before reads/bucket | min during | after | dip | recovery |")
    print("|---|---|---|---|---|---|---|---|")
    for r in doc["runs"]:
        s = r.get("summary", {})
        print(f"| {r['correction']} | {r['compact_start_ms']}..{r['compact_end_ms']} | {r['merges']} | "
              f"{fmt(s.get('before_mean'), '.0f')} | {fmt(s.get('during_min'), '.0f')} | "
              f"{fmt(s.get('after_mean'), '.0f')} | {fmt(s.get('dip'), '.1%')} | {fmt(s.get('recovery'), '.1%')} |")


def targets_table(doc):
    print("\n| target | result | ratio |")
    print("|---|---|---|")
    for t in doc.get("targets", []):
        print(f"| {t['name']} | {t['result']} | {fmt(t.get('ratio'), '.2f')} |")


def plot_throughput(doc, out, plt):
    clients = doc["options"]["clients"]
    dists = ["uniform", "zipf"]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8), sharey=True)
    width = 0.8 / len(OPS)
    for ax, dist in zip(axes, dists):
        for k, (op, system, label) in enumerate(OPS):
            ys = []
            for n in clients:
                v = next((c.get("ops_per_sec") for c in doc["cases"]
                          if c["op"] == op and c["system"] == system and c["dist"] == dist
                          and c["clients"] == n and "error" not in c), None)
                ys.append(0 if v is None else v / 1e3)
            xs = [i + (k - (len(OPS) - 1) / 2) * width for i in range(len(clients))]
            ax.bar(xs, ys, width, label=label)
        ax.set_xticks(range(len(clients)))
        ax.set_xticklabels([str(n) for n in clients])
        ax.set_xlabel(f"client threads ({doc['options'].get('inflight', '?')} in flight each)")
        ax.set_title(f"{dist} keys" + (" (Zipf %.2f)" % doc["options"].get("zipf_theta", 0.99)
                                       if dist == "zipf" else ""))
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("reads / s (thousands)")
    axes[0].legend(fontsize=8)
    fig.suptitle(title(doc), fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def plot_compaction(doc, out, plt):
    runs = doc["runs"]
    bucket = doc["options"].get("bucket_ms", 100)
    fig, axes = plt.subplots(len(runs), 1, figsize=(11, 3.2 * len(runs)), sharex=True, squeeze=False)
    for ax, r in zip(axes[:, 0], runs):
        counts = r.get("counts", [])
        xs = [(i + 0.5) * bucket / 1000 for i in range(len(counts))]
        ys = [c * 1000 / bucket / 1e3 for c in counts]
        ax.plot(xs, ys, drawstyle="steps-mid", color="tab:blue", label="reads/s")
        ax.axvspan(r["compact_start_ms"] / 1000, max(r["compact_end_ms"], r["compact_start_ms"] + 1) / 1000,
                   color="tab:red", alpha=0.2, label=f"compaction ({r['merges']} merges, {r['rounds']} rounds)")
        s = r.get("summary", {})
        if s.get("before_mean") is not None:
            ax.axhline(s["before_mean"] * 1000 / bucket / 1e3, color="gray", ls="--", lw=1,
                       label="mean before")
        ax.set_ylabel("reads / s (thousands)")
        ax.set_ylim(bottom=0)
        ax.set_title(f"correction: {r['correction']} — dip {fmt(s.get('dip'), '.1%')}, "
                     f"recovery {fmt(s.get('recovery'), '.1%')} (last quarter {fmt(s.get('recovery_tail'), '.1%')})" + (f" — ERROR {r['error']}" if "error" in r else ""),
                     fontsize=9)
        ax.legend(fontsize=8, loc="lower right")
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel(f"time since the reader started (s), {bucket} ms buckets")
    fig.suptitle(title(doc), fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def main():
    if len(sys.argv) not in (2, 3):
        print("usage: plot_objects_throughput.py RESULT.json [OUT.png]", file=sys.stderr)
        return 2
    with open(sys.argv[1]) as f:
        doc = json.load(f)
    kind = doc.get("benchmark", "")
    if kind.endswith("objects-throughput"):
        table, plot = throughput_table, plot_throughput
    elif kind.endswith("objects-compaction"):
        table, plot = compaction_table, plot_compaction
    else:
        print(f"{sys.argv[1]}: not an objects-throughput/objects-compaction result ({kind!r})", file=sys.stderr)
        return 2
    if len(sys.argv) == 2:
        table(doc)
        targets_table(doc)
        return 0
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (Debian: python3-matplotlib); printing a table instead", file=sys.stderr)
        table(doc)
        targets_table(doc)
        return 0
    plot(doc, sys.argv[2], plt)
    print(f"wrote {sys.argv[2]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
