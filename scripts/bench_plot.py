# Helpers shared by the scripts/plot_*.py scripts that read `farmem bench ... --json` output
# (imported from the script's own directory: python puts it first on sys.path).


def fmt_ratio(t, spec=".2f", unit="x"):
    """A target's judged ratio with its rounds' min-max: "0.94x (0.88-1.00)"; "n/a" if none."""
    r = t.get("ratio")
    if r is None:
        return "n/a"
    if t.get("ratio_min") is not None:
        return f"{r:{spec}}{unit} ({t['ratio_min']:.2f}-{t['ratio_max']:.2f})"
    return f"{r:{spec}}{unit}"


def print_targets(doc, ratio=fmt_ratio):
    """The markdown table of a benchmark JSON's `targets` (value, baseline, ratio, limit, result)."""
    print("| target | value | baseline | ratio (min-max) | limit | result |")
    print("|---|---|---|---|---|---|")
    for t in doc["targets"]:
        v = "n/a" if t["value"] is None else f"{t['value']:.4g}"
        b = "n/a" if t["baseline"] is None else f"{t['baseline']:.4g}"
        print(f"| {t['name']} | {v} | {b} | {ratio(t)} | {t['limit']} | {t['result']} |")


def run_main(doc_string, name, table, plot):
    """A plot script's command line: `NAME.py bench.json [out.png]` prints the tables (`table(doc)`)
    and, given out.png, draws it (`plot(doc, path)`)."""
    import json
    import sys

    if len(sys.argv) < 2:
        print(doc_string or f"usage: {name} bench.json [out.png]", file=sys.stderr)
        sys.exit(2)
    with open(sys.argv[1]) as f:
        doc = json.load(f)
    table(doc)
    if len(sys.argv) > 2:
        plot(doc, sys.argv[2])
        print(f"\nwrote {sys.argv[2]}")
