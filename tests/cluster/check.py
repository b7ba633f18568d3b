#!/usr/bin/env python3
"""Verdict of a cluster run (tests/cluster/cluster.sh): the acknowledged
jobs as the API returns them, the marker file (the steps' side effects),
the recorded dispatches and completions (from SQL), and the long-poll and
SSE answers collected on other nodes. Prints TAP lines numbered from
--first; exits 1 if any failed. --count prints how many lines it prints.

  acked:   "<job id> <node it was submitted to>" per line
  jobs:    <id>.json, GET /v1/jobs/<id>?wait=... on the undisturbed node
  markers: "<job id>:<step>:<n>:<wall ms>:<pid of the node>" per run of a step
  stopped: pids of the nodes SIGSTOPped, one per stop
  events:  job_id, kind (1 dispatch, 2 complete), tag, time_ms, data (TSV)
  polls:   <id>.<node>: a ?wait= answer from that node
  sse:     <id>.<node>: an SSE stream of the job's events from that node
"""
import argparse
import json
import os
import re
import sys

CHECKS = 9
RACE_PER_STOP = 2  # a stopped node's handler threads between a lease check and a call
STEPS = ("a", "b", "c")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", action="store_true")
    for a in ("acked", "jobs", "markers", "events", "polls", "sse", "steady", "stopped"):
        ap.add_argument("--" + a)
    ap.add_argument("--first", type=int, default=1)
    o = ap.parse_args()
    if o.count:
        print(CHECKS)
        return 0

    n = o.first - 1
    failed = 0
    notes = []

    def note(s):
        if len(notes) < 10:
            notes.append(s)

    def tap(good, name):
        nonlocal n, failed
        n += 1
        if not good:
            failed += 1
        print(f"{'ok' if good else 'not ok'} {n} - {name}")

    acked = {}
    with open(o.acked) as f:
        for line in f:
            p = line.split()
            if p:
                acked[p[0]] = p[1] if len(p) > 1 else "?"

    found = terminal = succeeded = 0
    states = {}
    for jid in acked:
        try:
            with open(os.path.join(o.jobs, jid + ".json")) as f:
                job = json.load(f)
        except (OSError, ValueError):
            note(f"job {jid}: no answer from the undisturbed node")
            continue
        if str(job.get("id")) != jid:
            note(f"job {jid} not found: {json.dumps(job)[:200]}")
            continue
        found += 1
        st = job.get("state")
        states[jid] = st
        if st in ("succeeded", "failed", "cancelled"):
            terminal += 1
        else:
            note(f"job {jid} is {st}")
        if st == "succeeded":
            succeeded += 1
        elif st in ("failed", "cancelled"):
            note(f"job {jid} {st}: {json.dumps(job.get('error'))[:200]}")

    # Side effects: step -> list of (n, ms)
    effects = {}
    with open(o.markers) as f:
        for line in f:
            p = line.strip().split(":")
            if len(p) == 5:
                effects.setdefault((p[0], p[1]), []).append((int(p[2]), int(p[3]), p[4]))
    stops = []
    if o.stopped and os.path.exists(o.stopped):
        with open(o.stopped) as f:
            stops = [line.strip() for line in f if line.strip()]

    # Recorded history: which tag is which step (from the dispatch's argv),
    # and when each tag's completion was recorded.
    step_of = {}
    done_ms = {}
    with open(o.events) as f:
        for line in f:
            p = line.rstrip("\n").split("\t", 4)
            if len(p) < 5:
                continue
            jid, kind, tag, ms, data = p
            if kind == "1":
                try:
                    argv = json.loads(data).get("args", {}).get("argv", [])
                except ValueError:
                    argv = []
                if len(argv) >= 4 and argv[3] in STEPS:
                    step_of[(jid, tag)] = argv[3]
            elif kind == "2":
                done_ms.setdefault((jid, tag), int(ms))

    missing = 0
    rerun_after = 0
    stale_runs = 0  # by a stopped node, after its completion was recorded elsewhere
    reruns = 0
    for jid, st in states.items():
        if st != "succeeded":
            continue
        for s in STEPS:
            runs = effects.get((jid, s), [])
            if not runs:
                missing += 1
                note(f"job {jid} succeeded but step {s} left no side effect")
            reruns += max(0, len(runs) - 1)
    for (jid, tag), s in step_of.items():
        d = done_ms.get((jid, tag))
        if d is None:
            continue
        for _, ms, pid in effects.get((jid, s), []):
            if ms <= d + 5:
                continue
            if pid in stops:
                stale_runs += 1
                note(f"job {jid} step {s}: run at {ms} by the stopped node (pid {pid}) after its completion at {d}")
            else:
                rerun_after += 1
                note(f"job {jid} step {s}: side effect at {ms} (pid {pid}) after its completion at {d}")

    # Long-polls and SSE streams opened on other nodes.
    def answers(d, parse):
        out = []
        for name in sorted(os.listdir(d)):
            jid, node = name.rsplit(".", 1)
            with open(os.path.join(d, name), errors="replace") as f:
                out.append((jid, node, parse(f.read())))
        return out

    def poll_state(text):
        try:
            return json.loads(text).get("state")
        except ValueError:
            return None  # no answer: the node went away under it

    def sse_state(text):
        if not text:
            return None
        if "event: end" not in text:
            return "unended"
        m = re.findall(r'"state":"(\w+)"', text)
        return m[-1] if m else "no state"

    polls = answers(o.polls, poll_state)
    sses = answers(o.sse, sse_state)
    steady_bad = 0
    steady_n = 0
    came_back = 0
    came_back_bad = 0
    for kind, rows in (("long-poll", polls), ("SSE", sses)):
        for jid, node, st in rows:
            if node == o.steady:
                steady_n += 1
                if st != "succeeded":
                    steady_bad += 1
                    note(f"{kind} of job {jid} on the undisturbed node {node}: {st}")
            if st is not None and st != "unended":
                came_back += 1
                if st != "succeeded":
                    came_back_bad += 1
                    note(f"{kind} of job {jid} on node {node} answered {st}")

    total = len(acked)
    print(f"# acknowledged {total}, found {found}, terminal {terminal}, succeeded {succeeded}; "
          f"steps run again before their completion was recorded (allowed): {reruns}; "
          f"long-polls {len(polls)}, SSE streams {len(sses)} ({steady_n} on the undisturbed node)")
    for s in notes:
        print(f"# {s}")
    tap(found == total, f"every acknowledged job is found ({found}/{total}, lost {total - found})")
    tap(terminal == found, f"every job reached a terminal state ({terminal}/{found})")
    tap(succeeded == found, f"every job succeeded ({succeeded}/{found})")
    tap(missing == 0, f"every step of every job left its side effect (missing {missing})")
    tap(rerun_after == 0, f"no step ran again after its completion was recorded, but by a stopped node ({rerun_after})")
    allowed = RACE_PER_STOP * len(stops)
    tap(stale_runs <= allowed,
        f"a node back from SIGSTOP started at most {RACE_PER_STOP} calls per stop after losing its lease ({stale_runs} in {len(stops)} stops)")
    tap(steady_n > 0, f"long-polls and SSE streams were opened on other nodes ({len(polls)} + {len(sses)})")
    tap(steady_bad == 0,
        f"every long-poll and SSE stream on the undisturbed node ended with the final state ({steady_n - steady_bad}/{steady_n})")
    tap(came_back_bad == 0,
        f"every long-poll or SSE answer that came back from any node is the final state ({came_back - came_back_bad}/{came_back})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
