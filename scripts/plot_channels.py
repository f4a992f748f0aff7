#!/usr/bin/env python3
# Plot or tabulate the JSON written by `farmem bench channels`: per-round farmem vs Open MPI for
# the transfer transactions, the contended lock and barrier p50, fenced vs unfenced updates, the
# kvstore's gets (vs raw one-sided reads and Redis) and Zipf writes (ticket vs test-and-set lock)
# when the JSON has them, and the targets; a run across network namespaces (scripts/
# bench_channels_netns) is named as such, with its load average.
# Usage: plot_channels.py channels.json [out.png]   (without out.png: a markdown table)
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_plot import run_main  # noqa: E402
from plot_soak_bench import fmt_ratio  # noqa: E402  (one "1.23x (min-max)" format for all plots)


def num(v):
    return "n/a" if v is None else f"{v:.4g}"


def where(doc):
    """'' on one machine; across namespaces: their names and the load average before/after."""
    ns = doc["config"].get("netns")
    if not ns:
        return ""
    names = ", ".join(p["name"] for p in ns["participants"])
    load = doc.get("netns", {})
    before, after = load.get("loadavg_before"), load.get("loadavg_after")
    text = f"one per namespace ({names}), Redis/memcached in {ns['baseline_servers']}"
    if before and after:
        text += f"; load avg {before[0]:.1f} before, {after[0]:.1f} after"
    return text


def table(doc):
    m, c = doc.get("machine", {}), doc["config"]
    ns = where(doc)
    print(f"# farmem bench channels — {m.get('date', '?')}, {m.get('nproc', '?')} CPUs, "
          f"{c['processes']} processes{' ' + ns if ns else ''}, backend {c['backend']}, "
          f"{c['rounds']} rounds of {c['seconds']} s, MPI wire {' '.join(c['mpi_wire'])}\n")
    print("| target | farmem | baseline | ratio (min-max) | limit | result |")
    print("|---|---|---|---|---|---|")
    for t in doc["targets"]:
        print(f"| {t['name']} | {num(t['value'])} | {num(t['baseline'])} | {fmt_ratio(t)} | "
              f"{t['limit']} | {t['result']} |")


def plot(doc, out):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = doc["runs"]
    panels = [("transfer", "transfers/s", "transfer transactions", doc["targets"][0]),
              ("lock", "acquisitions/s", "contended lock RMW", doc["targets"][1]),
              ("barrier", "p50 (us)", "barrier p50", doc["targets"][3])]
    kv = runs.get("kvstore")
    fig, grid = plt.subplots(2 if kv else 1, 4, figsize=(17, 8.6 if kv else 4.3), squeeze=False)
    axes = grid[0]
    w = 0.38
    for ax, (key, unit, title, t) in zip(axes, panels):
        f = [v if v is not None else 0 for v in runs[key]["farmem_values"]]
        b = [v if v is not None else 0 for v in runs[key]["mpi_values"]]
        xs = list(range(1, len(f) + 1))
        ax.bar([x - w / 2 for x in xs], f, w, label="farmem channels")
        ax.bar([x + w / 2 for x in xs], b, w, label="Open MPI")
        ax.set_xticks(xs)
        ax.set_xlabel("round")
        ax.set_ylabel(unit)
        ax.set_title(f"{title}: {fmt_ratio(t)} {t['result']}\n({t['limit']})", fontsize=9)
        ax.legend(fontsize=8)
    fence = runs["fence"]
    t = doc["targets"][4]
    xs = list(range(1, len(fence["fenced_rates"]) + 1))
    ax = axes[3]
    ax.bar([x - w / 2 for x in xs], [v or 0 for v in fence["unfenced_rates"]], w, label="no fence")
    ax.bar([x + w / 2 for x in xs], [v or 0 for v in fence["fenced_rates"]], w, label="fenced")
    ax.set_xticks(xs)
    ax.set_xlabel("round")
    ax.set_ylabel("updates/s (3 nodes)")
    ax.set_title(f"update fence: time {fmt_ratio(t)} {t['result']}\n({t['limit']})", fontsize=9)
    ax.legend(fontsize=8)
    if kv:
        plot_kvstore(doc, kv, grid[1], w)
    c = doc["config"]
    safety = doc["targets"][5]
    wire = c["mpi_wire"]
    btl = wire[wire.index("btl") + 1] if "btl" in wire else "?"
    ns = where(doc)
    fig.suptitle(f"farmem bench channels: 3 processes{' ' + ns if ns else ''}, "
                 f"{c['backend']} vs Open MPI "
                 f"(btl {btl}, osc {c.get('mpi_osc', '?')}); mutual-exclusion violations "
                 f"{num(safety['value'])} in {num(safety['baseline'])} acquisitions "
                 f"{safety['result']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def plot_kvstore(doc, kv, axes, w):
    by_name = {t["name"]: t for t in doc["targets"]}
    t_redis = next(t for n, t in by_name.items() if n.startswith("kvstore gets") and "Redis" in n)
    t_raw = next(t for n, t in by_name.items() if n.startswith("kvstore gets vs a raw"))
    t_zipf = next(t for n, t in by_name.items() if n.startswith("kvstore Zipf"))
    ax = axes[0]
    series = [("kvstore get", kv["kv_get_rates"]), ("raw one-sided read", kv["raw_get_rates"]),
              ("Redis GET", kv["redis_get_rates"])]
    t_mc = next((t for n, t in by_name.items() if "memcached" in n), None)
    if kv.get("memcached_get_rates"):
        series.append(("memcached mg", kv["memcached_get_rates"]))
    xs = list(range(1, len(kv["kv_get_rates"]) + 1))
    bw = 0.8 / len(series)
    for i, (label, vals) in enumerate(series):
        ax.bar([x + (i - (len(series) - 1) / 2) * bw for x in xs], [v or 0 for v in vals], bw,
               label=label)
    ax.set_xticks(xs)
    ax.set_xlabel("round")
    ax.set_ylabel(f"gets/s (3 nodes x {kv.get('gets_in_flight_per_process', 1)} in flight)")
    ax.set_title(f"kvstore gets ({kv['value_bytes']} B, {kv['keys']} keys): vs Redis "
                 f"{fmt_ratio(t_redis)} {t_redis['result']}\nvs raw read {fmt_ratio(t_raw)} "
                 f"{t_raw['result']}"
                 + (f", vs memcached {fmt_ratio(t_mc)} {t_mc['result']}" if t_mc else ""),
                 fontsize=9)
    ax.legend(fontsize=8)
    ax = axes[1]
    xs = list(range(1, len(kv["ticket_write_rates"]) + 1))
    ax.bar([x - w / 2 for x in xs], [v or 0 for v in kv["ticket_write_rates"]], w,
           label="kvstore update (ticket lock)")
    ax.bar([x + w / 2 for x in xs], [v or 0 for v in kv["tas_write_rates"]], w,
           label="test-and-set lock + write")
    ax.set_xticks(xs)
    ax.set_xlabel("round")
    ax.set_ylabel("updates/s (3 nodes)")
    ax.set_title(f"kvstore Zipf 0.99 writes: {fmt_ratio(t_zipf)} {t_zipf['result']}\n"
                 f"({t_zipf['limit']})", fontsize=9)
    ax.legend(fontsize=8)
    for ax in axes[2:]:
        ax.axis("off")


def main():
    run_main(__doc__, "plot_channels.py", table, plot)


if __name__ == "__main__":
    main()
