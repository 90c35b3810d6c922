#!/usr/bin/env python3
"""Soak test (scripts/soak): `glmserve serve` on the bundled model under 64 concurrent clients of
mixed traffic for a number of minutes: completions and chats, streams cut by the client mid-way,
malformed requests, long prompts sharing prefixes, n > 1, stop strings, tool definitions (auto and
required) and JSON schemas. Fails (exit 1) on a crash, a 5xx or a refused connection, an answer of
the wrong shape, a request the server's http_requests_total does not account for, KV blocks or
running/waiting requests not back at zero afterwards, resident memory growing more than 5% after
warm-up, or a SIGTERM that does not stop it cleanly. Prints a JSON summary; --record writes it to
bench/results/soak-<date>.json with the command, revision, machine and date. Python stdlib only.
Usage: tools/soak.py BINARY MODEL_DIR [--minutes M] [--clients N] [--record]"""
import argparse, datetime, http.client, json, os, random, re, signal, socket, subprocess, sys, threading, time

KINDS = ["completion", "chat", "stream_cut", "malformed", "shared_prefix", "n2", "stop", "tools", "tools_required",
         "schema", "stream_full"]
WEIGHTS = [14, 10, 12, 8, 12, 6, 8, 8, 6, 6, 10]
PREFIX = "".join(f"def helper_{i}(x):\n    return x * {i} + {i * i}\n\n" for i in range(40))
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 10}, "days": {"type": "integer", "minimum": 1, "maximum": 5}},
    "required": ["city"]}}}]
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}, "n": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["name", "n"]}
MALFORMED = ['{"prompt": "x", "max_tokens": -3}', '{"messages": "hi"}', '{not json', '{"prompt": "x", "temperature": "hot"}',
             '{"prompt": "x", "structured_outputs": {"json": {"type": "array", "uniqueItems": true}}}',
             '{"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"}', '\xff\xfe', '[]']


def rss_kib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def metrics(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    c.close()
    values = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name_labels, value = line.rsplit(" ", 1)
        values[name_labels] = float(value)
    return values


def metric(values, name):
    return sum(v for k, v in values.items() if k == name or k.startswith(name + "{"))


class Client(threading.Thread):
    def __init__(self, port, deadline, seed, stats, lock):
        super().__init__(daemon=True)
        self.port, self.deadline, self.rng, self.stats, self.lock = port, deadline, random.Random(seed), stats, lock

    def count(self, key):
        with self.lock:
            self.stats[key] = self.stats.get(key, 0) + 1

    def fail(self, why):
        with self.lock:
            self.stats.setdefault("failures", []).append(why)

    def body(self, kind):
        r = self.rng
        prompt = r.choice(["def main():\n", "class Node:\n", "import json\n", "# utils\n", "x = [1, 2, 3]\n"])
        chat = {"messages": [{"role": "user", "content": prompt}], "chat_template_kwargs": {"enable_thinking": r.random() < 0.5}}
        if kind == "completion":
            return "/v1/completions", {"prompt": prompt, "max_tokens": r.randint(1, 40), "temperature": r.choice([0, 0.8])}
        if kind == "chat":
            return "/v1/chat/completions", dict(chat, max_tokens=r.randint(1, 40), temperature=r.choice([0, 1.0]))
        if kind in ("stream_cut", "stream_full"):
            path = r.choice(["/v1/completions", "/v1/chat/completions"])
            b = {"prompt": prompt} if path == "/v1/completions" else dict(chat)
            b.update(stream=True, max_tokens=r.randint(20, 120), stream_options={"include_usage": True})
            return path, b
        if kind == "shared_prefix":
            return "/v1/completions", {"prompt": PREFIX + prompt, "max_tokens": r.randint(1, 16), "temperature": 0}
        if kind == "n2":
            return "/v1/completions", {"prompt": prompt, "max_tokens": 12, "n": 2, "temperature": 0.9, "seed": r.randint(0, 999)}
        if kind == "stop":
            return "/v1/completions", {"prompt": prompt, "max_tokens": 40, "stop": ["\n", "):"], "temperature": 0.7}
        if kind == "tools":
            return "/v1/chat/completions", dict(chat, tools=TOOLS, tool_choice="auto", max_tokens=30)
        if kind == "tools_required":
            return "/v1/chat/completions", dict(chat, tools=TOOLS, tool_choice="required", max_tokens=80,
                                                chat_template_kwargs={"enable_thinking": False})
        if kind == "schema":
            return "/v1/completions", {"prompt": prompt, "max_tokens": 80, "response_format": {
                "type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA}}}
        raise ValueError(kind)

    def one(self, kind):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        try:
            if kind == "malformed":
                data = self.rng.choice(MALFORMED).encode("latin-1")
                c.request("POST", self.rng.choice(["/v1/completions", "/v1/chat/completions"]), body=data,
                          headers={"Content-Type": "application/json"})
                r = c.getresponse()
                payload = r.read()
                if r.status != 400 or b'"error"' not in payload:
                    self.fail(f"malformed request got {r.status}: {payload[:200]!r}")
                return "bad_request"
            path, b = self.body(kind)
            c.request("POST", path, body=json.dumps(b), headers={"Content-Type": "application/json"})
            r = c.getresponse()
            if r.status != 200:
                self.fail(f"{kind} got {r.status}: {r.read()[:300]!r}")
                return "error"
            if kind == "stream_cut":
                # Read a few events, then hang up (the server must cancel and free the blocks).
                for _ in range(self.rng.randint(1, 6)):
                    if not r.fp.readline():
                        break
                c.sock.shutdown(socket.SHUT_RDWR)
                return "disconnected"
            payload = r.read().decode()
            if kind == "stream_full":
                if not payload.rstrip().endswith("data: [DONE]"):
                    self.fail(f"stream did not end in [DONE]: {payload[-200:]!r}")
                return "ok"
            out = json.loads(payload)
            choices = out.get("choices", [])
            if len(choices) != (2 if kind == "n2" else 1):
                self.fail(f"{kind}: {len(choices)} choices")
            if kind == "tools_required":
                msg = choices[0]["message"]
                if choices[0]["finish_reason"] == "tool_calls" and not msg.get("tool_calls"):
                    self.fail("tool_calls finish without calls")
                if choices[0]["finish_reason"] not in ("tool_calls", "length"):
                    self.fail(f"required tool_choice finished with {choices[0]['finish_reason']}")
            if kind == "schema" and choices[0]["finish_reason"] == "stop":
                v = json.loads(choices[0]["text"])
                if set(v) - {"name", "n"} or "name" not in v or not 0 <= v["n"] <= 99:
                    self.fail(f"schema answer {v}")
            return "ok"
        except (ConnectionError, socket.timeout, http.client.HTTPException, json.JSONDecodeError, KeyError) as e:
            self.fail(f"{kind}: {type(e).__name__}: {e}")
            return "error"
        finally:
            c.close()

    def run(self):
        while time.time() < self.deadline:
            kind = self.rng.choices(KINDS, WEIGHTS)[0]
            self.count("requests")
            self.count(self.one(kind))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("binary")
    p.add_argument("model")
    p.add_argument("--minutes", type=float, default=10)
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--record", action="store_true")
    a = p.parse_args()
    # The CPU path's soak (host memory is what it watches), on a GPU machine too.
    server = subprocess.Popen([a.binary, "serve", a.model, "--device", "cpu", "--port", "0", "--max-model-len", "2048",
                               "--disable-log-requests",
                               "--log-stats-interval", "30"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    port = None
    for line in server.stdout:
        m = re.search(r"listening on http://[^:]+:(\d+)", line)
        if m:
            port = int(m.group(1))
        if "glmserve: ready" in line:
            break
    if port is None:
        print("the server did not start", file=sys.stderr)
        return 1
    threading.Thread(target=lambda: [None for _ in server.stdout], daemon=True).start()  # drain its log
    stats, lock = {}, threading.Lock()
    start = time.time()
    deadline = start + a.minutes * 60
    clients = [Client(port, deadline, i, stats, lock) for i in range(a.clients)]
    for c in clients:
        c.start()
    warm_until = start + max(10.0, a.minutes * 60 * 0.2)
    rss_samples, baseline = [], None
    while any(c.is_alive() for c in clients):
        time.sleep(2)
        if server.poll() is not None:
            break
        rss_samples.append((round(time.time() - start, 1), rss_kib(server.pid)))
        if baseline is None and time.time() >= warm_until:
            baseline = rss_samples[-1][1]
    for c in clients:
        c.join(timeout=150)
    failures = stats.pop("failures", [])
    crashed = server.poll() is not None
    idle = None
    if not crashed:
        for _ in range(40):  # the engine finishes what the cut streams left
            values = metrics(port)
            idle = {k: metric(values, "glmserve:" + k) for k in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc")}
            if not any(idle.values()):
                break
            time.sleep(0.25)
        if any(idle.values()):
            failures.append(f"not idle after the load: {idle}")
        http_total = sum(v for k, v in values.items() if k.startswith("glmserve:http_requests_total{") and
                         ('handler="/v1/completions"' in k or 'handler="/v1/chat/completions"' in k))
        if http_total != stats.get("requests", 0):
            failures.append(f"the server counted {http_total:.0f} API requests, the clients sent {stats.get('requests', 0)}")
        final_rss = rss_kib(server.pid)
        if baseline and final_rss > baseline * 1.05:
            failures.append(f"resident memory grew from {baseline} KiB after warm-up to {final_rss} KiB")
        server.send_signal(signal.SIGTERM)
        try:
            rc = server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            rc = None
        if rc != 0:
            failures.append(f"SIGTERM: exit code {rc}")
    else:
        failures.append(f"the server died (exit code {server.returncode})")
    summary = {"minutes": a.minutes, "clients": a.clients, "outcomes": stats, "idle_after": idle,
               "rss_kib_after_warmup": baseline, "rss_kib_final": rss_samples[-1][1] if rss_samples else None,
               "rss_samples": rss_samples[:: max(1, len(rss_samples) // 40)], "failures": failures[:50],
               "failure_count": len(failures), "passed": not failures}
    if a.record:
        cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "")
        record = {"benchmark": "soak", "command": " ".join(sys.argv), "date": datetime.date.today().isoformat(),
                  "git_revision": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip(),
                  "machine": f"{cpu}, {os.cpu_count()} cores", "model": a.model, "soak": summary}
        path = f"bench/results/soak-{datetime.date.today().strftime('%Y%m%d')}.json"
        json.dump(record, open(path, "w"), indent=2)
        print(f"wrote {path}", file=sys.stderr)
    print(json.dumps({k: v for k, v in summary.items() if k != "rss_samples"}, indent=2))
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
