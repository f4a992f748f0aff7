#!/usr/bin/env python3
# Plot or tabulate the JSON written by `farmem bench regions`: every round's farmem-mount and tmpfs
# figure per workload (sysbench reads, fio writes, cp -a), and the targets.
# Usage: plot_regions.py regions.json [out.png]   (without out.png or matplotlib: a markdown table)
from bench_plot import print_targets, run_main


def table(doc):
    m = doc.get("machine", {})
    c = doc["config"]
    print(f"# farmem bench regions — {m.get('date', '?')}, {m.get('nproc', '?')} CPUs, "
          f"load {m.get('loadavg_at_start', '?')}, {c['rounds']} rounds, sysbench file "
          f"{c['read_file_mib']} MiB, fio {c['write_file_mib']} MiB, {c['small_files']} files\n")
    print_targets(doc)
    print(f"\nnot measured: {', '.join(doc.get('not_measured', []))}")


def plot(doc, out):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rounds = doc["rounds"]
    fig, axes = plt.subplots(1, len(rounds), figsize=(4.4 * len(rounds), 4.2))
    for ax, (name, r) in zip(axes, rounds.items()):
        xs = range(1, len(r["farmem"]) + 1)
        ax.plot(xs, r["farmem"], "o-", label="farmem mount")
        ax.plot(xs, r["tmpfs"], "s--", label="tmpfs")
        t = next((t for t in doc["targets"] if t["name"] == name), None)
        title = name
        if t and t.get("ratio") is not None:
            title += f"\n{t['ratio']:.2f}x ({t['ratio_min']:.2f}-{t['ratio_max']:.2f}), "
            title += f"{t['limit']}: {t['result']}"
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("round")
        ax.set_ylabel(r["unit"])
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    c = doc["config"]
    fig.suptitle(f"farmem bench regions{' --quick' if c.get('quick') else ''}: remote regions "
                 f"(FUSE, embedded farmemd) vs tmpfs, {doc.get('machine', {}).get('nproc', '?')} "
                 f"CPUs, load {doc.get('machine', {}).get('loadavg_at_start', '?')}", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main():
    run_main(__doc__, "plot_regions.py", table, plot)


if __name__ == "__main__":
    main()
