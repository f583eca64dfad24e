"""compare_lib.py - Python pieces shared by bench/compare.sh and bench/compare-tcp.sh.

Both scripts run each tool BENCH_ROUNDS times, each round writing WORK/NAME-rN.csv in
gw-perf's CSV format; these functions pick, per size, the best round and format the
joined table.  Imported by the scripts' inline Python (PYTHONPATH=bench/), not run.
"""
import csv
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
