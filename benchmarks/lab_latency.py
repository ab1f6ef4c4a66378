"""The attention lab's speed: how long a model takes to be ready, and how long from an edit of
the text to every view updated, for SmolLM2-135M-Instruct (``make models``) at 64 tokens.

* Load: seconds of :func:`attnlab.lab.models.load_models` (the imports done before).
* The server's answers, through its HTTP API (http.client, a uvicorn server in this process):
  ``/api/analyze`` (every layer and head, the per-head figures), ``/api/next`` (the candidates
  and the loss) and ``/api/step`` (one head's arithmetic), each the median of ``--edits`` texts of
  ``--tokens`` tokens, each text new (no answer can come from an earlier one).
* In a browser (headless Chromium, where it is installed): from the input event of an edit to the
  page's ``labReady``, every view drawn: the page waits a moment after the last key before it asks
  (a typist's pause), which the figure includes and states apart.

    .venv/bin/python benchmarks/lab_latency.py [--model smollm2-135m-instruct] [--tokens 64] [--edits 10]

Time it alone on the machine; the threads are the process's (2 on these machines).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import statistics
import threading
import time

WORDS = ("the cat sat on the mat and looked at the moon while the dog slept by the fire of the old house "
         "注意力 机制 让 模型 关注 重要 的 部分").split()


def texts(tokenizer, tokens: int, count: int) -> list[str]:
    """``count`` different texts of ``tokens`` tokens each (English with some Chinese)."""
    out = []
    for i in range(count):
        words = [WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(4 * tokens)]
        ids = tokenizer.encode_prompt(" ".join(words))[:tokens]
        out.append(tokenizer.decode(ids))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--edits", type=int, default=10)
    args = parser.parse_args()

    import torch
    import uvicorn

    from attnlab.lab.models import load_models
    from attnlab.lab.server import create_app

    print(f"threads: {torch.get_num_threads()}; model: {args.model}; {args.tokens} tokens; {args.edits} edits")
    start = time.perf_counter()
    models = load_models([args.model])
    load = time.perf_counter() - start
    print(f"load: {load:.2f} s")
    run = models[0].target.run
    tokenizer = run.task.tokenizer_of(run)
    edits = texts(tokenizer, args.tokens, args.edits + 1)  # the first warms up

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    port = sock.getsockname()[1]
    token = "bench"
    app = create_app(models, token, {f"127.0.0.1:{port}"}, text=edits[0])
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
    while not server.started:
        time.sleep(0.05)

    def post(path: str, body: dict) -> float:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        t0 = time.perf_counter()
        conn.request("POST", path, body=json.dumps(body).encode(),
                     headers={"X-Lab-Token": token, "Content-Type": "application/json"})
        res = conn.getresponse()
        res.read()
        seconds = time.perf_counter() - t0
        assert res.status == 200, res.status
        conn.close()
        return seconds

    times: dict[str, list[float]] = {"analyze": [], "next": [], "step": []}
    for i, text in enumerate(edits):
        a = post("/api/analyze", {"model": 0, "text": text})
        n = post("/api/next", {"model": 0, "text": text})
        s = post("/api/step", {"model": 0, "text": text, "layer": 10, "head": 3, "query": args.tokens - 1})
        if i:
            for key, value in zip(times, (a, n, s)):
                times[key].append(value)
    for key, values in times.items():
        print(f"/api/{key}: median {statistics.median(values):.3f} s (min {min(values):.3f}, max {max(values):.3f})")
    print(f"the three in a row: median {statistics.median([sum(v) for v in zip(*times.values())]):.3f} s")

    if os.access("/usr/bin/chromium", os.X_OK) and os.access("/usr/bin/chromedriver", os.X_OK):
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
        from selenium.webdriver.support.ui import WebDriverWait

        options = webdriver.ChromeOptions()
        options.binary_location = "/usr/bin/chromium"
        for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1280,1600"):
            options.add_argument(arg)
        driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
        try:
            driver.get(f"http://127.0.0.1:{port}/?token={token}")
            wait = WebDriverWait(driver, 300)
            wait.until(lambda d: d.execute_script("return document.body.dataset.labReady") == "1")
            seconds = []
            for text in edits[1:]:
                driver.execute_script(
                    "window.__t0 = performance.now(); const box = document.getElementById('lab-text');"
                    "box.value = arguments[0]; document.body.dataset.labReady = 'x';"
                    "box.dispatchEvent(new Event('input'));", text)
                wait.until(lambda d: d.execute_script("return document.body.dataset.labReady") == "1")
                # the page's own clock at the end (the driver looks every half second)
                seconds.append(driver.execute_script("return (window.attnlabLab.state.readyAt - window.__t0) / 1000"))
            median, pause = statistics.median(seconds), driver.execute_script("return window.attnlabLab.pause") / 1000
            print(f"browser, edit to every view drawn: median {median:.3f} s, of which {pause:.3f} s is the pause the "
                  f"page waits for after the last key (min {min(seconds):.3f}, max {max(seconds):.3f})")
        finally:
            driver.quit()
    server.should_exit = True


if __name__ == "__main__":
    main()
