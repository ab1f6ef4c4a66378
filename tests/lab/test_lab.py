"""The attention lab (``attnlab lab``): its server answered with a real HTTP client (a uvicorn
server in this process, http.client) and its page driven in headless Chromium. The server
answers only its own token and Host, bounds every input naming the limit, keeps a slow request on
one model from holding another, and answers 16 requests at once; the page follows a sentence
typed (Chinese characters as characters), switches heads off, steps through a head and speaks
Chinese, with no error in the browser's console."""

from __future__ import annotations

import http.client
import json
import os
import resource
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

pytest.importorskip("starlette", reason="the lab's server: pip install 'attnlab[lab]'")
uvicorn = pytest.importorskip("uvicorn", reason="the lab's server: pip install 'attnlab[lab]'")
transformers = pytest.importorskip("transformers", reason="transformers writes the tiny model as a GGUF file")

from gguf_files import byte_level_vocab, write_gguf  # noqa: E402

from attnlab.lab.models import MAX_CHARS, MAX_TOKENS, load_models  # noqa: E402
from attnlab.lab.server import MAX_BODY, create_app  # noqa: E402
from attnlab.viz.explorer import decode_weights  # noqa: E402

TOKEN = "the-test-token"


def _tiny(tmp: Path, name: str, seed: int) -> Path:
    """A tiny random llama with a byte-level vocabulary, as a GGUF file."""
    torch.manual_seed(seed)
    vocab = byte_level_vocab()
    config = transformers.LlamaConfig(vocab_size=len(vocab["tokens"]), hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=512)
    return write_gguf(tmp / name, "llama", transformers.LlamaForCausalLM(config).eval(), vocab)


class Served:
    """The lab's application under uvicorn on a free port of 127.0.0.1, in a thread."""

    def __init__(self, models) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        app = create_app(models, TOKEN, {f"127.0.0.1:{self.port}", f"localhost:{self.port}"})
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.05)

    def request(self, method: str, path: str, body: object = None, *, token: str | None = TOKEN,
                host: str | None = None, raw: bytes | None = None) -> tuple[int, dict | str, dict]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        headers = {"Host": host or f"127.0.0.1:{self.port}"}
        if token is not None:
            headers["X-Lab-Token"] = token
        data = raw if raw is not None else None if body is None else json.dumps(body).encode()
        if data is not None:
            headers["Content-Type"] = "application/json"
        conn.request(method, path, body=data, headers=headers)
        res = conn.getresponse()
        text = res.read().decode()
        conn.close()
        kind = res.getheader("content-type", "")
        return res.status, json.loads(text) if "json" in kind else text, dict(res.getheaders())

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lab")
    models = load_models([str(_tiny(tmp, "a.gguf", 0)), str(_tiny(tmp, "b.gguf", 1))])
    served = Served(models)
    yield served, models
    served.stop()


# ----------------------------------------------------------------------------- who may ask
def test_every_request_needs_the_token_and_the_labs_own_host(lab):
    served, _ = lab
    assert served.request("GET", "/api/models", token=None)[0] == 403
    assert served.request("GET", "/api/models", token="wrong")[0] == 403
    status, body, _ = served.request("GET", f"/api/models?token={TOKEN}", token=None)
    assert status == 200 and [m["decoder"] for m in body["models"]] == [True, True]
    # a page of another site whose name resolves to this machine (DNS rebinding): its Host is refused
    status, body, _ = served.request("GET", "/api/models", host=f"evil.example:{served.port}")
    assert status == 403 and "its own address" in body["error"]
    status, page, headers = served.request("GET", f"/?token={TOKEN}", token=None)
    assert status == 200 and "attnlab-explorer/1" in page and 'id="lab-text"' in page
    assert headers["referrer-policy"] == "no-referrer" and headers["cache-control"] == "no-store"
    assert "connect-src 'self'" in page  # the page talks to its server, and to nothing else


def test_inputs_are_bounded_and_refused_naming_the_limit(lab):
    served, _ = lab
    status, body, _ = served.request("POST", "/api/analyze", raw=b"{" + b" " * MAX_BODY + b"}")
    assert status == 413 and f"{MAX_BODY:,} bytes" in body["error"]
    assert served.request("POST", "/api/analyze", raw=b"not json")[1]["error"] == "the request's body must be JSON"
    status, body, _ = served.request("POST", "/api/analyze", {"model": 5, "text": "hi"})
    assert status == 400 and "model must be an index in [0, 1]" in body["error"]
    status, body, _ = served.request("POST", "/api/analyze", {"model": 0, "text": "x" * (MAX_CHARS + 1)})
    assert status == 400 and f"at most {MAX_CHARS:,}" in body["error"]
    status, body, _ = served.request("POST", "/api/analyze", {"model": 0, "text": "注意力 " * 200})
    assert status == 400 and f"at most {MAX_TOKENS}" in body["error"]
    status, body, _ = served.request("POST", "/api/analyze", {"model": 0, "text": "../../etc/passwd"})
    assert status == 200  # a path is only a text here: the models are those the command line named
    status, body, _ = served.request("POST", "/api/next", {"model": 0, "text": "hi", "off": [[9, 0]]})
    assert status == 400 and "off must list [layer, head] pairs" in body["error"]
    status, body, _ = served.request("POST", "/api/next", {"model": 0, "text": "hi", "temperature": -1})
    assert status == 400 and "temperature" in body["error"]


# ----------------------------------------------------------------------------- what it answers
def test_a_chinese_sentence_is_analyzed_with_its_characters_and_every_head(lab):
    served, models = lab
    status, data, _ = served.request("POST", "/api/analyze", {"model": 0, "text": "注意力机制 is attention"})
    assert status == 200 and data["format"] == "attnlab-explorer/1"
    group = data["documents"][0]["groups"][0]
    assert "\ufffd" not in "".join(group["queries"])
    assert any(q.startswith("注") for q in group["queries"]) and len(group["layers"]) == 2
    assert group["stats"]["roles"] is not None and data["documents"][0]["lm"] is not None


def test_switching_a_head_off_changes_the_loss_and_the_step_is_the_layers(lab):
    served, _ = lab
    text = "the cat sat on the mat. the cat sat on the"
    _, plain, _ = served.request("POST", "/api/next", {"model": 0, "text": text})
    _, off, _ = served.request("POST", "/api/next", {"model": 0, "text": text, "off": [[1, 0], [1, 2]]})
    assert plain["loss"] != off["loss"] and off["off"] == [[1, 0], [1, 2]]
    _, again, _ = served.request("POST", "/api/next", {"model": 0, "text": text})
    assert again["loss"] == plain["loss"]  # the heads are back
    _, sampled, _ = served.request("POST", "/api/next", {"model": 0, "text": text, "temperature": 1.0, "top_k": 3})
    assert len(sampled["candidates"]) == 3 and abs(sum(c["prob"] for c in sampled["candidates"]) - 1) < 1e-4
    _, data, _ = served.request("POST", "/api/analyze", {"model": 0, "text": text})
    group = data["documents"][0]["groups"][0]
    n = len(group["queries"])
    status, step, _ = served.request("POST", "/api/step", {"model": 0, "text": text, "layer": 1, "head": 2,
                                                           "query": n - 1})
    assert status == 200 and step["kv_head"] == 1 and len(step["keys"]) == n
    shown = decode_weights(group["layers"][1]["data"], (4, n, n))[2, n - 1]  # what the views draw, 8 bits
    assert (torch.tensor(step["weights"]) - shown).abs().max() <= 1 / 255 + 1e-6
    status, body, _ = served.request("POST", "/api/step", {"model": 0, "text": text, "layer": 1, "head": 9,
                                                           "query": 0})
    assert status == 400 and "head must be in [0, 3]" in body["error"]


def test_a_slow_request_on_one_model_does_not_hold_the_other(lab, monkeypatch):
    served, models = lab
    original = models[0].analyze

    def slow(text):
        time.sleep(3)
        return original(text)

    monkeypatch.setattr(models[0], "analyze", slow)
    with ThreadPoolExecutor(2) as pool:
        held = pool.submit(served.request, "POST", "/api/analyze", {"model": 0, "text": "slow"})
        time.sleep(0.3)
        start = time.monotonic()
        status, _, _ = served.request("POST", "/api/next", {"model": 1, "text": "quick"})
        quick = time.monotonic() - start
        assert status == 200 and not held.done() and quick < 2.5
        assert held.result()[0] == 200


def test_sixteen_requests_at_once_are_all_answered_in_bounded_memory(lab):
    served, _ = lab
    texts = [f"request {i}: the cat sat on the mat and 注意力 {i}" for i in range(16)]
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda i: served.request("POST", "/api/analyze" if i % 2 else "/api/next",
                                                         {"model": i % 2, "text": texts[i]}), range(16)))
    assert [a[0] for a in answers] == [200] * 16
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mb < 500, grown_mb  # each model one request at a time: no 16 passes side by side


# ----------------------------------------------------------------------------- the command
def test_the_command_listens_on_loopback_with_a_token_and_stops_on_ctrl_c(tmp_path):
    path = _tiny(tmp_path, "m.gguf", 0)
    proc = subprocess.Popen([sys.executable, "-m", "attnlab", "lab", str(path), "--port", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        proc.stdout.readline()
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:") and "/?token=" in url and len(url.split("token=")[1]) >= 32
        port = int(url.split(":")[2].split("/")[0])
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        conn.request("GET", "/" + url.split("/", 3)[3])
        assert conn.getresponse().status == 200
        proc.send_signal(2)  # Ctrl-C
        assert proc.wait(30) == 0
    finally:
        proc.kill()
    other = subprocess.run([sys.executable, "-m", "attnlab", "lab", str(path), "--port", "99999"], capture_output=True,
                           text=True)
    assert other.returncode == 2 and other.stderr.strip().endswith("got 99999")


# ----------------------------------------------------------------------------- the page in a browser
def lab_ready(driver):
    """Whether the lab's page has drawn what its last input asked for."""
    return driver.execute_script("return document.body.dataset.labReady") == "1"


def open_lab(driver, served):
    """The lab's page in ``driver``, its console read empty first; returns a 60-second wait once
    the page says it is ready."""
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get_log("browser")
    driver.get(f"http://127.0.0.1:{served.port}/?token={TOKEN}")
    wait = WebDriverWait(driver, 60)
    wait.until(lab_ready)
    return wait


def test_the_page_follows_a_sentence_switches_heads_off_and_steps_through_a_head(lab, browser):
    from selenium.webdriver.common.by import By

    served, _ = lab
    driver = browser
    wait = open_lab(driver, served)
    box = driver.find_element(By.ID, "lab-text")
    box.clear()
    box.send_keys("注意力机制 and the cat sat")
    wait.until(lambda d: "注" in "".join(d.execute_script(
        "return window.attnlabExplorer.current().documents[0].groups[0].queries")))
    wait.until(lab_ready)
    loss = driver.find_element(By.ID, "lab-loss").text
    driver.find_element(By.CSS_SELECTOR, "#lab-off button[data-key='1/0']").click()
    wait.until(lambda d: d.find_element(By.ID, "lab-loss").text not in ("", loss))
    assert "1 heads off" in driver.find_element(By.ID, "lab-loss").text
    driver.find_element(By.CSS_SELECTOR, "#lab-queries button[data-i='2']").click()
    wait.until(lambda d: "query 2" in d.find_element(By.ID, "lab-step").text)
    weights = driver.execute_script("return Array.from(document.querySelectorAll('#lab-step tbody tr'))"
                                    ".map(r => r.lastChild.textContent)")
    assert len(weights) == len(driver.execute_script(
        "return window.attnlabExplorer.current().documents[0].groups[0].queries"))
    driver.find_element(By.ID, "lab-lang").click()
    assert driver.find_element(By.CSS_SELECTOR, "#lab h2[data-t='off']").text == "关掉注意力头"
    # one switch for the lab's panel and the explorer's views (whose own switch the lab hides)
    wait.until(lambda d: d.find_element(By.CSS_SELECTOR, ".tab[data-view='head']").text == "头视图")
    assert not driver.find_element(By.ID, "lang").is_displayed()
    driver.find_element(By.ID, "lab-append").click()
    wait.until(lab_ready)
    severe = [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert severe == []


def test_what_an_analysis_keeps_gives_the_answers_of_a_pass_of_their_own(lab):
    """The next token and the step of a text just analyzed come from that analysis's pass: the same
    numbers as a pass of their own."""
    _, models = lab
    model = models[1]
    text = "an analysis keeps its logits and the layers' inputs"
    model._kept = None
    fresh_next, fresh_step = model.next_tokens(text), model.step(text, 1, 3, 5)
    model.analyze(text)
    assert model._kept_for(model._decoder_ids(text)[1]) is not None
    kept_next, kept_step = model.next_tokens(text), model.step(text, 1, 3, 5)
    assert [c["id"] for c in kept_next["candidates"]] == [c["id"] for c in fresh_next["candidates"]]
    assert abs(kept_next["loss"] - fresh_next["loss"]) < 1e-4
    assert torch.allclose(torch.tensor(kept_step["weights"]), torch.tensor(fresh_step["weights"]), atol=1e-5)


def test_two_models_side_by_side_on_the_same_text(lab, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    served, _ = lab
    driver = browser
    wait = open_lab(driver, served)
    Select(driver.find_element(By.ID, "lab-compare")).select_by_value("1")
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#lab-side-columns > .lab-box canvas.matrix")) == 2)
    boxes = driver.find_elements(By.CSS_SELECTOR, "#lab-side-columns > .lab-box")
    losses = [b.find_element(By.CSS_SELECTOR, "p.caption").text for b in boxes]
    assert all(l.startswith("loss on the text:") for l in losses) and losses[0] != losses[1]  # two models
    box = driver.find_element(By.ID, "lab-text")
    box.send_keys(" 注意")
    wait.until(lambda d: d.execute_script(
        "const s = window.attnlabLab.state.side; return s.length === 2 && "
        "s[1].analyzed.documents[0].groups[0].queries.some(q => q.startsWith('意'))"))
    assert [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"] == []


# ----------------------------------------------------------------------------- an image model
def _png(width: int, height: int, seed: int = 0) -> bytes:
    import io

    import numpy as np
    from PIL import Image

    buf = io.BytesIO()
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def image_lab(tmp_path_factory, _finished_digits_run):
    """The lab over a digits run (a ViT of 4x4 patches), a Hugging Face ViT folder and a text model."""
    import shutil

    tmp = tmp_path_factory.mktemp("image-lab")
    run = shutil.copytree(_finished_digits_run, tmp / "digits")
    vit = tmp / "vit"
    torch.manual_seed(0)
    transformers.ViTModel(transformers.ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2,
                                                 num_attention_heads=4, intermediate_size=64)).eval().save_pretrained(vit)
    models = load_models([str(run), str(vit), str(_tiny(tmp, "a.gguf", 0))])
    served = Served(models)
    yield served, models
    served.stop()


def test_an_uploaded_image_gives_its_patches_every_head_and_the_rollout(image_lab):
    from attnlab.lab.models import MAX_IMAGE_BYTES, MAX_IMAGE_SIDE

    served, _ = image_lab
    status, body, _ = served.request("GET", "/api/models")
    assert [m["reads"] for m in body["models"]] == ["images", "images", "texts"]
    for model, grid, prefix in ((0, [4, 4], 1), (1, [4, 4], 1)):
        status, page, _ = served.request("POST", f"/api/image?model={model}", raw=_png(40, 30))
        assert status == 200, page
        [doc] = page["documents"]
        assert doc["kind"] == "image" and doc["image"]["grid"] == grid and doc["image"]["prefix"] == prefix
        assert doc["image"]["rollout"] is not None and doc["image"]["src"].startswith("data:image/png;base64,")
        assert doc["title"].startswith("your image")
        layer = doc["groups"][0]["layers"][0]
        n = prefix + grid[0] * grid[1]
        weights = decode_weights(layer["data"], (layer["heads"], n, n))
        # each query's row of each head sums to 1, up to the page's 8 bits a weight
        assert (weights.sum(-1) - 1).abs().max() <= n * 0.5 / 255 + 1e-6
    assert " -> " in served.request("POST", "/api/image?model=0", raw=_png(8, 8))[1]["documents"][0]["title"]  # a run predicts
    # bounded, each limit named; the body's size is checked while it is read
    status, body, _ = served.request("POST", "/api/image?model=0", raw=b"\0" * (MAX_IMAGE_BYTES + 1))
    assert status == 413 and f"{MAX_IMAGE_BYTES:,} bytes" in body["error"]
    status, body, _ = served.request("POST", "/api/image?model=0", raw=_png(MAX_IMAGE_SIDE + 1, 2))
    assert status == 400 and f"at most {MAX_IMAGE_SIDE} a side" in body["error"]
    status, body, _ = served.request("POST", "/api/image?model=0", raw=b"GIF89a but not really")
    assert status == 400 and "not an image file" in body["error"]
    status, body, _ = served.request("POST", "/api/image?model=0", raw=_png(16, 16)[:60])
    assert status == 400 and "not an image file" in body["error"]
    status, body, _ = served.request("POST", "/api/image?model=0", raw=b"")
    assert status == 400 and "empty" in body["error"]
    status, body, _ = served.request("POST", "/api/image?model=../x", raw=_png(8, 8))
    assert status == 400 and "model must be an index in [0, 2]" in body["error"]
    # each model its own kind of input
    status, body, _ = served.request("POST", "/api/image?model=2", raw=_png(8, 8))
    assert status == 400 and "reads text, not images" in body["error"]
    status, body, _ = served.request("POST", "/api/analyze", {"model": 0, "text": "hello"})
    assert status == 400 and "reads images, not text" in body["error"]
    status, body, _ = served.request("POST", "/api/image?model=0", raw=_png(8, 8), token=None)
    assert status == 403


def test_the_page_takes_an_uploaded_image_and_compares_two_image_models(image_lab, browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    served, _ = image_lab
    picture = tmp_path / "my picture.png"
    picture.write_bytes(_png(64, 48, seed=3))
    driver = browser
    wait = open_lab(driver, served)
    assert not driver.find_element(By.ID, "lab-text").is_displayed()  # an image model: an upload, no text box
    assert "4096×4096 pixels" in driver.find_element(By.ID, "lab-image-limit").text
    title = "return window.attnlabExplorer.current().documents[0].title"
    driver.find_element(By.ID, "lab-image").send_keys(str(picture))
    wait.until(lambda d: d.execute_script(title).startswith("your image ->"))
    wait.until(lab_ready)
    assert driver.find_element(By.ID, "lab-image-title").text.startswith("my picture.png -> ")  # the prediction
    assert driver.find_element(By.ID, "image-canvas").get_attribute("width") != "0"
    assert "4×4 patches" in driver.find_element(By.ID, "image-caption").text
    Select(driver.find_element(By.ID, "image-source")).select_by_value("1")  # the rollout over the pixels
    wait.until(lambda d: "rollout" in d.find_element(By.ID, "image-caption").text)
    # the ViT folder beside it, on the same upload
    compare = Select(driver.find_element(By.ID, "lab-compare"))
    assert [o.get_attribute("value") for o in compare.options] == ["", "1"]  # image models only
    compare.select_by_value("1")
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#lab-side-columns > .lab-box canvas.matrix")) == 2)
    assert driver.execute_script("return window.attnlabLab.state.side[1].analyzed.documents[0].title"
                                 ).startswith("your image")
    # a text model: the text box again
    Select(driver.find_element(By.ID, "lab-model")).select_by_value("2")
    wait.until(lambda d: d.find_element(By.ID, "lab-text").is_displayed())
    wait.until(lambda d: d.execute_script("return window.attnlabExplorer.current().documents[0].kind") == "lm")
    wait.until(lab_ready)
    assert [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"] == []


def test_a_model_the_lab_cannot_show_is_refused_at_the_start_in_one_line(tmp_path, capsys):
    from conftest import train_digits

    from attnlab.cli import main

    run = tmp_path / "linear"
    assert train_digits(run, "model.options.attention=linear") == 0
    capsys.readouterr()
    assert main(["lab", str(run), "--port", "0"]) == 2  # before it listens
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"MODEL {run}: the lab cannot show it" in err and "never forms an n x n weight matrix" in err
