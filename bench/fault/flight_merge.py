#!/usr/bin/python3
"""Merges the flight recorders' dumps of a job and names the rank it waits for.

Each rank of a communicator that failed (or was aborted while it waited)
appends one JSON line to TUTTI_DEBUG_DUMP (docs/api.md, "Flight recorder").
Give this script those files (one shared file, or one per host or rank):

    bench/fault/flight_merge.py /tmp/tutti-dump.jsonl [more files...]

Per communicator it prints a table (rank | ops done | pending operation |
pending for | waits on) and a verdict: the rank the others wait for (named
by most of the ranks that wait), or the ranks that left no dump (dead, or
never failed: often the one that hangs), or the rank behind the others (the
fewest operations done). Exit status 0 when it named a rank, 1 when the
dumps name none, 2 on unreadable input. Standard library only.
"""
import collections
import json
import sys


def load(paths):
    dumps = []
    for path in paths:
        try:
            with open(path, encoding="utf-8") as f:
                for n, line in enumerate(f, 1):
                    line = line.strip()
                    if not line:
                        continue
                    try:
                        d = json.loads(line)
                    except json.JSONDecodeError as e:
                        print(f"{path}:{n}: not JSON ({e}); skipped", file=sys.stderr)
                        continue
                    if d.get("tutti_flight_recorder") == 1:
                        dumps.append(d)
        except OSError as e:
            print(f"flight_merge: {e}", file=sys.stderr)
            sys.exit(2)
    return dumps


def pending_of(d):
    for op in d.get("ops", []):
        if op.get("state") == "pending":
            return op
    return None


def describe(op):
    if op is None:
        return "-"
    s = f"{op['coll']} of {op['count']} x {op['datatype']}"
    if "peer" in op:
        s += f" peer {op['peer']}"
    if "root" in op:
        s += f" root {op['root']}"
    if "call" in op:
        s += f" (call {op['call']})"
    return s


def verdict(dumps, nranks):
    """The rank the others wait for, and why; (None, reason) when none."""
    waited = collections.Counter()
    for d in dumps:
        for r in d.get("waiting_on", []):
            waited[r] += 1
    # Follow the waits: a rank waited on that waits on no one itself (no
    # dump: it did not fail; or a dump without waits) is where they end.
    by_rank = {d["rank"]: d for d in dumps}
    ends = sorted(r for r in waited if not by_rank.get(r, {}).get("waiting_on"))
    if len(ends) == 1:
        rank = ends[0]
        state = "left no dump" if rank not in by_rank else "waits on no one"
        return rank, f"{waited[rank]} rank(s) wait on it directly, and it {state}"
    if waited:
        rank, votes = waited.most_common(1)[0]
        waiting = sum(1 for d in dumps if d.get("waiting_on"))
        return rank, f"{votes} of the {waiting} waiting ranks wait on it"
    missing = sorted(set(range(nranks)) - {d["rank"] for d in dumps})
    if len(missing) == 1:
        return missing[0], "it is the one rank that left no dump (dead, or still running)"
    done = {d["rank"]: sum(1 for op in d.get("ops", []) if op.get("state") == "done") + max(
        0, d.get("recorded", 0) - len(d.get("ops", []))) for d in dumps}
    if done and len(set(done.values())) > 1:
        rank = min(done, key=lambda r: (done[r], r))
        return rank, f"it completed the fewest operations ({done[rank]})"
    if missing:
        return None, f"ranks {missing} left no dump; no rank is waited on"
    return None, "no rank waits on another"


def main(argv):
    if len(argv) < 2 or argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if len(argv) >= 2 else 2
    dumps = load(argv[1:])
    if not dumps:
        print("flight_merge: no flight recorder dumps in the files given", file=sys.stderr)
        return 2
    by_comm = collections.defaultdict(dict)
    for d in dumps:
        by_comm[d["comm"]][d["rank"]] = d  # a rank's latest dump of a communicator
    named = False
    for comm, ranks in by_comm.items():
        nranks = max(d["nranks"] for d in ranks.values())
        print(f"communicator {comm}: {len(ranks)} of {nranks} ranks dumped")
        print("rank | host:pid | ops done | pending operation | pending for | waits on | reason")
        for r in range(nranks):
            d = ranks.get(r)
            if d is None:
                print(f"{r} | - | - | (no dump) | - | - | -")
                continue
            op = pending_of(d)
            done = sum(1 for o in d.get("ops", []) if o.get("state") == "done")
            since = f"{d['at_s'] - op['called_s']:.1f} s" if op else "-"
            waits = ",".join(str(x) for x in d.get("waiting_on", [])) or "-"
            reason = d.get("reason", "")
            if len(reason) > 100:
                reason = reason[:97] + "..."
            print(f"{r} | {d['host']}:{d['pid']} | {done} | {describe(op)} | {since} | {waits} "
                  f"| {reason}")
        rank, why = verdict(list(ranks.values()), nranks)
        if rank is None:
            print(f"verdict: no rank named ({why})")
        else:
            named = True
            print(f"verdict: everyone waits for rank {rank}: {why}")
        print()
    return 0 if named else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
