"""The attention explorer's page in a real browser (headless Chromium, driven by selenium):
it loads from the disk with no console error, its head view draws one line per weight at or
above the threshold, hovering a token keeps only its lines, a model-view cell opens that head,
the matrix shows the model's numbers, the image and language-model views answer clicks; the
weights the page holds equal capture_attention's to the quantization step. Screenshots of
each view go to the test's temporary folder."""

import pytest
import torch

from attnlab.attention.capture import capture_attention
from attnlab.models.gpt import GPT
from attnlab.tasks.language_modeling import generation_attention
from attnlab.tasks.views import AlignmentAttention
from attnlab.viz.explorer import Exploration, explore
from attnlab.viz.explorer.documents import document_of
from attnlab.viz.explorer.page import FORMAT

from test_visualize import image_model, make_run

STEP = 0.5 / 255 + 1e-6


def open_page(driver, page: Exploration, path):
    page.save(path)
    driver.get_log("browser")  # what earlier pages logged
    driver.get(path.resolve().as_uri())
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, 60).until(lambda d: d.execute_script("return document.body.dataset.ready") == "1")
    return driver


def errors(driver):
    return [e["message"] for e in driver.get_log("browser") if e["level"] in ("SEVERE",)]


def run(driver, script, *args):
    """Run ``script`` (the body of an async function; ``args`` as ``arguments``) and return its result."""
    return driver.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        f"(async (...arguments) => {{ {script} }})(...Array.from(arguments).slice(0, -1))"
        ".then(done, e => done({error: String(e)}));", *args)


def visible_lines(driver):
    return driver.execute_script(
        "return Array.from(document.querySelectorAll('#view-head line.attn-line'))"
        ".filter(l => getComputedStyle(l).display !== 'none').length")


@pytest.fixture(scope="module")
def lm_page():
    torch.manual_seed(0)
    model = GPT(vocab_size=26, max_len=64, embed_dim=32, depth=3, num_heads=4).eval()
    letters = [chr(ord("a") + i) for i in range(26)]
    view = generation_attention(model, [7, 4, 11, 11, 14, 22, 14, 17, 11, 3], lambda i: letters[i], new_tokens=8)
    view.title = "hello world, continued"
    data = {"format": FORMAT, "title": "a tiny language model", "subtitle": "random weights", "notes": [],
            "documents": [document_of(view)]}
    return Exploration(data), view


def test_the_head_view_draws_the_weights_and_a_hover_keeps_one_tokens_lines(browser, lm_page, tmp_path):
    page, view = lm_page
    driver = open_page(browser, page, tmp_path / "lm.html")
    assert errors(driver) == []
    n = len(view.tokens)
    for layer in range(3):  # the page's numbers are the model's
        shown = torch.tensor(run(driver, "return Array.from(await attnlabExplorer.weights(0, 0, arguments[0]));",
                                 layer)).reshape(4, n, n)
        assert (shown - view.layers[layer][1]).abs().max() <= STEP
    run(driver, "await attnlabExplorer.select({view: 'head', layer: 1, heads: [0, 2]});")
    threshold = float(driver.find_element("id", "threshold").get_attribute("value"))
    shown = torch.tensor(run(driver, "return Array.from(await attnlabExplorer.weights(0, 0, 1));")).reshape(4, n, n)
    expected = int((shown[[0, 2]] >= threshold - 1e-9).sum())
    assert visible_lines(driver) == expected > 0
    heads = {int(h) for h in driver.execute_script(
        "return Array.from(document.querySelectorAll('#view-head line.attn-line')).map(l => l.dataset.head)")}
    assert heads == {0, 2}
    from selenium.webdriver.common.action_chains import ActionChains

    token = driver.find_element("css selector", ".tok-left[data-i='5']")
    ActionChains(driver).move_to_element(token).perform()
    assert visible_lines(driver) == int((shown[[0, 2], 5] >= threshold - 1e-9).sum())
    driver.save_screenshot(str(tmp_path / "head_view_hover.png"))
    ActionChains(driver).move_by_offset(0, 400).perform()
    ActionChains(driver).move_to_element(driver.find_element("tag name", "h1")).perform()
    assert visible_lines(driver) == expected
    assert errors(driver) == []


def test_a_model_view_cell_opens_its_head_and_the_matrix_shows_the_models_numbers(browser, lm_page, tmp_path):
    page, view = lm_page
    driver = open_page(browser, page, tmp_path / "lm.html")
    run(driver, "await attnlabExplorer.select({view: 'model'});")
    cells = driver.find_elements("css selector", "#view-model canvas.cell")
    assert len(cells) == 3 * 4
    driver.save_screenshot(str(tmp_path / "model_view.png"))
    driver.find_element("css selector", "#view-model canvas.cell[data-layer='2'][data-head='3']").click()
    state = driver.execute_script("return attnlabExplorer.state")
    assert state["view"] == "head" and int(state["layer"]) == 2 and [int(h) for h in state["heads"]] == [3]
    assert driver.find_element("id", "layer").get_attribute("value") == "2"
    on = driver.execute_script("return Array.from(document.querySelectorAll('.head-chip.on')).map(c => c.dataset.head)")
    assert [int(h) for h in on] == [3]
    # the matrix view: a hovered cell's value is the weight, within the quantization step
    run(driver, "await attnlabExplorer.select({view: 'matrix', layer: 2, heads: [3]});")
    canvas = driver.find_element("id", "matrix-canvas")
    n = len(view.tokens)
    from selenium.webdriver.common.action_chains import ActionChains

    w, h = canvas.size["width"], canvas.size["height"]
    i, j = n - 1, 2
    ActionChains(driver).move_to_element_with_offset(canvas, int((j + 0.5) * w / n - w / 2),
                                                     int((i + 0.5) * h / n - h / 2)).perform()
    tip = driver.find_element("id", "tooltip").text
    value = float(tip.rsplit(":", 1)[1])
    assert abs(value - float(view.layers[2][1][3, i, j])) <= STEP + 0.0005  # shown with 3 decimals
    rows = driver.find_elements("css selector", "#head-table tr[data-layer]")
    assert len(rows) == 3 * 4
    driver.find_element("css selector", "#head-table th[data-key='previous']").click()
    driver.save_screenshot(str(tmp_path / "matrix_view.png"))
    assert errors(driver) == []


def test_the_language_model_view_shows_each_positions_next_tokens(browser, lm_page, tmp_path):
    page, view = lm_page
    driver = open_page(browser, page, tmp_path / "lm.html")
    run(driver, "await attnlabExplorer.select({view: 'lm'});")
    tokens = driver.find_elements("css selector", "#view-lm .lm-tok")
    assert len(tokens) == len(view.tokens)
    assert len(driver.find_elements("css selector", "#view-lm .lm-tok.generated")) == len(view.tokens) - view.prompt_len
    tokens[12].click()
    text = driver.find_element("id", "topk").text
    best, p = view.top[12][0]
    assert best in text and f"{p:.3f}" in text
    driver.save_screenshot(str(tmp_path / "lm_view.png"))
    assert errors(driver) == []


def test_the_image_view_follows_a_click_and_translation_shows_three_attentions(browser, tmp_path):
    run_dir = make_run(tmp_path / "vit", "vit-digits", ["model.options.depth=2"], image_model)
    driver = open_page(browser, explore(run_dir, max_inputs=1), tmp_path / "vit.html")
    run(driver, "await attnlabExplorer.select({view: 'image'});")
    canvas = driver.find_element("id", "image-canvas")
    before = canvas.get_attribute("data-query")
    from selenium.webdriver.common.action_chains import ActionChains

    ActionChains(driver).move_to_element_with_offset(canvas, canvas.size["width"] // 3,
                                                     canvas.size["height"] // 3).click().perform()
    after = canvas.get_attribute("data-query")
    assert after is not None and after != before
    driver.save_screenshot(str(tmp_path / "image_view.png"))
    assert errors(driver) == []

    src, tgt = ["ein", "mann", "fährt", "</s>"], ["a", "man", "rides", "</s>"]
    torch.manual_seed(0)
    view = AlignmentAttention("a translation", src, tgt, [torch.rand(2, 4, 4).softmax(-1)],
                              source_layers=[("enc.0", torch.rand(2, 4, 4).softmax(-1))],
                              target_layers=[("dec.0", torch.rand(2, 4, 4).softmax(-1).tril())],
                              layer_names=["dec.0.cross"])
    data = {"format": FORMAT, "title": "translation", "subtitle": "", "notes": [], "documents": [document_of(view)]}
    driver = open_page(browser, Exploration(data), tmp_path / "mt.html")
    run(driver, "await attnlabExplorer.select({view: 'translation'});")
    assert len(driver.find_elements("css selector", "#view-translation canvas")) >= 3
    driver.save_screenshot(str(tmp_path / "translation_view.png"))
    assert errors(driver) == []


def test_a_long_input_is_shown_in_pages(browser, tmp_path):
    torch.manual_seed(0)
    model = GPT(vocab_size=50, max_len=512, embed_dim=16, depth=2, num_heads=2).eval()
    ids = torch.randint(0, 50, (1, 300))
    driver = open_page(browser, explore(model, ids), tmp_path / "long.html")
    run(driver, "await attnlabExplorer.select({view: 'head', heads: [0, 1]});")
    lefts = driver.find_elements("css selector", "#view-head .tok-left")
    assert 0 < len(lefts) <= 64  # one page of positions, not 300
    assert "of 300" in driver.find_element("id", "page-label").text
    driver.find_element("id", "page-next").click()
    assert int(driver.execute_script("return attnlabExplorer.state.page")) == 1
    with capture_attention(model) as maps, torch.no_grad():
        model(ids)
    shown = torch.tensor(run(driver, "return Array.from(await attnlabExplorer.weights(0, 0, 1));")).reshape(2, 300, 300)
    assert (shown - maps["blocks.1.attn"][0][0]).abs().max() <= STEP
    assert errors(driver) == []


def test_a_long_token_ends_in_an_ellipsis_and_shows_whole_on_hover(browser, tmp_path):
    torch.manual_seed(0)
    model = GPT(vocab_size=26, max_len=64, embed_dim=16, depth=1, num_heads=2).eval()
    long = "incomprehensibilities-of-the-longest-token"
    names = [long if i == 4 else chr(ord("a") + i) for i in range(26)]
    view = generation_attention(model, [7, 4, 11, 11, 14], lambda i: names[i], new_tokens=2)
    data = {"format": FORMAT, "title": "long tokens", "subtitle": "", "notes": [], "documents": [document_of(view)]}
    driver = open_page(browser, Exploration(data), tmp_path / "long_tokens.html")
    k = view.tokens.index(long)
    # the matrix: the label is cut to fit, with an ellipsis; the others are whole
    run(driver, "await attnlabExplorer.select({view: 'matrix', layer: 0, heads: [0]});")
    labels = driver.execute_script("const m = document.querySelector('#view-matrix .axis-rows').labels;"
                                   "return {shown: m.shown, full: m.full, s: m.s};")
    assert labels["full"][k] == long and labels["shown"][k].endswith("…") and long.startswith(labels["shown"][k][:-1])
    assert [t for i, t in enumerate(labels["shown"]) if i != k] == [t for i, t in enumerate(view.tokens) if i != k]
    # hovering the cut label shows the token whole
    from selenium.webdriver.common.action_chains import ActionChains

    axis = driver.find_element("css selector", "#view-matrix .axis-rows")
    ActionChains(driver).move_to_element_with_offset(
        axis, 0, int((k + 0.5) * labels["s"] - axis.size["height"] / 2)).perform()
    assert driver.find_element("id", "tooltip").text == f"query {k}: {long}"
    # the head view: the token's box ends in an ellipsis (CSS), its title holds it whole
    run(driver, "await attnlabExplorer.select({view: 'head', layer: 0, heads: [0]});")
    cut, title = driver.execute_script(
        f"const t = document.querySelector('#view-head .tok-left[data-i=\"{k}\"]');"
        "return [t.scrollWidth > t.clientWidth, t.title];")
    assert cut and title == f"{k}: {long}"
    # the lines take the width the page leaves them, more than the least
    assert int(driver.find_element("id", "head-svg").get_attribute("width")) > 600
    assert errors(driver) == []


def test_the_heads_change_in_loss_sorts_and_shows_each_heads_figure(browser, tmp_path):
    from attnlab.viz.ablation import head_ablation

    torch.manual_seed(0)
    model = GPT(vocab_size=26, max_len=64, embed_dim=32, depth=2, num_heads=4).eval()
    letters = [chr(ord("a") + i) for i in range(26)]
    view = generation_attention(model, [7, 4, 11, 11, 14, 22, 14, 17, 11, 3], lambda i: letters[i], new_tokens=4)
    changes = head_ablation(model, torch.tensor([view.ids]), [name for name, _ in view.layers])
    page = Exploration({"format": FORMAT, "title": "ablation", "subtitle": "", "notes": [],
                        "documents": [document_of(view, changes)]})
    driver = open_page(browser, page, tmp_path / "ablation.html")
    run(driver, "await attnlabExplorer.select({view: 'matrix', layer: 0, heads: [0]});")  # the table beside it
    header = driver.find_element("css selector", "#head-table th[data-key='ablation']")
    header.click()
    header.click()  # largest first
    first = driver.find_element("css selector", "#head-table tbody tr[data-layer]")
    layer, head = int(first.get_attribute("data-layer")), int(first.get_attribute("data-head"))
    best = max((v, l, h) for l, row in enumerate(changes) for h, v in enumerate(row))
    assert (layer, head) == best[1:]
    cells = first.find_elements("css selector", "td")  # layer, head, role, six figures, then the change
    shown = cells[9].text
    roles = page.data["documents"][0]["groups"][0]["stats"]["roles"]
    assert cells[2].text == (roles[layer][head] or "–")  # the head's role, where a figure passes its threshold
    assert float(shown) == pytest.approx(best[0], abs=5e-4)
    assert errors(driver) == []


def test_the_head_view_and_the_matrix_are_saved_as_svg_and_png(browser, lm_page, tmp_path):
    import base64
    import io
    import xml.etree.ElementTree as ET

    from PIL import Image

    driver = open_page(browser, lm_page[0], tmp_path / "figures.html")
    run(driver, "await attnlabExplorer.select({view: 'head', layer: 0, heads: [0, 1]});")
    svg = run(driver, "return await attnlabExplorer.figure('svg');")
    root = ET.fromstring(svg)  # well-formed, whatever the tokens hold
    lines = root.findall(".//{http://www.w3.org/2000/svg}line")
    assert len(lines) == visible_lines(driver) > 0
    texts = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert all(tok in texts for tok in driver.execute_script(
        "return Array.from(document.querySelectorAll('#tokens-left .tok')).map(n => n.textContent)"))
    png = run(driver, "return await attnlabExplorer.figure('png');")
    image = Image.open(io.BytesIO(base64.b64decode(png.split(",", 1)[1])))
    assert image.size == (2 * int(root.get("width")), 2 * int(root.get("height")))
    run(driver, "await attnlabExplorer.select({view: 'matrix', heads: [0]});")
    matrix = ET.fromstring(run(driver, "return await attnlabExplorer.figure('svg');"))
    cells = matrix.findall(".//{http://www.w3.org/2000/svg}rect")
    assert len(cells) > 10  # one square a weight that is not 0, beside the background and the frame
    assert not driver.find_element("id", "figure-control").get_attribute("hidden")
    run(driver, "await attnlabExplorer.select({view: 'model'});")
    assert driver.find_element("id", "figure-control").get_attribute("hidden")
    assert errors(driver) == []
