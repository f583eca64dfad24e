"""compare_lib.py - Python pieces shared by bench/compare.sh and bench/compare-tcp.sh
(and train_rows by bench/grad-wire.sh and bench/train-overlap.sh).

Both compare scripts run each tool BENCH_ROUNDS times, each round writing WORK/NAME-rN.csv
in gw-perf's CSV format; these functions pick, per size, the best round and format the
joined table.  Imported by the scripts' inline Python (PYTHONPATH=bench/), not run.
"""
import csv
import json
import math
import os
import sys

NEEDED = ("size", "oop_time_us", "oop_busbw", "oop_wrong", "ip_wrong")


def num(row, key):
    try:
        v = float(row[key])
    except (KeyError, TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def load_one(work, name, prog):
    path = os.path.join(work, name + ".csv")
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        lacking = [k for k in NEEDED if k not in (reader.fieldnames or [])]
        if lacking:
            sys.exit("%s: %s.csv lacks %s; header is %s" % (
                prog, name, ",".join(lacking), ",".join(reader.fieldnames or [])))
        return {int(row["size"]): row for row in reader}


def load(work, name, rounds, prog):
    """Per size, the round with the lowest out-of-place time; wrong counts from
    every round are kept (in "all_rounds") so that no wrong result hides behind a
    fast round.  Rounds without WORK/NAME-rN.csv (a tool that failed) are left out."""
    best = {}
    for r in range(1, rounds + 1):
        if not os.path.exists(os.path.join(work, "%s-r%d.csv" % (name, r))):
            continue
        for size, row in load_one(work, "%s-r%d" % (name, r), prog).items():
            row["round"] = r
            best.setdefault(size, []).append(row)
    out = {}
    for size, rows in best.items():
        timed = [row for row in rows if num(row, "oop_time_us") is not None]
        out[size] = dict(min(timed, key=lambda row: num(row, "oop_time_us")) if timed else rows[0])
        out[size]["all_rounds"] = rows
    return out


def wrong_results(tables):
    """tables: (label, table from load) pairs; one line per nonzero wrong count."""
    wrong = []
    for name, table in tables:
        for size, best in table.items():
            for row in best["all_rounds"]:
                for key in ("oop_wrong", "ip_wrong"):
                    if row.get(key) not in (None, "", "0", "-1", "N/A"):
                        wrong.append("%s %s B round %d %s=%s" % (name, size, row["round"], key, row[key]))
    return wrong


def human(n):
    for unit, div in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= div and n % div == 0:
            return "%d%s" % (n // div, unit)
    return str(n)


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def latency_report(work, rounds, nranks_list, ncores, prog):
    """compare.sh --latency: per world size, the best round's out-of-place time of
    gradwire auto / ring / tree / exchange and Open MPI at every size, the issue's
    goals (auto <= Open MPI; auto within 10% of the best fixed algorithm), and the
    crossover (the smallest size from which the ring stays faster than the tree).
    Returns the rows for the CSV and a list of failed goals (informational)."""
    shown = (8, 64, 1024, 4096, 65536)
    rows, misses = [], []
    for n in nranks_list:
        t = {k: load(work, "%s-n%d" % (k, n), rounds, prog) for k in ("auto", "ring", "tree", "exchange", "mpi")}
        print()
        over = " (oversubscribed: %d ranks on %d cores, times are scheduler-bound)" % (n, ncores) if n > ncores else ""
        print("### %d ranks%s; us per allreduce, float32 sum, out of place, best of %d rounds" % (n, over, rounds))
        print("%8s %9s %9s %9s %9s %9s | %9s %9s" % ("size", "auto", "ring", "tree", "exchange", "mpi", "auto/best",
                                                     "auto/mpi"))
        sizes = sorted(set().union(*[set(v) for v in t.values()]))
        for size in sizes:
            v = {k: num(t[k].get(size, {}), "oop_time_us") for k in t}
            best = min([x for x in (v["ring"], v["tree"], v["exchange"]) if x is not None], default=None)
            r_best = v["auto"] / best if v["auto"] is not None and best else None
            r_mpi = v["auto"] / v["mpi"] if v["auto"] is not None and v["mpi"] else None
            rows.append([n, size, v["auto"], v["ring"], v["tree"], v["exchange"], v["mpi"], r_best, r_mpi])
            if size not in shown:
                continue
            print("%8s %9s %9s %9s %9s %9s | %9s %9s" % (human(size), fmt(v["auto"], ".2f"), fmt(v["ring"], ".2f"),
                  fmt(v["tree"], ".2f"), fmt(v["exchange"], ".2f"), fmt(v["mpi"], ".2f"), fmt(r_best, ".2f"),
                  fmt(r_mpi, ".2f")))
            if r_best is not None and r_best > 1.10:
                misses.append("%d ranks %s: auto %.0f%% slower than the best fixed algorithm" % (
                    n, human(size), 100 * (r_best - 1)))
            if r_mpi is not None and r_mpi > 1.0:
                misses.append("%d ranks %s: auto slower than Open MPI (x%.2f)" % (n, human(size), r_mpi))
        ring_wins = [s for s in sizes if num(t["ring"].get(s, {}), "oop_time_us") is not None and
                     num(t["tree"].get(s, {}), "oop_time_us") is not None and
                     num(t["ring"][s], "oop_time_us") < num(t["tree"][s], "oop_time_us")]
        cross = next((s for s in sizes if all(x in ring_wins for x in sizes if x >= s)), None)
        print("crossover (ring faster than tree from here up, of the sizes measured): %s" % (
            human(cross) + " B" if cross is not None else "none (tree at least as fast everywhere)"))
    return rows, misses


def train_rows(path, steps, skip, keys, fail):
    """The training rows of gw-train's metrics file `path` after the first `skip`
    (warm-up), once the file has exactly `steps` of them and each kept row has a
    finite number under every name in `keys` (the trainer writes NaN and inf as
    null).  Anything else calls fail(message), which is to exit."""
    try:
        with open(path) as f:
            lines = f.readlines()
    except OSError as e:
        fail("no metrics file (%s)" % e)
    rows = []
    for n, line in enumerate(lines, 1):
        try:
            r = json.loads(line)
        except ValueError:
            fail("%s line %d is not JSON: %.80s" % (path, n, line.strip()))
        if isinstance(r, dict) and r.get("type") == "train":
            rows.append(r)
    if len(rows) != steps:
        fail("%s has %d training rows, expected %d (--steps)" % (path, len(rows), steps))
    for r in rows[skip:]:
        for key in keys:
            v = r.get(key)
            if not isinstance(v, (int, float)) or not math.isfinite(v):
                fail("step %s: %s is %s, not a valid measurement%s" % (
                    r.get("step"), key, json.dumps(v), " (the trainer writes NaN and inf as null)" if v is None else ""))
    return rows[skip:]
