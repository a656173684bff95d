#!/usr/bin/env python3
"""The live view and the summary of `just demo` (called by e2e/demo/demo.sh).

  view.py start                  remember the rollout's start (time, workload pods, log offsets)
  view.py frame                  draw one frame; write frame.env for the script
  view.py summary [--wait-traces]  the figures, trace IDs from Jaeger, where to look

Settings come from the environment (DEMO_* and NODEWARDEN_RUN_DIR, set by demo.sh);
state between frames is kept in $DEMO_RUN/view.json. Standard library only.
"""

import datetime
import http.client
import json
import os
import re
import shutil
import ssl
import sys
import time
import urllib.parse
import urllib.request

ENV = os.environ
RUN = ENV["DEMO_RUN"]
CLUSTER = ENV["NODEWARDEN_RUN_DIR"]
TOTAL = int(ENV["DEMO_TOTAL"])
OLD, NEW = ENV["DEMO_OLD"], ENV["DEMO_NEW"]
LABEL = ENV["DEMO_LABEL"]
PORTS = dict(p.split("=") for p in ENV.get("DEMO_PORTS", "").split())
TTY = ENV.get("DEMO_TTY") == "1"
STATE = os.path.join(RUN, "view.json")
SELECTOR = "labelSelector=" + urllib.parse.quote(LABEL)

BOLD, DIM, GREEN, YELLOW, RED, RESET = (
    ("\033[1m", "\033[2m", "\033[32m", "\033[33m", "\033[31m", "\033[0m") if TTY else ("",) * 6
)


# --- the API server (admin client certificate of the local control plane) ---------


class Api:
    def __init__(self):
        ctx = ssl.create_default_context(cafile=f"{CLUSTER}/pki/ca.crt")
        ctx.load_cert_chain(f"{CLUSTER}/pki/admin.crt", f"{CLUSTER}/pki/admin.key")
        port = int(open(f"{CLUSTER}/apiserver-port").read())
        self.conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=5)

    def get(self, path):
        self.conn.request("GET", path)
        r = self.conn.getresponse()
        body = r.read()
        if r.status == 404:
            return None
        if r.status != 200:
            raise RuntimeError(f"GET {path}: {r.status} {body[:200]!r}")
        return json.loads(body)

    def items(self, path):
        got = self.get(path)
        return (got or {}).get("items", [])


def parse_time(s):
    """RFC 3339 (with or without fraction) to Unix seconds."""
    if not s:
        return None
    s = s.rstrip("Z")
    frac = 0.0
    if "." in s:
        s, f = s.split(".", 1)
        frac = float("0." + re.sub(r"[^0-9].*$", "", f) or "0")
    t = datetime.datetime.strptime(s, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=datetime.timezone.utc)
    return t.timestamp() + frac


def load_state():
    with open(STATE) as f:
        return json.load(f)


def save_state(state):
    tmp = STATE + ".tmp"
    with open(tmp, "w") as f:
        json.dump(state, f)
    os.replace(tmp, STATE)


def read_env_file(path):
    out = {}
    try:
        for line in open(path):
            if "=" in line:
                k, v = line.strip().split("=", 1)
                out[k] = v
    except FileNotFoundError:
        pass
    return out


def pods_path():
    return f"/api/v1/namespaces/{ENV['DEMO_NS']}/pods?labelSelector=app%3D{ENV['DEMO_WORKLOAD']}"


def pod_ready(p):
    if p["metadata"].get("deletionTimestamp"):
        return False
    conds = p.get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)


def log_files():
    return sorted(f for f in os.listdir(RUN) if re.fullmatch(r"demo-\d+\.log", f))


# --- start ------------------------------------------------------------------------


def start():
    api = Api()
    pods = api.items(pods_path())
    now = time.time()
    state = {
        "start": now,
        "initial_pods": sorted(p["metadata"]["uid"] for p in pods),
        "seen_pods": sorted(p["metadata"]["uid"] for p in pods),
        "min_available": sum(pod_ready(p) for p in pods),
        "offsets": {f: os.path.getsize(os.path.join(RUN, f)) for f in log_files()},
        "events": [],
        "replacements": {},  # node -> {trace_id, heir, seconds}
        "rollout": None,  # {trace_id, seconds}
        "failover": None,
        "complete_at": None,
        "last_line": None,
        "last_line_at": 0,
    }
    save_state(state)
    with open(os.path.join(RUN, "start"), "w") as f:
        f.write(f"{now}\n")


# --- events from the replicas' JSON logs -------------------------------------------

STEP = re.compile(r"^(\w+)\s*\{(.*)\}$")


def describe_step(step):
    m = STEP.match(step or "")
    if not m:
        return f"step {step}"
    kind = m.group(1)
    body = {k: v.strip().strip('"') for k, v in re.findall(r'(\w+): ("[^"]*"|[^,]*)', m.group(2))}
    if kind == "Create":
        return f"create {body.get('count')} instance(s) in {body.get('group')}"
    if kind == "Pair":
        return f"pair {body.get('donor')} -> heir {body.get('heir')}"
    if kind == "Drain":
        return f"drain {body.get('node')} (NodeMaintenance)"
    if kind == "Retire":
        return f"retire {body.get('node')} (delete node + instance)"
    if kind == "MarkObsolete":
        return f"mark {body.get('node')} obsolete"
    return f"{kind.lower()} {m.group(2)}"


def describe(level, msg, f):
    if msg == "rollout step":
        return describe_step(f.get("step"))
    if msg == "became leader":
        return f"{BOLD}became leader{RESET}"
    if msg == "stopped leading":
        return f"stopped leading ({f.get('reason', '')})"
    if msg == "drain started":
        return f"drain of {f.get('node')} started"
    if msg == "drain succeeded":
        return f"drain of {f.get('node')} succeeded ({f.get('elapsed', '')})"
    if msg == "node replacement finished":
        return f"{GREEN}{f.get('node')} replaced by {f.get('heir')}{RESET} in {float(f.get('seconds', 0)):.1f}s"
    if msg == "set the group's image":
        return f"group {f.get('group')}: image {f.get('from')} -> {f.get('to')}"
    if msg == "rollout finished":
        return f"{GREEN}rollout finished{RESET} ({float(f.get('seconds', 0)):.1f}s)"
    if msg in ("released the lease", "signal received: shutting down gracefully"):
        return msg
    if level in ("WARN", "ERROR"):
        # Errors carry the API's whole Status; its first words say enough here.
        extra = " ".join(f"{k}={str(v).split(' (Status')[0][:100]}" for k, v in f.items() if k != "message")
        return f"{YELLOW}{level.lower()}{RESET} {msg} {extra}".rstrip()
    return None


def read_events(state):
    """New lines of the replicas' logs since the last frame: events to show, and the
    trace IDs of finished replacements and of the rollout."""
    fresh = []
    for name in log_files():
        path = os.path.join(RUN, name)
        off = state["offsets"].get(name, 0)
        size = os.path.getsize(path)
        if size < off:
            off = 0
        if size == off:
            continue
        with open(path, "rb") as f:
            f.seek(off)
            data = f.read()
        # Only whole lines; a partial last line is read next time.
        cut = data.rfind(b"\n") + 1
        state["offsets"][name] = off + cut
        who = name[: -len(".log")]
        for raw in data[:cut].splitlines():
            try:
                line = json.loads(raw)
            except ValueError:
                continue
            fields = line.get("fields", {})
            msg = fields.get("message", "")
            if msg == "node replacement finished":
                state["replacements"][fields.get("node", "?")] = {
                    "trace_id": fields.get("trace_id"),
                    "heir": fields.get("heir"),
                    "seconds": fields.get("seconds"),
                    "by": who,
                }
            if msg == "rollout finished":
                state["rollout"] = {"trace_id": fields.get("trace_id"), "seconds": fields.get("seconds"), "by": who}
            text = describe(line.get("level", ""), msg, fields)
            if text is None:
                continue
            at = parse_time(line.get("timestamp")) or time.time()
            event = {"at": at, "who": who, "text": text}
            prev = [e for e in state["events"] + fresh if e["who"] == who]
            if prev and prev[-1]["text"] == text:
                continue
            fresh.append(event)
    fresh.sort(key=lambda e: e["at"])
    state["events"] = (state["events"] + fresh)[-200:]
    return fresh


# --- a frame ------------------------------------------------------------------------


def bar(done, total, width=30):
    full = int(width * done / total) if total else width
    return "[" + "#" * full + "." * (width - full) + "]"


def condition(nv, kind):
    for c in (nv or {}).get("status", {}).get("conditions", []):
        if c["type"] == kind:
            return c
    return None


def frame():
    state = load_state()
    api = Api()
    now = time.time()
    elapsed = now - state["start"]
    nodes = api.items(f"/api/v1/nodes?{SELECTOR}")
    pending = api.items(f"/apis/update.edgeless.systems/v1alpha1/pendingnodes?{SELECTOR}")
    nms = api.items(f"/apis/nodemaintenance.medik8s.io/v1beta1/nodemaintenances?{SELECTOR}")
    nv = api.get(f"/apis/update.edgeless.systems/v1alpha1/nodeversions/{ENV['DEMO_NV']}")
    lease = api.get(f"/apis/coordination.k8s.io/v1/namespaces/{ENV['DEMO_SYSTEM_NS']}/leases/{ENV['DEMO_LEASE']}")
    pods = api.items(pods_path())
    fresh = read_events(state)

    def image(n):
        return n.get("status", {}).get("nodeInfo", {}).get("osImage")

    def ready(n):
        return any(
            c["type"] == "Ready" and c["status"] == "True" for c in n.get("status", {}).get("conditions", [])
        )

    names = {n["metadata"]["name"] for n in nodes}
    old = [n for n in nodes if image(n) == OLD]
    new_ready = [n for n in nodes if image(n) == NEW and ready(n)]
    cordoned = [n for n in old if n.get("spec", {}).get("unschedulable")]
    joining = [p for p in pending if p["spec"].get("goal") == "Join" and p["spec"].get("nodeName") not in names]
    leaving = [p for p in pending if p["spec"].get("goal") == "Leave"]
    draining = [m for m in nms if (m.get("status") or {}).get("phase") in (None, "Running")]
    blocked = [m for m in draining if (m.get("status") or {}).get("blockedBy")]
    replaced = max(0, TOTAL - len(old))
    status = (nv or {}).get("status", {})
    outdated_c = condition(nv, "Outdated")
    progressing = condition(nv, "Progressing")
    degraded = condition(nv, "Degraded")
    generation = (nv or {}).get("metadata", {}).get("generation")
    up_to_date = (
        outdated_c is not None
        and outdated_c["status"] == "False"
        and outdated_c.get("observedGeneration") == generation
    )
    complete = not old and len(nodes) == TOTAL and len(new_ready) == TOTAL and up_to_date

    # The workload: pods recreated elsewhere, and the fewest available at once.
    for p in pods:
        uid = p["metadata"]["uid"]
        if uid not in state["seen_pods"]:
            state["seen_pods"].append(uid)
    available = sum(pod_ready(p) for p in pods)
    state["min_available"] = min(state["min_available"], available)
    moved = len(set(state["seen_pods"]) - set(state["initial_pods"]))

    # The leader, and the failover after its SIGKILL.
    spec = (lease or {}).get("spec", {})
    holder = spec.get("holderIdentity") or ""
    fo = read_env_file(os.path.join(RUN, "failover.env"))
    # The script's own acts, among the replicas' events.
    for key, text in (("killed_at", f"{RED}SIGKILL{RESET} to the leader {fo.get('killed')}"),
                      ("restarted_at", f"started {fo.get('killed')} again (same identity, as a kubelet would)")):
        if key in fo and key not in state.setdefault("acts", []):
            state["acts"].append(key)
            act = {"at": float(fo[key]), "who": "demo", "text": text}
            fresh.append(act)
            state["events"].append(act)
            state["events"].sort(key=lambda e: e["at"])
    if fo.get("killed") and state["failover"] is None:
        killed_at = float(fo["killed_at"])
        acquired = parse_time(spec.get("acquireTime"))
        if holder and holder != fo["killed"] and acquired and acquired >= killed_at - 1:
            state["failover"] = {
                "killed": fo["killed"],
                "killed_after": killed_at - state["start"],
                "new": holder,
                "seconds": acquired - killed_at,
                "seen_after": now - killed_at,
                "replaced_at_kill": int(fo.get("replaced", replaced)),
            }
    if state["complete_at"] is None and complete:
        state["complete_at"] = now
    save_state(state)

    with open(os.path.join(RUN, "frame.env"), "w") as f:
        f.write(
            f"replaced={replaced}\nleader={holder}\njoining={len(joining)}\ndrains={len(draining)}\n"
            f"complete={int(complete)}\nnew_leader={(state['failover'] or {}).get('new', '')}\n"
            f"elapsed={int(elapsed)}\n"
        )

    # What to show.
    port = PORTS.get(holder)
    metrics = f"http://127.0.0.1:{port}/metrics" if port else "-"
    if fo.get("killed") and state["failover"] is None:
        since = now - float(fo["killed_at"])
        failover = f"{RED}SIGKILL {fo['killed']}{RESET} {since:4.1f}s ago; waiting for a standby to take the lease ..."
    elif state["failover"]:
        x = state["failover"]
        back = " (restarted, now standby)" if fo.get("restarted_at") else ""
        failover = (
            f"{x['killed']} SIGKILLed at {x['killed_after']:.1f}s -> {BOLD}{x['new']}{RESET} "
            f"took the lease {x['seconds']:.1f}s later; {x['killed']}{back}"
        )
    else:
        failover = f"the leader gets SIGKILL once {(TOTAL + 1) // 2} nodes are replaced"
    conds = []
    if progressing:
        conds.append(f"Progressing={progressing['status']} ({progressing.get('reason', '')})")
    if outdated_c:
        conds.append(f"Outdated={outdated_c['status']}")
    if degraded and degraded["status"] == "True":
        conds.append(f"{RED}Degraded ({degraded.get('reason')}: {degraded.get('message', '')}){RESET}")
    lines = [
        f"{BOLD}nodewarden demo{RESET}: {TOTAL} nodes {OLD} -> {NEW}, maxSurge {ENV['DEMO_SURGE']}, "
        f"3 replicas        elapsed {BOLD}{elapsed:5.1f}s{RESET}",
        "",
        f"  progress   {GREEN if complete else ''}{bar(replaced, TOTAL)}{RESET} {BOLD}{replaced}/{TOTAL}{RESET} replaced"
        f"   (NodeVersion says {status.get('progress', '-')} up to date)",
        f"  nodes      {len(nodes)} in the cluster: {len(old)} outdated ({len(cordoned)} cordoned), "
        f"{status.get('replacing', 0)} replacing, {len(joining)} joining, {len(leaving)} leaving",
        f"  drains     {len(draining)} running" + (f", {len(blocked)} waiting on the PodDisruptionBudget" if blocked else ""),
        f"  workload   {available}/{len(pods)} pods available (fewest: {state['min_available']}), {moved} pods moved",
        f"  condition  {', '.join(conds) or '-'}",
        f"  leader     {BOLD}{holder or '(none)'}{RESET} (lease transitions {spec.get('leaseTransitions', 0)})   metrics {metrics}",
        f"  failover   {failover}",
        "",
        f"  {DIM}recent events (replica logs){RESET}",
    ]
    recent = state["events"][-8:]
    for e in recent:
        lines.append(f"  {DIM}{e['at'] - state['start']:+6.1f}s{RESET} {e['who']:<7} {e['text']}")
    lines += [""] * (8 - len(recent))

    if TTY:
        width = shutil.get_terminal_size((120, 40)).columns
        out = "\033[H"
        for line in lines:
            out += clip(line, width) + "\033[K\n"
        sys.stdout.write(out + "\033[J")
        sys.stdout.flush()
    else:
        # Plain lines for logs and pipes: the status when it changes (at most every
        # 2 s, or every 10 s anyway), and each event once.
        for e in fresh:
            print(f"  {e['at'] - state['start']:+6.1f}s {e['who']:<7} {e['text']}")
        line = (
            f"[{elapsed:6.1f}s] {replaced}/{TOTAL} replaced, {len(old)} outdated, {status.get('replacing', 0)} replacing, "
            f"{len(joining)} joining, {len(draining)} drains, pods {available}/{len(pods)}, leader {holder or '-'}"
        )
        key = line.split("] ", 1)[1]
        if complete or (key != state["last_line"] and now - state["last_line_at"] >= 2) or now - state["last_line_at"] >= 10:
            print(line, flush=True)
            if state["failover"] and not state.get("failover_printed"):
                print(f"           failover: {failover}")
                state["failover_printed"] = True
            state["last_line"], state["last_line_at"] = key, now
            save_state(state)
        sys.stdout.flush()


ANSI = re.compile(r"\033\[[0-9;]*m")


def clip(line, width):
    """Cuts a line with colour codes to `width` visible characters."""
    out, seen, i = "", 0, 0
    while i < len(line):
        m = ANSI.match(line, i)
        if m:
            out += m.group(0)
            i = m.end()
            continue
        if seen >= width - 1:
            break
        out += line[i]
        seen += 1
        i += 1
    return out + (RESET if TTY else "")


# --- the summary --------------------------------------------------------------------


def jaeger(path):
    with urllib.request.urlopen(ENV["DEMO_JAEGER"] + path, timeout=10) as r:
        return json.load(r).get("data") or []


def tag(span, key):
    for t in span.get("tags", []):
        if t["key"] == key:
            return t["value"]
    return None


def root_of(trace, op):
    for s in trace["spans"]:
        if s["operationName"] == op and not any(r.get("refType") == "CHILD_OF" for r in s.get("references", [])):
            return s
    return None


def instances(trace):
    out = set()
    for s in trace["spans"]:
        proc = trace["processes"].get(s["processID"], {})
        for t in proc.get("tags", []):
            if t["key"] == "service.instance.id":
                out.add(t["value"])
    return out


def find_traces(state):
    """The demo's rollout trace and the replacement traces linked to it."""
    window = f"&start={int((state['start'] - 5) * 1e6)}&end={int((time.time() + 5) * 1e6)}&limit=100"
    rollouts = [t for t in jaeger(f"/api/traces?service=nodewarden&operation=rollout{window}") if root_of(t, "rollout")]
    want = (state.get("rollout") or {}).get("trace_id")
    rollout = next((t for t in rollouts if t["traceID"] == want), None)
    if rollout is None and not want and len(rollouts) == 1:
        rollout = rollouts[0]
    replaces = []
    if rollout:
        for t in jaeger(f"/api/traces?service=nodewarden&operation=replace%20node{window}"):
            root = root_of(t, "replace node")
            if root and any(r["traceID"] == rollout["traceID"] for r in root.get("references", [])):
                replaces.append(t)
    return rollout, replaces


def summary(wait):
    state = load_state()
    # The last lines of the logs ("rollout finished" may come after the last frame).
    read_events(state)
    save_state(state)
    rollout, replaces = None, []
    deadline = time.time() + (30 if wait else 0)
    while True:
        try:
            rollout, replaces = find_traces(state)
        except OSError as e:
            print(f"(Jaeger: {e})")
        if (rollout and len(replaces) >= TOTAL) or time.time() >= deadline:
            break
        time.sleep(1)
        read_events(state)
    save_state(state)

    q = ENV["DEMO_JAEGER"]
    took = (state["complete_at"] or time.time()) - state["start"]
    fo = state["failover"]
    moved = len(set(state["seen_pods"]) - set(state["initial_pods"]))
    evictions = sum(
        1
        for t in replaces
        for s in t["spans"]
        if s["operationName"] == "drain"
        for log in s.get("logs", [])
        if any(f["key"] == "event" and f["value"] == "evicted" for f in log.get("fields", []))
    )
    print()
    print(f"{BOLD}Summary{RESET}")
    print(f"  rollout      {TOTAL} nodes {OLD} -> {NEW} in {BOLD}{took:.1f}s{RESET} (image change to every node "
          f"Ready on {NEW} and NodeVersion Outdated=False)"
          + (f"; nodewarden's rollout span: {float(state['rollout']['seconds']):.1f}s" if state.get("rollout") else ""))
    print(f"  replaced     {len(state['replacements'])} nodes (\"node replacement finished\" in the replica logs)")
    print(f"  pods moved   {moved} pods of {ENV['DEMO_NS']}/{ENV['DEMO_WORKLOAD']} recreated on other nodes; "
          f"{evictions} evictions on the drain spans (refusals by the budget not counted); never fewer than {state['min_available']} available")
    if fo:
        print(f"  failover     {fo['killed']} (leader) SIGKILLed after {fo['killed_after']:.1f}s with "
              f"{fo['replaced_at_kill']}/{TOTAL} replaced; {fo['new']} held the lease {BOLD}{fo['seconds']:.1f}s{RESET} later "
              f"(lease duration 3s)")
    else:
        print("  failover     none (the leader was not killed)")
    print()
    if rollout:
        r = root_of(rollout, "rollout")
        print(f"  rollout trace  {BOLD}{rollout['traceID']}{RESET}  ({r['duration'] / 1e6:.1f}s)  {q}/api/traces/{rollout['traceID']}")
    else:
        tid = (state.get("rollout") or {}).get("trace_id", "?")
        print(f"  rollout trace  {tid}  (not found in Jaeger)")
    print(f"  replacement traces ({len(replaces)} in Jaeger, linked to the rollout trace):")
    print(f"    {'node':<26} {'heir':<26} {'secs':>5}  {'spans':>5}  trace id")
    rows = []
    for t in replaces:
        root = root_of(t, "replace node")
        rows.append((root["startTime"], tag(root, "k8s.node.name"), tag(root, "nodewarden.heir"),
                     root["duration"] / 1e6, len(t["spans"]), t["traceID"], instances(t)))
    for _, node, heir, secs, spans, tid, inst in sorted(rows):
        crossed = f"  <- spans from {' + '.join(sorted(inst))}" if len(inst) > 1 else ""
        print(f"    {node or '?':<26} {heir or '?':<26} {secs:5.1f}  {spans:5d}  {tid}{crossed}")
    missing = sorted(set(state["replacements"]) - {row[1] for row in rows})
    for node in missing:
        r = state["replacements"][node]
        print(f"    {node:<26} {r.get('heir') or '?':<26} {float(r.get('seconds') or 0):5.1f}      -  {r.get('trace_id')}  (not in Jaeger)")
    print()
    print("  Where to see them (this Jaeger has no web UI, only its HTTP API):")
    print(f"    {q}/api/traces/<trace id>")
    print(f"    {q}/api/traces?service=nodewarden&operation=replace%20node&limit=100")
    print(f"    {q}/api/traces?service=nodewarden&operation=rollout")
    print("  `just e2e` (kind, Docker) runs the same rollout with the Jaeger UI for these traces.")
    leader = open(os.path.join(RUN, "metrics-leader")).read().split() if os.path.exists(os.path.join(RUN, "metrics-leader")) else []
    if len(leader) == 2:
        who, port = leader
        snap = os.path.join(RUN, f"metrics-{who}.txt")
        print(f"  Metrics of the leader {who}: http://127.0.0.1:{port}/metrics (served while it ran; snapshot: {snap};")
        print("    its counters cover only its own work since it started)")
        try:
            for line in open(snap):
                if re.match(r"nodewarden_(replacements_total|drain_duration_seconds_count|leader |nodes\{)", line):
                    print(f"    {line.rstrip()}")
        except FileNotFoundError:
            pass
    print()


def main():
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "start":
        start()
    elif cmd == "frame":
        frame()
    elif cmd == "summary":
        summary("--wait-traces" in sys.argv)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
