/* attnlab lab: the page's side of the lab server (attnlab/lab/server.py). It sends the text typed,
 * the sampling settings, the heads switched off and the head to step through; every answer is
 * shown in place (the explorer's views through window.attnlabExplorer.load). Requests carry the
 * token of the page's URL; a newer edit makes the answers to older ones stale, and they are dropped.
 */
"use strict";
(() => {
  const $ = (id) => document.getElementById(id);
  const config = JSON.parse($("lab-config").textContent);
  const token = new URLSearchParams(location.search).get("token") || "";
  const explorer = window.attnlabExplorer;

  const TEXTS = {
    en: {
      model: "model", type: "Type a sentence (English or Chinese); every view follows it.", next: "Next token",
      temperature: "temperature", topk: "top-k", topp: "top-p", append: "append the chosen token",
      generate: "generate 10 tokens, one by one", off: "Switch heads off",
      offhelp: "Click a head to remove its output: the next-token candidates and the loss on the text change at once.",
      offclear: "switch every head on", step: "One head, step by step",
      stephelp: "The head chosen in the explorer's controls below (its layer and first selected head); click a token to make it the query.",
      limit: (c, t) => `At most ${c.toLocaleString()} characters and ${t} tokens.`,
      loss: (l, n, off) => `loss on the text: ${l} nats a token over ${n} tokens` + (off ? `, ${off} heads off` : ""),
      busy: "computing…", ready: (s) => `updated in ${s} s`, greedy: "greedy: the most probable token",
      layer: "layer", token: "token", dot: "q·k", scaled: "× scale", capped: "soft-capped", bias: "+ ALiBi",
      weight: "weight", blocked: "masked", lang: "中文",
      formula: (d, scale) => `weights = softmax(q·k × ${scale.toPrecision(4)}) over the keys the mask leaves (1/√${d} = ${(1 / Math.sqrt(d)).toPrecision(4)})`,
      query: "query vector q", output: "output = Σ weight × v", sink: (w) => `the sink takes ${w}`,
      compare: "beside it", none: "none", side: "Two models on the same text",
      sidehelp: "The layer and heads chosen in the explorer's controls, in each model (its last layer if it has fewer).",
      sideloss: (l) => `loss on the text: ${l} nats a token`,
      upload: "Choose an image, or drop one here: its patches, each head's attention and the rollout over the pixels.",
      imagelimit: (b, s) => `At most ${(b / 1048576).toFixed(0)} MB and ${s}×${s} pixels; the model reads it at its own size.`,
      toolarge: (n, b) => `the file has ${n.toLocaleString()} bytes; the lab takes at most ${b.toLocaleString()}`,
    },
    zh: {
      model: "模型", type: "输入一句话（中文或英文），所有视图都会随之更新。", next: "下一个词元（token）",
      temperature: "温度（temperature）", topk: "top-k", topp: "top-p", append: "把选中的词元接到句子后面",
      generate: "逐个生成 10 个词元", off: "关掉注意力头",
      offhelp: "点击一个头，去掉它的输出：下一个词元的候选和整句的损失会立刻变化。",
      offclear: "重新打开所有的头", step: "一步一步算一个头",
      stephelp: "用下方浏览器控件里选中的层和第一个选中的头；点击一个词元，把它当作查询（query）。",
      limit: (c, t) => `最多 ${c.toLocaleString()} 个字符、${t} 个词元。`,
      loss: (l, n, off) => `整句的损失：${n} 个词元，平均每个 ${l} nats` + (off ? `，关掉了 ${off} 个头` : ""),
      busy: "计算中…", ready: (s) => `用时 ${s} 秒`, greedy: "贪心：取概率最大的词元",
      layer: "层", token: "词元", dot: "q·k", scaled: "× 缩放", capped: "软截断后", bias: "+ ALiBi",
      weight: "权重", blocked: "被遮住", lang: "English",
      formula: (d, scale) => `权重 = softmax(q·k × ${scale.toPrecision(4)})，只在掩码（mask）留下的键上计算（1/√${d} = ${(1 / Math.sqrt(d)).toPrecision(4)}）`,
      query: "查询向量 q", output: "输出 = Σ 权重 × v", sink: (w) => `sink 分走了 ${w}`,
      compare: "并排对比", none: "不对比", side: "两个模型读同一句话",
      sidehelp: "用浏览器控件里选中的层和头，两个模型各画一张（层数较少的模型取它的最后一层）。",
      sideloss: (l) => `整句的损失：平均每个词元 ${l} nats`,
      upload: "选一张图片，或者把图片拖到这里：看它被切成的图块、每个头的注意力，以及整张图上的注意力展开（rollout）。",
      imagelimit: (b, s) => `文件不超过 ${(b / 1048576).toFixed(0)} MB，边长不超过 ${s} 像素；模型会把它缩放到自己的输入大小。`,
      toolarge: (n, b) => `文件有 ${n.toLocaleString()} 字节，实验室最多接受 ${b.toLocaleString()} 字节`,
    },
  };
  const PAUSE = 150;  // ms after the last key before the page asks (a typist's pause)
  const lab = { lang: "en", model: 0, compare: null, side: [], text: config.text, off: new Set(), chosen: 0, query: null, seq: 0,
                candidates: [], layers: 0, heads: [], queries: 0 };
  const t = (key, ...args) => { const v = TEXTS[lab.lang][key]; return typeof v === "function" ? v(...args) : v; };

  function el(tag, props = {}, children = []) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(props)) {
      if (k === "text") node.textContent = v;
      else if (k === "dataset") Object.assign(node.dataset, v);
      else node[k] = v;
    }
    node.append(...children);
    return node;
  }

  /** An image model's page data: the image chosen in the page, else the picture the lab opens with. */
  async function analyzeImage(model) {
    if (!lab.image) return post("/api/first", { model });
    const res = await fetch(`/api/image?model=${model}`, {
      method: "POST", headers: { "Content-Type": "application/octet-stream", "X-Lab-Token": token }, body: lab.image,
    });
    const answer = await res.json().catch(() => ({ error: `${res.status} ${res.statusText}` }));
    if (!res.ok) throw new Error(answer.error || `${res.status}`);
    return answer;
  }

  const reads = (model = lab.model) => config.models[model].reads;

  async function post(path, body) {
    const res = await fetch(path, {
      method: "POST", headers: { "Content-Type": "application/json", "X-Lab-Token": token },
      body: JSON.stringify({ model: lab.model, ...body }),
    });
    const answer = await res.json().catch(() => ({ error: `${res.status} ${res.statusText}` }));
    if (!res.ok) throw new Error(answer.error || `${res.status}`);
    return answer;
  }

  function showError(err) {
    const box = $("error");
    box.textContent = `Error: ${err.message || err}`;
    box.hidden = false;
  }

  const decoder = () => Boolean(config.models[lab.model] && config.models[lab.model].decoder);

  // ------------------------------------------------------------------ the text and the views
  let timer = 0;
  function edited() {
    clearTimeout(timer);
    timer = setTimeout(() => refresh(), PAUSE);
  }

  /** Every view after an edit (or a model's change): the explorer's data, then the decoder's panels. */
  async function refresh() {
    const seq = ++lab.seq;
    const text = $("lab-text").value;
    lab.text = text;
    if (reads() === "texts" && !text.trim()) return;
    document.body.dataset.labReady = "0";
    $("lab-status").textContent = t("busy");
    const start = performance.now();
    try {
      // the analysis first: its pass keeps what the next token and the step need, which then cost no pass
      const data = reads() === "images" ? await analyzeImage(lab.model) : await post("/api/analyze", { text });
      if (seq !== lab.seq) return;
      const others = decoder() ? [refreshNext(seq), refreshStep(seq, true)] : [];
      await explorer.load(data);
      await showImageView(data);
      syncShape(data);
      await Promise.all(others);
      if (seq !== lab.seq) return;
      await refreshSide(seq, data);
      if (seq !== lab.seq) return;
      $("lab-status").textContent = t("ready", ((performance.now() - start) / 1000).toFixed(2));
      $("error").hidden = true;
    } catch (err) {
      if (seq === lab.seq) showError(err);
    } finally {
      if (seq === lab.seq) {
        lab.readyAt = performance.now();  // when every view of this edit was drawn (the benchmark reads it)
        document.body.dataset.labReady = "1";
      }
    }
  }

  /** An image's page opens on its image view (the patches over the pixels) when the lab moves to an image model. */
  async function showImageView(data) {
    const image = Boolean(data.documents[0].image);
    const title = data.documents[0].title;  // a run's prediction: "your image -> 7 (0.93)", shown with the file's name
    $("lab-image-title").textContent = !image ? "" : lab.image && title.startsWith("your image")
      ? lab.image.name + title.slice("your image".length) : title;
    if (image && !lab.showedImage) await explorer.select({ view: "image" });
    lab.showedImage = image;
  }

  /** The layers and heads of the data shown: the heads-off grid and the query tokens follow them. */
  function syncShape(data) {
    const group = data.documents[0].groups[0];
    const heads = group.layers.map((layer) => layer.heads);
    const key = heads.join(",");
    if (key !== lab.heads.join(",")) {
      lab.heads = heads;
      lab.off.clear();
      drawOffGrid();
    }
    drawQueries(group.queries);
  }

  // ------------------------------------------------------------------ next token
  function sampling() {
    const temperature = Number($("lab-temperature").value);
    const topk = Number($("lab-topk").value);
    const topp = Number($("lab-topp").value);
    return { temperature, top_k: temperature > 0 && topk > 0 ? topk : null, top_p: temperature > 0 && topp < 1 ? topp : null };
  }

  async function refreshNext(seq = lab.seq) {
    if (!decoder()) return;
    const off = [...lab.off].map((k) => k.split("/").map(Number));
    const answer = await post("/api/next", { text: lab.text, off, ...sampling() });
    if (seq !== lab.seq) return;
    lab.candidates = answer.candidates;
    lab.chosen = 0;
    $("lab-loss").textContent = answer.loss === null ? "" : t("loss", answer.loss.toFixed(4), answer.tokens, off.length);
    drawCandidates();
  }

  function drawCandidates() {
    const rows = lab.candidates.map((c, i) => el("tr", { className: i === lab.chosen ? "chosen" : "", dataset: { i: String(i) } }, [
      el("td", { className: "tok", text: JSON.stringify(c.token).slice(1, -1) }),
      el("td", { text: (100 * c.prob).toFixed(2) + "%" }),
      el("td", {}, [el("span", { className: "bar", style: "" })]),
    ]));
    rows.forEach((row, i) => { row.querySelector(".bar").style.width = `${Math.round(120 * lab.candidates[i].prob)}px`; });
    $("lab-candidates").replaceChildren(...rows);
  }

  /** The token to append: the most probable when greedy, else one drawn from the candidates' probabilities. */
  function pick() {
    if (!lab.candidates.length) return null;
    if (Number($("lab-temperature").value) === 0) return lab.candidates[lab.chosen];
    let r = Math.random() * lab.candidates.reduce((s, c) => s + c.prob, 0);
    for (const c of lab.candidates) { r -= c.prob; if (r <= 0) return c; }
    return lab.candidates[lab.candidates.length - 1];
  }

  async function append(times = 1) {
    for (let n = 0; n < times; n++) {
      const chosen = pick();
      if (!chosen) return;
      $("lab-text").value += chosen.token;
      await refresh();
    }
  }

  // ------------------------------------------------------------------ heads off
  function drawOffGrid() {
    const grid = $("lab-off");
    const most = Math.max(1, ...lab.heads);
    grid.style.gridTemplateColumns = `auto repeat(${most}, auto)`;
    const cells = [];
    lab.heads.forEach((count, layer) => {
      cells.push(el("span", { className: "row-label", text: `${t("layer")} ${layer}` }));
      for (let h = 0; h < most; h++) {
        cells.push(h < count
          ? el("button", { type: "button", text: String(h), title: `${t("layer")} ${layer}, head ${h}`, dataset: { key: `${layer}/${h}` } })
          : el("span"));
      }
    });
    grid.replaceChildren(...cells);
  }

  function toggleHead(button) {
    const key = button.dataset.key;
    if (lab.off.has(key)) lab.off.delete(key); else lab.off.add(key);
    button.classList.toggle("off", lab.off.has(key));
    return refreshNext().catch(showError);
  }

  // ------------------------------------------------------------------ one head, step by step
  function drawQueries(tokens) {
    lab.queries = tokens.length;
    if (lab.query === null || lab.query >= tokens.length) lab.query = tokens.length - 1;
    $("lab-queries").replaceChildren(...tokens.map((tok, i) => el("button", {
      type: "button", text: tok, className: i === lab.query ? "on" : "", dataset: { i: String(i) },
    })));
  }

  async function refreshStep(seq = lab.seq, edited = false) {
    if (!decoder()) return;
    if (edited) lab.query = null;  // a new text: its last token is the query (-1), as drawQueries then shows
    const layer = explorer.state.layer, head = explorer.state.heads[0] ?? 0;
    let step;
    try {
      step = await post("/api/step", { text: lab.text, layer, head, query: lab.query ?? -1 });
    } catch (err) {  // a layer whose heads have no such steps (a kind of attention other than softmax's)
      if (seq === lab.seq) $("lab-step").replaceChildren(el("p", { className: "caption", text: err.message }));
      return;
    }
    if (seq === lab.seq) drawStep(step);
  }

  const num = (v) => (v === null || v === undefined ? "−∞" : Number(v).toPrecision(4));
  const vec = (v, n = 8) => `[${v.slice(0, n).map((x) => Number(x).toFixed(3)).join(", ")}${v.length > n ? ", …" : ""}] (${v.length})`;

  function drawStep(s) {
    const head = [el("th", { text: t("token") }), el("th", { text: t("dot") }), el("th", { text: t("scaled") })];
    if (s.capped) head.push(el("th", { text: t("capped") }));
    if (s.alibi) head.push(el("th", { text: t("bias") }));
    head.push(el("th", { text: t("weight") }));
    const rows = s.tokens.map((tok, j) => {
      const cells = [el("td", { className: "tok", text: `${j}: ${tok}` }), el("td", { text: num(s.dots[j]) }),
                     el("td", { text: num(s.scaled[j]) })];
      if (s.capped) cells.push(el("td", { text: num(s.capped[j]) }));
      if (s.alibi) cells.push(el("td", { text: num(s.alibi[j]) }));
      cells.push(el("td", { text: s.allowed[j] ? num(s.weights[j]) : t("blocked") }));
      return el("tr", { className: s.allowed[j] ? "" : "blocked" }, cells);
    });
    $("lab-step").replaceChildren(
      el("p", { className: "formula", text: `${s.layer_name}, head ${s.head} (key/value head ${s.kv_head}), query ${s.query}: ${s.tokens[s.query]}` }),
      el("p", { className: "formula", text: t("formula", s.head_dim, s.scale) }),
      el("p", { className: "vector", text: `${t("query")} = ${vec(s.query_vector)}` }),
      el("table", {}, [el("thead", {}, [el("tr", {}, head)]), el("tbody", {}, rows)]),
      ...(s.sink_weight !== null ? [el("p", { className: "formula", text: t("sink", num(s.sink_weight)) })] : []),
      el("p", { className: "vector", text: `${t("output")} = ${vec(s.output)}` }),
    );
  }

  // ------------------------------------------------------------------ two models side by side
  /** The chosen model and the one beside it on the same text: each one's loss, its best next tokens and
   * the explorer's layer and heads as a matrix. */
  async function refreshSide(seq = lab.seq, data = explorer.current()) {
    $("lab-side").hidden = lab.compare === null;
    if (lab.compare === null) return;
    const models = [lab.model, lab.compare];
    const answers = [];
    for (const model of models) {  // one after the other: each model's own lock, and the page's order
      const analyzed = model === lab.model ? data
        : reads(model) === "images" ? await analyzeImage(model) : await post("/api/analyze", { text: lab.text, model });
      const next = config.models[model].decoder ? await post("/api/next", { text: lab.text, model }) : null;
      answers.push({ model, analyzed, next });
    }
    if (seq !== lab.seq) return;
    lab.side = answers;
    await drawSide();
  }

  async function drawSide() {
    const columns = [];
    for (const { model, analyzed, next } of lab.side) {
      const canvas = el("canvas", { className: "matrix" });
      const box = el("div", { className: "lab-box" }, [
        el("h3", { text: config.models[model].name }),
        el("p", { className: "caption", text: next && next.loss !== null ? t("sideloss", next.loss.toFixed(4)) : "" }),
        el("p", { className: "caption side-next", text: next ? next.candidates.slice(0, 5).map((c) => `${JSON.stringify(c.token)} ${(100 * c.prob).toFixed(1)}%`).join("  ") : "" }),
        el("div", { className: "scroll" }, [el("div", { className: "matrix-frame" }, [canvas])]),
      ]);
      columns.push(box);
      box.dataset.model = String(model);
      box.canvas = canvas;
      box.analyzed = analyzed;
    }
    $("lab-side-columns").replaceChildren(...columns);
    for (const box of columns) {
      const shown = await explorer.drawMatrixOf(box.analyzed, explorer.state.layer, explorer.state.heads, box.canvas);
      box.querySelector("h3").textContent += ` · ${shown.layer}, head${shown.heads.length > 1 ? "s" : ""} ${shown.heads.join(", ")}`;
    }
  }

  // ------------------------------------------------------------------ language
  function setLanguage(lang) {
    lab.lang = lang;
    if (explorer.state.lang !== lang) explorer.setLanguage(lang).catch(showError);  // the views' own texts
    document.documentElement.lang = lang === "zh" ? "zh-CN" : "en";
    for (const node of document.querySelectorAll("#lab [data-t]")) node.textContent = t(node.dataset.t);
    $("lab-lang").textContent = t("lang");
    $("lab-limit").textContent = t("limit", config.max_chars, config.max_tokens);
    const compare = $("lab-compare").value;
    syncCompare(compare);
    $("lab-image-limit").textContent = t("imagelimit", config.max_image_bytes, config.max_image_side);
    if (lab.heads.length) drawOffGrid();
    drawCandidates();
  }

  /** The models that can stand beside the chosen one: those reading the same kind of input. */
  function syncCompare(keep = $("lab-compare").value) {
    const others = config.models.map((m, i) => [m, i]).filter(([m, i]) => i !== lab.model && m.reads === reads());
    $("lab-compare").replaceChildren(el("option", { value: "", text: t("none") }),
      ...others.map(([m, i]) => el("option", { value: String(i), text: m.name })));
    $("lab-compare").value = others.some(([, i]) => String(i) === keep) ? keep : "";
    lab.compare = $("lab-compare").value === "" ? null : Number($("lab-compare").value);
    $("lab-compare-control").hidden = others.length === 0;
  }

  /** The input box of the chosen model's kind: a text box, or an image to upload. */
  function syncInput() {
    $("lab-text-box").hidden = reads() !== "texts";
    $("lab-image-box").hidden = reads() !== "images";
    $("lab-decoder").hidden = !decoder();
  }

  function chooseImage(file) {
    if (!file) return;
    if (file.size > config.max_image_bytes) { showError(new Error(t("toolarge", file.size, config.max_image_bytes))); return; }
    lab.image = file;
    refresh();
  }

  // ------------------------------------------------------------------ start
  function start() {
    $("lab-model").replaceChildren(...config.models.map((m, i) => el("option", { value: String(i), text: m.name })));
    $("lab-text").value = config.text;
    $("lab-text").maxLength = config.max_chars;
    syncInput();
    $("lab-text").addEventListener("input", edited);
    $("lab-model").addEventListener("change", () => {
      lab.model = Number($("lab-model").value);
      syncInput();
      syncCompare();
      lab.heads = [];
      refresh();
    });
    $("lab-image").addEventListener("change", () => chooseImage($("lab-image").files[0]));
    const drop = $("lab-image-box");
    drop.addEventListener("dragover", (e) => { e.preventDefault(); drop.classList.add("over"); });
    drop.addEventListener("dragleave", () => drop.classList.remove("over"));
    drop.addEventListener("drop", (e) => {
      e.preventDefault();
      drop.classList.remove("over");
      chooseImage(e.dataTransfer.files[0]);
    });
    $("lab-compare").addEventListener("change", () => {
      const value = $("lab-compare").value;
      lab.compare = value === "" ? null : Number(value);
      refreshSide().catch(showError);
    });
    for (const id of ["lab-temperature", "lab-topk", "lab-topp"]) {
      $(id).addEventListener("input", () => {
        $(`${id}-v`).textContent = $(id).value;
        clearTimeout(timer);
        timer = setTimeout(() => refreshNext().catch(showError), 150);
      });
    }
    $("lab-candidates").addEventListener("click", (e) => {
      const row = e.target.closest("tr[data-i]");
      if (row) { lab.chosen = Number(row.dataset.i); drawCandidates(); }
    });
    $("lab-append").addEventListener("click", () => append(1));
    $("lab-generate").addEventListener("click", () => append(10));
    $("lab-off").addEventListener("click", (e) => { const b = e.target.closest("button[data-key]"); if (b) toggleHead(b); });
    $("lab-off-clear").addEventListener("click", () => {
      lab.off.clear();
      for (const b of $("lab-off").querySelectorAll("button.off")) b.classList.remove("off");
      refreshNext().catch(showError);
    });
    $("lab-queries").addEventListener("click", (e) => {
      const b = e.target.closest("button[data-i]");
      if (!b) return;
      lab.query = Number(b.dataset.i);
      for (const x of $("lab-queries").children) x.classList.toggle("on", x === b);
      refreshStep().catch(showError);
    });
    // the explorer's own layer and head choice is the head stepped through
    const followHead = () => setTimeout(() => {
      refreshStep().catch(showError);
      if (lab.side.length) drawSide().catch(showError);
    }, 0);
    for (const id of ["layer", "heads"]) $(id).addEventListener("click", followHead);
    $("layer").addEventListener("change", followHead);
    $("lab-lang").addEventListener("click", () => setLanguage(lab.lang === "en" ? "zh" : "en"));
    setLanguage("en");
    const data = explorer.current();
    showImageView(data).catch(showError);
    syncShape(data);
    if (decoder()) Promise.all([refreshNext(), refreshStep()]).catch(showError).finally(() => { document.body.dataset.labReady = "1"; });
    else document.body.dataset.labReady = "1";
  }

  window.attnlabLab = { state: lab, pause: PAUSE, refresh, refreshNext, refreshStep, refreshSide, append };
  explorer.ready.then(start).catch(showError);
})();
