#!/usr/bin/env python3
# Plot or tabulate the JSON written by `farmem bench regions`: every round's subject (A) and baseline
# (B) figure per target (mount vs tmpfs workloads, rmmap faults, rmalloc), and the targets.
# Usage: plot_regions.py regions.json [out.png]   (without out.png or matplotlib: a markdown table)
from bench_plot import print_targets, run_main


def table(doc):
    m = doc.get("machine", {})
    c = doc["config"]
    print(f"# farmem bench regions — {m.get('date', '?')}, {m.get('nproc', '?')} CPUs, "
          f"load {m.get('loadavg_at_start', '?')}, {c['rounds']} rounds, sysbench file "
          f"{c['read_file_mib']} MiB, fio {c['write_file_mib']} MiB, {c['small_files']} files, "
          f"{c.get('fault_pages', '?')} fault pages, {c.get('rmalloc_calls', '?')} rmalloc calls, "
          f"{c.get('creates', '?')} creates\n")
    print_targets(doc)
    if doc.get("store_read_us"):
        sr = ", ".join(f"{v:.1f}" for v in doc["store_read_us"])
        print(f"\nRegionStore::read 4 KiB (a fault's fetch), us per round: {sr}")
    if doc.get("write_fault_us"):
        wf = ", ".join(f"{v:.1f}" for v in doc["write_fault_us"])
        print(f"plain cold write fault (no rmarkdirty), us per round: {wf}")
    print(f"\nnot measured: {', '.join(doc.get('not_measured', []))}")


def plot(doc, out):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rounds = doc["rounds"]
    cols = min(4, len(rounds))
    rows = (len(rounds) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.4 * cols, 4.2 * rows), squeeze=False)
    axes = axes.flatten()
    for ax in axes[len(rounds):]:
        ax.axis("off")
    # In the targets' order (the JSON object's keys come sorted).
    order = [t["name"] for t in doc["targets"] if t["name"] in rounds]
    for ax, (name, r) in zip(axes, ((n, rounds[n]) for n in order)):
        # Older files (before the rmmap/rmalloc targets) hold "farmem" and "tmpfs" series.
        la, lb = r.get("labels", ["farmem mount", "tmpfs"])
        a, b = r.get("a", r.get("farmem")), r.get("b", r.get("tmpfs"))
        xs = range(1, len(a) + 1)
        ax.plot(xs, a, "o-", label=f"A: {la}")
        ax.plot(xs, b, "s--", label=f"B: {lb}")
        t = next((t for t in doc["targets"] if t["name"] == name), None)
        title = name
        if t and t.get("ratio") is not None:
            title += f"\n{t['ratio']:.2f}x ({t['ratio_min']:.2f}-{t['ratio_max']:.2f}), "
            title += f"{t['limit']}: {t['result']}"
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("round")
        ax.set_ylabel(r["unit"])
        vals = [v for v in a + b if v and v > 0]
        if vals and max(vals) > 20 * min(vals):  # e.g. rmalloc vs creates: ~300x apart
            ax.set_yscale("log")
        else:
            ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    c = doc["config"]
    fig.suptitle(f"farmem bench regions{' --quick' if c.get('quick') else ''}: remote regions "
                 f"(FUSE mount and rmmap/rmalloc, embedded farmemd), ratio A/B per target, "
                 f"{doc.get('machine', {}).get('nproc', '?')} CPUs, load "
                 f"{doc.get('machine', {}).get('loadavg_at_start', '?')}", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main():
    run_main(__doc__, "plot_regions.py", table, plot)


if __name__ == "__main__":
    main()
