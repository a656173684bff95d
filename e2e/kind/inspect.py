#!/usr/bin/env python3
"""JSON checks for e2e/kind/suite.sh (standard library only).

Each subcommand reads JSON files written by `kubectl get -o json` or curl and
either prints shell assignments (for `eval`) or exits 0 when a condition holds.

  ready NODES                         number of Ready nodes
  settled NV TOTAL                    NodeVersion Outdated=False for its generation, TOTAL nodes
  rollout NV NODES IMAGE GEN OLD...   progress of the rollout to IMAGE (shell assignments)
  leak INSTANCES NODES                every live sim-cloud instance is a Node and back
  traces TRACES NODE...               one "replace node" trace per replaced node
"""

import json
import shlex
import sys

IMAGE_ANNOTATION = "constellation.edgeless.systems/node-image"


def load(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def is_ready(node):
    conds = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


def condition(obj, type_):
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return c
    return None


def outdated_false_for(nv, generation):
    """Outdated=False written for `generation` or later (not a stale status)."""
    c = condition(nv, "Outdated")
    return bool(c) and c.get("status") == "False" and (c.get("observedGeneration") or 0) >= generation


def cmd_ready(nodes_path):
    print(sum(1 for n in load(nodes_path)["items"] if is_ready(n)))
    return 0


def cmd_settled(nv_path, total):
    nv = load(nv_path)
    gen = nv["metadata"].get("generation", 1)
    nodes = (nv.get("status") or {}).get("nodes")
    return 0 if outdated_false_for(nv, gen) and nodes == int(total) else 1


def cmd_rollout(nv_path, nodes_path, image, generation, *old):
    nv = load(nv_path)
    items = load(nodes_path)["items"]
    status = nv.get("status") or {}
    generation = int(generation)
    names = {n["metadata"]["name"] for n in items}
    current = [
        n
        for n in items
        if (n["metadata"].get("annotations") or {}).get(IMAGE_ANNOTATION) == image
        and ((n.get("status") or {}).get("nodeInfo") or {}).get("osImage") == image
        and is_ready(n)
        and not n["metadata"].get("deletionTimestamp")
    ]
    old_left = sorted(set(old) & names)
    total = len(old)
    settled = outdated_false_for(nv, generation)
    done = settled and len(current) == total and len(items) == total and not old_left
    prog = condition(nv, "Progressing") or {}
    line = (
        f"progress {status.get('progress', '?')} outdated {status.get('outdatedNodes', '?')} "
        f"replacing {status.get('replacing', '?')} | nodes {len(items)}, on {image}: {len(current)}, "
        f"old left {len(old_left)} | {prog.get('reason', '-')}"
    )
    print(f"done={1 if done else 0}")
    print(f"current={len(current)}")
    print(f"line={shlex.quote(line)}")
    return 0


def cmd_leak(instances_path, nodes_path):
    instances = load(instances_path)
    nodes = {n["metadata"]["name"] for n in load(nodes_path)["items"]}
    live = {i["name"] for i in instances if i.get("state") not in ("Terminated", "Terminating")}
    if live == nodes:
        return 0
    print(f"instances without a Node: {sorted(live - nodes)}; Nodes without an instance: {sorted(nodes - live)}")
    return 1


def string_values(span):
    """Every string a span carries in its tags (and its logs' fields)."""
    out = set()
    for tag in span.get("tags") or []:
        if isinstance(tag.get("value"), str):
            out.add(tag["value"])
    for log in span.get("logs") or []:
        for field in log.get("fields") or []:
            if isinstance(field.get("value"), str):
                out.add(field["value"])
    return out


def cmd_traces(traces_path, *replaced):
    doc = load(traces_path)
    traces = doc.get("data") or []
    replaced = set(replaced)
    per_node = {n: set() for n in replaced}
    for trace in traces:
        tid = trace.get("traceID", "?")
        for span in trace.get("spans") or []:
            if span.get("operationName") != "replace node":
                continue
            for node in replaced & string_values(span):
                per_node[node].add(tid)
    identified = any(per_node.values())
    print(f"traces: {len(traces)} for {len(replaced)} replaced nodes")
    if identified:
        bad = {n: sorted(t) for n, t in per_node.items() if len(t) != 1}
        for n in sorted(replaced):
            print(f"  {n}: {len(per_node[n])} trace(s) {' '.join(sorted(per_node[n]))}")
        if bad:
            print(f"nodes without exactly one trace: {sorted(bad)}")
            return 1
        return 0
    # No span names a replaced node in a tag: count traces instead.
    print("  (no 'replace node' span names a replaced node in its tags: counting traces)")
    return 0 if len(traces) == len(replaced) else 1


COMMANDS = {
    "ready": cmd_ready,
    "settled": cmd_settled,
    "rollout": cmd_rollout,
    "leak": cmd_leak,
    "traces": cmd_traces,
}

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        sys.exit(__doc__)
    sys.exit(COMMANDS[sys.argv[1]](*sys.argv[2:]))
