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
from attnlab.run.views import AlignmentAttention
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
    import base64
    import io
    import xml.etree.ElementTree as ET

    from PIL import Image

    figure = ET.fromstring(run(driver, "return await attnlabExplorer.figure('svg');"))
    [picture] = figure.findall(".//{http://www.w3.org/2000/svg}image")
    assert picture.get("href").startswith("data:image/png;base64,")
    caption = driver.find_element("id", "image-caption").text
    words = " ".join(t.text for t in figure.iter("{http://www.w3.org/2000/svg}text"))
    assert caption.split()[0] in words and caption.split()[-1] in words  # the caption, wrapped
    png = run(driver, "return await attnlabExplorer.figure('png');")
    pixels = Image.open(io.BytesIO(base64.b64decode(png.split(",", 1)[1]))).convert("RGB")
    assert pixels.size == (2 * int(figure.get("width")), 2 * int(figure.get("height")))
    x, y, w, h = (round(2 * float(picture.get(k))) for k in ("x", "y", "width", "height"))
    inside = pixels.crop((x + 2, y + 2, x + w - 2, y + h - 2)).getcolors(maxcolors=1 << 24)
    assert len(inside) > 4  # the picture drawn into the PNG, tinted patches and all, not a blank square
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


def test_the_head_view_model_view_and_matrix_are_saved_as_svg_and_png(browser, lm_page, tmp_path):
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
    assert not driver.find_element("id", "figure-control").get_attribute("hidden")
    model = ET.fromstring(run(driver, "return await attnlabExplorer.figure('svg');"))
    document = lm_page[0].data["documents"][0]
    group = document["groups"][0]
    thumbs = model.findall(".//{http://www.w3.org/2000/svg}image")
    assert len(thumbs) == sum(layer["heads"] for layer in group["layers"])  # every head of every layer
    assert all(th.get("href").startswith("data:image/png;base64,") for th in thumbs)
    names = [t.text for t in model.iter("{http://www.w3.org/2000/svg}text")]
    assert all(f"{l}: {layer['name']}" in names for l, layer in enumerate(group["layers"]))
    png = run(driver, "return await attnlabExplorer.figure('png');")
    pixels = Image.open(io.BytesIO(base64.b64decode(png.split(",", 1)[1]))).convert("RGB")
    assert pixels.size == (2 * int(model.get("width")), 2 * int(model.get("height")))
    for thumb in thumbs[:3]:  # each thumbnail drawn into the PNG, not a blank square
        x, y, w, h = (round(2 * float(thumb.get(k))) for k in ("x", "y", "width", "height"))
        assert len(pixels.crop((x + 2, y + 2, x + w - 2, y + h - 2)).getcolors(maxcolors=1 << 24)) > 1
    assert document.get("lm")  # a view without a figure hides the control
    run(driver, "await attnlabExplorer.select({view: 'lm'});")
    assert driver.find_element("id", "figure-control").get_attribute("hidden")
    assert errors(driver) == []


# ----------------------------------------------------------------------------- English and Chinese
def page_texts(driver):
    """What the page says in a few of its places: a tab, control labels, a column's tooltip, captions."""
    return driver.execute_script(
        "const text = (q) => document.querySelector(q).textContent;"
        "return {tab: text('.tab[data-view=head]'), matrixTab: text('.tab[data-view=matrix]'),"
        " layer: text('[data-t=layer]'), heads: text('[data-t=heads]'), threshold: text('[data-t=threshold]'),"
        " entropy: document.querySelector('#head-table th[data-key=entropy]').title,"
        " caption: text('#matrix-title'), button: text('#lang'), lang: attnlabExplorer.state.lang,"
        " html: document.documentElement.lang};")


def test_switching_to_chinese_relabels_the_tabs_controls_and_captions_and_back(browser, lm_page, tmp_path):
    from selenium.webdriver.support.ui import WebDriverWait

    driver = open_page(browser, lm_page[0], tmp_path / "lang.html")
    run(driver, "await attnlabExplorer.select({view: 'matrix', layer: 1, heads: [2]});")
    english = page_texts(driver)
    assert english == {
        "tab": "head view", "matrixTab": "matrix", "layer": "layer", "heads": "heads", "threshold": "threshold",
        "entropy": "spread of a query's weights, in bits: 0 = all on one key",
        "caption": "self-attention, layer 1 (blocks.1.attn), head 2: queries as rows, keys as columns. "
                   "Hover for values.",
        "button": "中文", "lang": "en", "html": "en"}
    run(driver, "await attnlabExplorer.setLanguage('zh');")
    chinese = page_texts(driver)
    assert chinese == {
        "tab": "头视图", "matrixTab": "注意力矩阵", "layer": "层", "heads": "注意力头", "threshold": "阈值",
        "entropy": "熵 (entropy)：一个查询的权重有多分散，单位是比特；0 表示全部权重落在一个键上",
        "caption": "自注意力，第 1 层（blocks.1.attn），头 2：行是查询，列是键。鼠标移到格子上可以看到数值。",
        "button": "English", "lang": "zh", "html": "zh-CN"}
    assert driver.find_element("css selector", "#head-table th[data-key=role]").text == "角色"
    driver.save_screenshot(str(tmp_path / "matrix_view_zh.png"))
    # the head view's caption follows; the page's own button switches back
    run(driver, "await attnlabExplorer.select({view: 'head', heads: [0, 2]});")
    assert "条连线：第 1 层，头 0、2" in driver.find_element("id", "lines-info").text
    driver.find_element("id", "lang").click()
    WebDriverWait(driver, 10).until(lambda d: d.execute_script("return document.body.dataset.ready") == "1")
    run(driver, "await attnlabExplorer.select({view: 'matrix', layer: 1, heads: [2]});")
    assert page_texts(driver) == english
    assert run(driver, "attnlabExplorer.setLanguage('fr');")["error"] == \
        'Error: language must be one of en, zh; got "fr"'
    assert errors(driver) == []


def test_a_page_explored_in_chinese_opens_in_chinese(browser, tmp_path):
    run_dir = make_run(tmp_path / "vit", "vit-digits", ["model.options.depth=2"], image_model)
    driver = open_page(browser, explore(run_dir, max_inputs=1, lang="zh"), tmp_path / "vit_zh.html")
    assert driver.execute_script("return attnlabExplorer.state.lang") == "zh"
    assert driver.find_element("css selector", ".tab[data-view=image]").text == "图像"
    run(driver, "await attnlabExplorer.select({view: 'image', layer: 0, heads: [0]});")
    caption = driver.find_element("id", "image-caption").text
    assert caption.startswith("查询 0「[CLS]」的自注意力（第 0 层 ") and "，头 0）" in caption
    assert "分布在 4×4 个图块上" in caption and caption.endswith("点击一个图块，把它设为查询。")
    assert [o.text for o in driver.find_elements("css selector", "#image-source option")] == \
        ["选中头的平均", "注意力展开 (rollout)"]
    driver.save_screenshot(str(tmp_path / "image_view_zh.png"))
    assert errors(driver) == []


# ----------------------------------------------------------------------------- the horizontal head view
SENTENCE = ["我们", "用", "注意力", "机制", "让", "模型", "在", "生成", "每", "一个", "词元", "时", "，", "关注", "输入",
            "里", "最", "相关", "的", "部分", "。", "这", "是", "Transformer", "的", "核心", "思想", "：", "查询", "和",
            "键", "的", "点积", "经过", "softmax", "变成", "权重", "，", "再", "对", "值", "加权", "求和", "。"]


def token_boxes(driver, row):
    return driver.execute_script(
        "return Array.from(document.getElementById(arguments[0]).children, n => {"
        " const r = n.getBoundingClientRect();"
        " return {text: n.textContent, left: r.left, right: r.right, top: r.top, bottom: r.bottom,"
        "  width: r.width, height: r.height, cut: n.scrollWidth > n.clientWidth}; });", row)


def test_the_horizontal_head_view_shows_every_chinese_token_in_its_own_box(browser, tmp_path):
    from selenium.webdriver.common.action_chains import ActionChains

    torch.manual_seed(0)
    model = GPT(vocab_size=64, max_len=64, embed_dim=16, depth=2, num_heads=2).eval()
    ids = torch.randint(0, 64, (1, len(SENTENCE)))
    driver = open_page(browser, explore(model, ids, tokens=[SENTENCE], lang="zh"), tmp_path / "zh.html")
    assert driver.find_element("id", "head-layout").get_attribute("value") == "vertical"  # the default stays
    run(driver, "await attnlabExplorer.select({view: 'head', layer: 1, heads: [0, 1], layout: 'horizontal'});")
    assert driver.execute_script("return attnlabExplorer.state.layout") == "horizontal"
    assert driver.find_element("id", "head-layout").get_attribute("value") == "horizontal"
    queries, keys = token_boxes(driver, "tokens-left"), token_boxes(driver, "tokens-right")
    for row in (queries, keys):
        assert [b["text"] for b in row] == SENTENCE  # every token, whole and upright
        assert all(b["width"] > 0 and b["height"] > 0 and not b["cut"] for b in row)
        assert all(a["right"] <= b["left"] for a, b in zip(row, row[1:]))  # left to right, none overlapping
        assert len({round(b["top"]) for b in row}) == 1  # one row
    assert queries[0]["bottom"] < keys[0]["top"]  # the queries above the keys
    wide, seen = driver.execute_script("const v = document.getElementById('head-view');"
                                       "return [v.scrollWidth, v.clientWidth]")
    assert wide > seen  # wider than the page: it scrolls sideways
    # a line per weight at or above the threshold, from the middle of its query's box to its key's
    shown = torch.tensor(run(driver, "return Array.from(await attnlabExplorer.weights(0, 0, 1));"))
    shown = shown.reshape(2, len(SENTENCE), len(SENTENCE))
    threshold = float(driver.find_element("id", "threshold").get_attribute("value"))
    assert visible_lines(driver) == int((shown >= threshold - 1e-9).sum()) > 0
    offsets = driver.execute_script(
        "const svg = document.getElementById('head-svg').getBoundingClientRect();"
        "const mid = (q) => { const r = document.querySelector(q).getBoundingClientRect();"
        " return r.left + r.width / 2; };"
        "return Array.from(document.querySelectorAll('#head-svg line'), l => ["
        " svg.left + Number(l.getAttribute('x1')) - mid(`.tok-left[data-i=\"${l.dataset.q}\"]`),"
        " svg.left + Number(l.getAttribute('x2')) - mid(`.tok-right[data-j=\"${l.dataset.k}\"]`)]);")
    assert max(abs(x) for pair in offsets for x in pair) < 1
    # hovering a key keeps its lines only
    token = driver.find_element("css selector", ".tok-right[data-j='23']")  # "Transformer"
    ActionChains(driver).move_to_element(token).perform()
    assert visible_lines(driver) == int((shown[:, :, 23] >= threshold - 1e-9).sum())
    ActionChains(driver).move_to_element(driver.find_element("tag name", "h1")).perform()
    driver.save_screenshot(str(tmp_path / "head_view_horizontal_zh.png"))
    assert errors(driver) == []


def test_the_horizontal_head_view_is_saved_with_its_chinese_tokens_as_text(browser, tmp_path):
    import base64
    import io
    import xml.etree.ElementTree as ET

    from PIL import Image

    torch.manual_seed(0)
    model = GPT(vocab_size=64, max_len=64, embed_dim=16, depth=1, num_heads=2).eval()
    ids = torch.randint(0, 64, (1, len(SENTENCE)))
    driver = open_page(browser, explore(model, ids, tokens=[SENTENCE], lang="zh"), tmp_path / "zh_figure.html")
    run(driver, "await attnlabExplorer.select({view: 'head', heads: [0, 1], layout: 'horizontal'});")
    svg = run(driver, "return await attnlabExplorer.figure('svg');")
    root = ET.fromstring(svg)
    ns = "{http://www.w3.org/2000/svg}"
    texts = [t.text for t in root.iter(f"{ns}text")]
    assert texts[0].endswith("条连线：第 0 层，头 0、1 中权重 ≥ 0.051 的部分。")  # the caption, no hover hint
    assert texts[1:] == SENTENCE + SENTENCE  # the query row, then the key row
    assert len(root.findall(f".//{ns}line")) == visible_lines(driver) > 0
    # the query boxes in a row above the key boxes, none overlapping
    boxes = [(float(r.get("x")), float(r.get("y")), float(r.get("width"))) for r in root.iter(f"{ns}rect")
             if r.get("rx")]
    top, bottom = boxes[: len(SENTENCE)], boxes[len(SENTENCE):]
    assert len(bottom) == len(SENTENCE) and top[0][1] < bottom[0][1]
    assert all(a[0] + a[2] <= b[0] for row in (top, bottom) for a, b in zip(row, row[1:]))
    png = run(driver, "return await attnlabExplorer.figure('png');")
    image = Image.open(io.BytesIO(base64.b64decode(png.split(",", 1)[1])))
    assert image.size == (2 * int(float(root.get("width"))), 2 * int(float(root.get("height"))))
    assert errors(driver) == []
