#!/usr/bin/env python3
# Plot or tabulate the JSON written by `farmem bench tx`: per backend, KV lookup throughput per
# configuration (server pinned to one core), server CPU per million lookups, TATP tx/s of farmem
# one-two-sided / RPC-only / Redis Lua / Redis WATCH-MULTI-EXEC, and the success rates per type.
# A TATP-only run gets per-round tx/s instead of the KV panels; a --servers run (scripts/bench_tx_netns)
# names its farmemds (one per namespace) instead of "1 core"; the load average is in the title.
# Usage: plot_tx.py tx.json [out.png]   (without out.png or matplotlib: markdown tables)
import json
import statistics
import sys

from bench_plot import print_targets


def med(v):
    v = [x for x in v if x is not None]
    return statistics.median(v) if v else 0.0


KV_ORDER = ["rpc-only", "one-two-sided", "perfect", "rpc-only zipf", "one-two-sided zipf",
            "perfect zipf"]
KV_COLOR = {"rpc-only": "#888", "one-two-sided": "#4a7", "perfect": "#27c"}
TATP_ORDER = ["one-two-sided", "rpc-only", "redis-lua", "redis-watch-multi-exec"]
TATP_COLOR = {"one-two-sided": "#27c", "rpc-only": "#888", "redis-lua": "#c52",
              "redis-watch-multi-exec": "#e95"}


def ordered(names, order):
    # JSON objects come back sorted by key: put the configurations in the benchmark's order.
    return [n for n in order if n in names] + [n for n in names if n not in order]


def table(doc):
    m = doc.get("machine", {})
    o = doc["options"]
    print(f"# farmem bench tx — {m.get('date', '?')}, {m.get('nproc', '?')} CPUs, "
          f"{o['rounds']} rounds of {o['seconds']} s, {o['threads']} threads x {o['inflight']}\n")
    print_targets(doc)
    for spec, r in doc["results"].items():
        kv = r.get("kv", {})
        print(f"\n## {spec}")
        if kv:
            print("\n| KV configuration | lookups/s (median) | server CPU-s per M |\n|---|---|---|")
        for name in ordered(list(kv.get("throughput", {}).keys()), KV_ORDER):
            v = kv["throughput"][name]
            print(f"| {name} | {med(v):.0f} | {med(kv['server_cpu_s_per_m'][name]):.2f} |")
        tp = r.get("tatp", {})
        print("\n| TATP configuration | tx/s (median) | p50 us | p99 us | conflicts retried |")
        print("|---|---|---|---|---|")
        for name in ordered(list(tp.get("configs", {}).keys()), TATP_ORDER):
            c = tp["configs"][name]
            print(f"| {name} | {med(c['round_tx_per_s']):.0f} | {c['p50_us']:.1f} | "
                  f"{c['p99_us']:.1f} | {c['conflicts_retried']} |")


def kv_servers(kv):
    n = len(kv.get("servers", [])) or 1
    return "farmemd on 1 core" if n == 1 else f"{n} farmemds, one per namespace"


def plot_kv(axes, spec, kv):
    names = ordered(list(kv.get("throughput", {}).keys()), KV_ORDER)
    colors = [KV_COLOR.get(n.replace(" zipf", ""), "#aaa") for n in names]
    ax = axes[0]
    ax.bar(range(len(names)), [med(kv["throughput"][n]) / 1e3 for n in names], color=colors)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=20, fontsize=8)
    ax.set_ylabel("k lookups/s (median)")
    ax.set_title(f"{spec}: KV throughput, {kv_servers(kv)}", fontsize=10)
    ax = axes[1]
    ax.bar(range(len(names)), [med(kv["server_cpu_s_per_m"][n]) for n in names], color=colors)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=20, fontsize=8)
    ax.set_ylabel("farmemd CPU-s per M lookups (all servers)")
    ax.set_title(f"{spec}: server CPU per lookup")


def plot(doc, out):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    specs = list(doc["results"].keys())
    with_kv = any("kv" in r for r in doc["results"].values())
    fig, axes = plt.subplots(len(specs), 3 if with_kv else 2,
                             figsize=(16 if with_kv else 11, 4.2 * len(specs)), squeeze=False)
    for row, spec in enumerate(specs):
        r = doc["results"][spec]
        if not with_kv:
            # The interleaved rounds themselves: the ratio is judged per round.
            ax = axes[row][0]
            cfgs = r.get("tatp", {}).get("configs", {})
            for n in ordered(list(cfgs.keys()), TATP_ORDER):
                v = cfgs[n]["round_tx_per_s"]
                ax.plot(range(1, len(v) + 1), [x / 1e3 for x in v], "o-", label=n,
                        color=TATP_COLOR.get(n, "#aaa"))
            ax.set_xlabel("round")
            ax.set_ylabel("k TATP tx/s")
            ax.set_ylim(bottom=0)
            ax.legend(fontsize=8)
            ax.set_title(f"{spec}: TATP per round")
        else:
            plot_kv(axes[row], spec, r.get("kv", {}))
        ax = axes[row][-1]
        cfgs = r.get("tatp", {}).get("configs", {})
        cn = ordered(list(cfgs.keys()), TATP_ORDER)
        ax.bar(range(len(cn)), [med(cfgs[n]["round_tx_per_s"]) / 1e3 for n in cn],
               color=[TATP_COLOR.get(n, "#aaa") for n in cn])
        ax.set_xticks(range(len(cn)))
        ax.set_xticklabels(cn, rotation=15, fontsize=8)
        ax.set_ylabel("k TATP tx/s (median of rounds)")
        ax.set_title(f"{spec}: TATP")
        for i, n in enumerate(cn):
            ax.text(i, med(cfgs[n]["round_tx_per_s"]) / 1e3, f"p99 {cfgs[n]['p99_us']:.0f} us",
                    ha="center", va="bottom", fontsize=7)
    m = doc.get("machine", {})
    load = " → ".join(f"{m[k][0]:.1f}" for k in ("loadavg_at_start", "loadavg_at_end") if k in m)
    fig.suptitle(f"farmem bench tx — {m.get('date', '')}"
                 + (f", load average {load} on {m.get('nproc', '?')} CPUs" if load else ""))
    fig.tight_layout()
    fig.savefig(out, dpi=90)


def main():
    if len(sys.argv) < 2:
        print(__doc__ or "usage: plot_tx.py tx.json [out.png]")
        return 2
    with open(sys.argv[1]) as f:
        doc = json.load(f)
    if len(sys.argv) > 2:
        try:
            plot(doc, sys.argv[2])
            return 0
        except ImportError:
            pass
    table(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
