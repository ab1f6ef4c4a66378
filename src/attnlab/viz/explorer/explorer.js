/* attnlab attention explorer: draws the attention weights held in the page's data element
 * (format "attnlab-explorer/1", defined in page.py) in six views. Plain script, no libraries,
 * nothing fetched: the page works from file://.
 *
 * Weights are one byte a value (weight = byte / 255), row-major (heads, Lq, Lk) per layer,
 * zlib-compressed and base64-encoded. A layer is inflated the first time a view needs it and
 * kept (as bytes) for the rest of the session.
 */
"use strict";
(() => {
  const PAGE = 64;          // head view: positions a page
  const ROW = 20;           // head view: px a token row (explorer.css: --row)
  const SVG_WIDTH = 240;    // head view: the least px between the two token columns
  const SVG_MAX = 960;      // head view: the most; between the two, the lines take the width the page has
  const LABEL_PX = 110;     // matrices: the widest token label, in px (longer ones end in an ellipsis)
  const MAX_LINES = 8000;   // head view: at most this many lines (the strongest) in one drawing
  const THUMB = 72;         // model view: px a thumbnail
  const MATRIX_PX = 640;    // matrix view: the map's target size in px
  const PANEL_PX = 360;     // translation view: each map's target size in px
  const MAX_LABELS = 64;    // matrices label an axis of at most this many tokens
  const BOX_MAX = 180;       // head view, horizontal: the widest token box in px (explorer.css: .tok max-width)
  const BOX_GAP = 4;         // head view, horizontal: px between two token boxes (explorer.css: .horizontal .tokens)
  const ROWS_GAP = 150;      // head view, horizontal: px between the query row and the key row
  const LAYOUTS = ["vertical", "horizontal"];
  const SVGNS = "http://www.w3.org/2000/svg";
  const PALETTE = [         // head colours, cycling: distinguishable on white
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
    "#bcbd22", "#7f7f7f", "#393b79", "#ad494a", "#637939", "#e6550d", "#843c39", "#3182bd",
    "#31a354", "#756bb1", "#d6616b", "#8c6d31",
  ];
  // white -> dark blue, 256 entries of (r, g, b): the colour of weight byte / 255
  const RAMP = buildRamp([[255, 255, 255], [198, 219, 239], [107, 174, 214], [33, 113, 181], [8, 48, 107]]);

  // ------------------------------------------------------------------ texts
  // Every text the explorer itself shows, in English and Chinese: the markup's by key (data-t: its
  // text, data-t-title: its tooltip, data-t-html: a legend line with its italics), the script's by
  // key or as a function of its numbers. What the data holds (titles, notes, layer names) is shown
  // as it is; group names and head roles the script knows are shown in the page's language.
  const TEXTS = {
    en: {
      input: "input", attention: "attention", layer: "layer", heads: "heads", all: "all", none: "none",
      threshold: "threshold", thresholdTip: "weights below it draw no line in the head view",
      save: "save", pngTip: "the view shown, as a picture", svgTip: "the view shown, as a drawing that scales",
      loading: "loading…", switchTo: "中文", switchTip: "切换到中文界面",
      tabHead: "head view", tabModel: "model view", tabMatrix: "matrix", tabImage: "image",
      tabLm: "language model", tabTranslation: "translation",
      layout: "layout", vertical: "vertical: queries left, keys right", horizontal: "horizontal: queries above, keys below",
      previous: "◀ previous", next: "next ▶",
      pageRemark: "lines to keys outside this page are not drawn: see the matrix view",
      queries: "queries", keys: "keys",
      modelCaption: "Every head of every layer: queries as rows, keys as columns (long inputs: the largest weight of "
        + "each block). Click a map to open it in the head view.",
      matrixMean: "mean of the selected heads", matrixRowScale: "scale each row to its maximum",
      colLayer: "layer", colHead: "head", colRole: "role", colEntropy: "entropy", colDistance: "distance",
      colPrevious: "previous", colFirst: "first", colDiagonal: "diagonal", colInduction: "induction",
      colAblation: "Δ loss", colProfile: "profile",
      colRoleTip: "previous-token: previous ≥ 0.5; induction: induction ≥ 0.4; first-token: first ≥ 0.5 (the largest share wins)",
      colEntropyTip: "spread of a query's weights, in bits: 0 = all on one key",
      colDistanceTip: "mean number of positions back",
      colPreviousTip: "mean weight on position i − 1",
      colFirstTip: "mean weight on position 0",
      colDiagonalTip: "mean weight on position i itself",
      colInductionTip: "mean weight on the tokens that followed earlier occurrences of the query's token (– when no token repeats)",
      colAblationTip: "the model's loss on this input with the head's output removed, less its loss with every head "
        + "(nats a token; – unless explored with --ablate)",
      colProfileTip: "the share of weight at each distance back",
      legendIntro: "Per head, averaged over queries; click a column to sort it, a row to show that head. Profile: the "
        + "share of weight at each distance back (bins left to right).",
      legendRole: "<i>role</i>: a head is labelled <b>previous-token</b> where <i>previous</i> ≥ 0.5, <b>induction</b> "
        + "where <i>induction</i> ≥ 0.4, <b>first-token</b> where <i>first</i> ≥ 0.5 (shares of a query's weight; the "
        + "largest wins). Its chip above the views shows ← ⇢ ⊢.",
      legendPrevious: "<b>Previous-token</b> heads: a high <i>previous</i>.",
      legendPositional: "<b>Positional</b> heads: a narrow profile (one distance takes most weight).",
      legendSink: "<b>Attention sinks</b>: a high <i>first</i> (weight parked on position 0).",
      legendInduction: "<b>Induction-like</b> heads: a high <i>induction</i> (weight on the tokens that followed earlier "
        + "occurrences of the current one); on repeated text their matrix has a stripe parallel to the diagonal, one "
        + "repeat back and one position ahead.",
      legendEntropy: "Low <i>entropy</i>: focused heads; high: spread out.",
      map: "map", imageTip: "click a patch to make it the query",
      lmCaption: "Hover or click a token: its attention over the earlier tokens (shading) and the model's most probable "
        + "next tokens after it.",
      prompt: "prompt", generated: "generated",
      translationCaption: "The selected layer of each group, mean of the selected heads; hover a map for its values.",
      title: "attention explorer",
      error: "Error: ",
      then: (a, b) => `${a} ${b}`,   // two sentences
      inputN: (i) => `input ${i}`,
      head: (h) => `head ${h}`,
      meanOfHeads: (heads) => `mean of heads ${heads.join(", ")}`,
      headRole: (h, role) => `head ${h}` + (role ? `: a ${role} head` : ""),
      cellTitle: (l, name, h, role) => `layer ${l} (${name}), head ${h}` + (role ? `: a ${role} head` : ""),
      positions: (a, b, n) => `positions ${a}–${b} of ${n}`,
      noHeads: "No head selected: choose heads above.",
      strongest: (most, total, thr) => `The strongest ${most} of ${total} lines (weights ≥ ${thr}): raise the threshold to see all.`,
      lines: (total, thr, heads, l) => `${total} lines: weights ≥ ${thr} of ${heads.length === 1 ? "head" : "heads"} `
        + `${heads.join(", ")}, layer ${l}.`,
      linesHint: "Hover a token to see only its lines.",
      matrixTitle: (group, l, name, heads, rowScale) => `${group}, layer ${l} (${name}), ${heads}: queries as rows, keys `
        + `as columns${rowScale ? ", each row scaled to its maximum" : ""}.`,
      matrixHint: "Hover for values.",
      cellTip: (i, q, j, k, v) => `query ${i} "${q}" → key ${j} "${k}": ${v}`,
      labelTip: (isKey, k, tok) => `${isKey ? "key" : "query"} ${k}: ${tok}`,
      meanSource: "selected heads (mean)", rolloutSource: "rollout",
      queryButton: (tok) => `query: ${tok}`,
      rolloutWhat: "attention rollout over all layers",
      layerWhat: (group, l, name, heads) => `${group}, layer ${l} (${name}), ${heads}`,
      imageCaption: (q, tok, what, rows, cols, lo, hi) => `Query ${q} "${tok}": its ${what}, over the ${rows}×${cols} `
        + `patches (more orange = more weight, scaled to the strongest patch; weights from ${lo} to ${hi}). Click a `
        + "patch to make it the query.",
      lmAfter: (i, tok, desc, any) => `After position ${i} "${tok}": shading = its attention (${desc}); `
        + (any ? "the most probable next tokens:" : "no next-token probabilities for this position."),
      lmDesc: (l, name, heads) => `layer ${l} (${name}), ${heads}`,
      missingGroup: "not in this document's data",
      panelCaption: (l, name, has, asked, heads) => `layer ${l} (${name})${has ? "" : `: it has no layer ${asked}, its `
        + "last shown"}; ${heads}`,
      figureViews: "a figure is saved from the head view, the model view, the matrix or the image view",
      roles: {},
      groups: {},
    },
    zh: {
      input: "输入", attention: "注意力", layer: "层", heads: "注意力头", all: "全选", none: "全不选",
      threshold: "阈值", thresholdTip: "权重低于阈值的连线不在头视图中画出",
      save: "保存", pngTip: "把当前视图存成图片", svgTip: "把当前视图存成可任意缩放的矢量图",
      loading: "加载中…", switchTo: "English", switchTip: "Switch to English",
      tabHead: "头视图", tabModel: "模型视图", tabMatrix: "注意力矩阵", tabImage: "图像",
      tabLm: "语言模型", tabTranslation: "翻译",
      layout: "布局", vertical: "纵向：查询在左，键在右", horizontal: "横向：查询在上，键在下",
      previous: "◀ 上一页", next: "下一页 ▶",
      pageRemark: "连向本页以外的键的连线没有画出，完整的权重请看注意力矩阵",
      queries: "查询 (query)", keys: "键 (key)",
      modelCaption: "所有层的所有头：每张图的行是查询，列是键（输入较长时，每个小块取其中最大的权重）。点击一张图，"
        + "在头视图中打开这个头。",
      matrixMean: "对选中的头取平均", matrixRowScale: "每行按本行的最大值缩放",
      colLayer: "层", colHead: "头", colRole: "角色", colEntropy: "熵", colDistance: "距离",
      colPrevious: "前一个", colFirst: "首位", colDiagonal: "对角", colInduction: "归纳",
      colAblation: "Δ 损失", colProfile: "距离分布",
      colRoleTip: "前一词元头 (previous-token)：前一个 ≥ 0.5；归纳头 (induction)：归纳 ≥ 0.4；首词元头 (first-token)："
        + "首位 ≥ 0.5（几项都达到时取比例最大的一项）",
      colEntropyTip: "熵 (entropy)：一个查询的权重有多分散，单位是比特；0 表示全部权重落在一个键上",
      colDistanceTip: "平均往回看多少个位置 (distance)",
      colPreviousTip: "落在位置 i − 1 上的平均权重 (previous)",
      colFirstTip: "落在位置 0 上的平均权重 (first)",
      colDiagonalTip: "落在位置 i 自身的平均权重 (diagonal)",
      colInductionTip: "落在“查询词元前几次出现时紧跟在后面的词元”上的平均权重 (induction)；没有重复的词元时为 –",
      colAblationTip: "去掉这个头的输出之后，模型在这个输入上的损失减去所有头都在时的损失（单位：每个词元的 nats；"
        + "生成页面时没有加 --ablate 则为 –）",
      colProfileTip: "权重在各个回看距离上所占的比例 (profile)",
      legendIntro: "每个头的数值都是对所有查询取的平均；点击列名按这一列排序，点击一行显示那个头。<i>距离分布</i> "
        + "(profile)：权重落在各个回看距离上的比例（分箱从左到右）。",
      legendRole: "<i>角色</i>：<i>前一个</i> ≥ 0.5 的头标为<b>前一词元</b>头，<i>归纳</i> ≥ 0.4 的标为<b>归纳</b>头，"
        + "<i>首位</i> ≥ 0.5 的标为<b>首词元</b>头（都是一个查询的权重所占的比例，几项都达到时取最大的一项）。上方的"
        + "头按钮分别标着 ← ⇢ ⊢。",
      legendPrevious: "<b>前一词元头</b> (previous-token head)：<i>前一个</i> 很高。",
      legendPositional: "<b>位置头</b> (positional head)：距离分布很窄（大部分权重落在同一个距离上）。",
      legendSink: "<b>注意力汇聚</b> (attention sink)：<i>首位</i> 很高（多余的权重都停在位置 0 上）。",
      legendInduction: "<b>类归纳头</b> (induction head)：<i>归纳</i> 很高（权重落在当前词元前几次出现时紧跟在后面的"
        + "词元上）；在重复的文本上，它的注意力矩阵有一条与对角线平行的斜纹：往回一个重复周期，再往前一个位置。",
      legendEntropy: "<i>熵</i>低：注意力集中的头；熵高：注意力分散的头。",
      map: "显示", imageTip: "点击一个图块，把它设为查询",
      lmCaption: "把鼠标移到一个词元上或点击它：底色是它对前面各个词元的注意力，右边是模型预测的最可能的下一个词元。",
      prompt: "提示词 (prompt)", generated: "生成的词元",
      translationCaption: "每一组注意力的当前层，对选中的头取平均；鼠标移到图上可以看到数值。",
      title: "注意力可视化",
      error: "出错：",
      then: (a, b) => a + b,
      inputN: (i) => `输入 ${i}`,
      head: (h) => `头 ${h}`,
      meanOfHeads: (heads) => `头 ${heads.join("、")} 的平均`,
      headRole: (h, role) => `头 ${h}` + (role ? `：${role}头` : ""),
      cellTitle: (l, name, h, role) => `第 ${l} 层（${name}），头 ${h}` + (role ? `：${role}头` : ""),
      positions: (a, b, n) => `位置 ${a}–${b}（共 ${n} 个）`,
      noHeads: "没有选中的头：请在上方选择注意力头。",
      strongest: (most, total, thr) => `只画出最强的 ${most} 条连线（权重 ≥ ${thr} 的共 ${total} 条）：调高阈值可以看到全部。`,
      lines: (total, thr, heads, l) => `${total} 条连线：第 ${l} 层，头 ${heads.join("、")} 中权重 ≥ ${thr} 的部分。`,
      linesHint: "鼠标移到一个词元上，只显示它的连线。",
      matrixTitle: (group, l, name, heads, rowScale) => `${group}，第 ${l} 层（${name}），${heads}：行是查询，列是键`
        + `${rowScale ? "，每行按本行的最大值缩放" : ""}。`,
      matrixHint: "鼠标移到格子上可以看到数值。",
      cellTip: (i, q, j, k, v) => `查询 ${i}「${q}」→ 键 ${j}「${k}」：${v}`,
      labelTip: (isKey, k, tok) => `${isKey ? "键" : "查询"} ${k}：${tok}`,
      meanSource: "选中头的平均", rolloutSource: "注意力展开 (rollout)",
      queryButton: (tok) => `查询：${tok}`,
      rolloutWhat: "注意力展开 (rollout，综合所有层)",
      layerWhat: (group, l, name, heads) => `${group}（第 ${l} 层 ${name}，${heads}）`,
      imageCaption: (q, tok, what, rows, cols, lo, hi) => `查询 ${q}「${tok}」的${what}，分布在 ${rows}×${cols} 个图块上`
        + `（越橙表示权重越大，以最强的图块为满色；权重从 ${lo} 到 ${hi}）。点击一个图块，把它设为查询。`,
      lmAfter: (i, tok, desc, any) => `位置 ${i}「${tok}」之后：底色是它的注意力（${desc}）；`
        + (any ? "最可能的下一个词元：" : "这个位置没有下一个词元的概率。"),
      lmDesc: (l, name, heads) => `第 ${l} 层（${name}），${heads}`,
      missingGroup: "这份数据里没有这一组",
      panelCaption: (l, name, has, asked, heads) => `第 ${l} 层（${name}）${has ? "" : `：它没有第 ${asked} 层，显示的是`
        + "最后一层"}；${heads}`,
      figureViews: "只有头视图、模型视图、注意力矩阵和图像视图可以保存成图",
      roles: { "previous-token": "前一词元", "induction": "归纳", "first-token": "首词元" },
      groups: {
        "self-attention": "自注意力", "cross-attention": "交叉注意力",
        "encoder self-attention": "编码器自注意力", "decoder self-attention": "解码器自注意力",
      },
    },
  };

  const $ = (id) => document.getElementById(id);
  const headColour = (h) => PALETTE[h % PALETTE.length];

  /** A new element: el("td", {className: "x", text: "y", dataset: {i: 1}}, [children]). */
  function el(tag, props = {}, children = []) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(props)) {
      if (key === "text") node.textContent = value;
      else if (key === "dataset") Object.assign(node.dataset, value);
      else if (key === "style") Object.assign(node.style, value);
      else node[key] = value;
    }
    for (const child of children) node.append(child);
    return node;
  }

  function buildRamp(stops) {
    const lut = new Uint8Array(256 * 3);
    for (let b = 0; b < 256; b++) {
      const t = (b / 255) * (stops.length - 1);
      const k = Math.min(Math.floor(t), stops.length - 2);
      const f = t - k;
      for (let c = 0; c < 3; c++) lut[b * 3 + c] = Math.round(stops[k][c] + (stops[k + 1][c] - stops[k][c]) * f);
    }
    return lut;
  }

  /** Token labels as shown: control characters made visible, nothing empty. */
  function shown(token) {
    const text = String(token).replace(/\n/g, "↵").replace(/\t/g, "⇥").replace(/\r/g, "");
    return text === "" ? "∅" : text;
  }
  /** `text` as it fits in `px` at `ctx`'s font: whole, or its longest start that fits with an ellipsis. */
  function fitText(ctx, text, px) {
    if (ctx.measureText(text).width <= px) return text;
    const chars = Array.from(text);   // code points: a cut never splits a character
    let lo = 0, hi = chars.length - 1;
    while (lo < hi) {
      const mid = (lo + hi + 1) >> 1;
      if (ctx.measureText(chars.slice(0, mid).join("") + "…").width <= px) lo = mid; else hi = mid - 1;
    }
    return chars.slice(0, lo).join("") + "…";
  }

  /** Resolves on the next animation frame (or after 100 ms where frames are not drawn: a hidden tab). */
  function nextFrame() {
    return new Promise((resolve) => {
      let done = false;
      const finish = () => { if (!done) { done = true; resolve(); } };
      requestAnimationFrame(finish);
      setTimeout(finish, 100);
    });
  }

  // ------------------------------------------------------------------ decoding
  function base64Bytes(text) {
    if (typeof text !== "string") throw new Error("weights are not a base64 string");
    if (typeof Uint8Array.fromBase64 === "function") return Uint8Array.fromBase64(text);
    const binary = atob(text);
    const bytes = new Uint8Array(binary.length);
    for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
    return bytes;
  }

  async function inflate(text) {
    const stream = new Blob([base64Bytes(text)]).stream().pipeThrough(new DecompressionStream("deflate"));
    try {
      return new Uint8Array(await new Response(stream).arrayBuffer());
    } catch (err) {
      // the browser reports a corrupt stream as "Failed to fetch": say what failed instead
      throw new Error("the data is not a complete zlib (deflate) stream");
    }
  }

  const decoded = new Map();   // key -> Promise<Uint8Array>
  let pending = 0;             // inflations in progress: "loading…" shows while > 0

  function setLoading(delta) {
    pending += delta;
    $("loading").hidden = pending === 0;
  }

  /** The bytes of base64 `text`, inflated once per `key`; `expected` values or an error naming `what`. */
  function decodeOnce(key, text, expected, what) {
    let promise = decoded.get(key);
    if (promise) return promise;
    setLoading(+1);
    promise = Promise.resolve()
      .then(() => inflate(text))
      .then((bytes) => {
        if (bytes.length !== expected) throw new Error(`${what}: ${bytes.length} values, expected ${expected}`);
        return bytes;
      })
      .catch((err) => {
        decoded.delete(key);  // a later view may try again
        throw new Error(`could not decode ${what}: ${err.message || err}`);
      })
      .finally(() => setLoading(-1));
    decoded.set(key, promise);
    return promise;
  }

  /** Uint8Array (heads * Lq * Lk) of layer `l` of group `g` of document `d`. */
  function layerBytes(d, g, l) {
    const group = data.documents[d].groups[g];
    const layer = group.layers[l];
    const expected = layer.heads * group.queries.length * group.keys.length;
    const what = `document ${d}, ${group.name}, layer ${l} (${layer.name})`;
    return decodeOnce(`${d}/${g}/${l}`, layer.data, expected, what);
  }

  function rolloutBytes(d) {
    const image = data.documents[d].image;
    const n = image.prefix + image.grid[0] * image.grid[1];
    return decodeOnce(`${d}/rollout`, image.rollout, n * n, `document ${d}, rollout`);
  }

  /** Float32Array (Lq * Lk): the mean over `heads` of a layer's bytes, as weights. */
  function headMap(bytes, Lq, Lk, heads) {
    const n = Lq * Lk;
    const out = new Float32Array(n);
    if (heads.length === 1) {
      const off = heads[0] * n;
      for (let x = 0; x < n; x++) out[x] = bytes[off + x] / 255;
      return out;
    }
    const sum = new Uint32Array(n);   // integer sums of bytes: exact, and faster than floats
    for (const h of heads) {
      const off = h * n;
      for (let x = 0; x < n; x++) sum[x] += bytes[off + x];
    }
    const scale = 255 * heads.length;
    for (let x = 0; x < n; x++) out[x] = sum[x] / scale;
    return out;
  }

  /** Row `i` of the mean over `heads` (as weights), keys [k0, k1). */
  function headRow(bytes, Lq, Lk, heads, i, k0 = 0, k1 = Lk) {
    const out = new Float32Array(k1 - k0);
    for (const h of heads) {
      const base = (h * Lq + i) * Lk;
      for (let j = k0; j < k1; j++) out[j - k0] += bytes[base + j];
    }
    const scale = 255 * heads.length;
    for (let j = 0; j < out.length; j++) out[j] /= scale;
    return out;
  }

  // ------------------------------------------------------------------ data and state
  let data;
  const state = { doc: 0, group: 0, layer: 0, heads: [0], view: "head", page: 0, lang: "en", layout: "vertical" };
  const ui = {
    threshold: 0.05,
    imageQuery: new Map(),    // document -> query index of the image view
    lmPin: new Map(),         // document -> position pinned in the language-model view
    sort: { key: null, dir: 1 },
  };

  const current = () => {
    const doc = data.documents[state.doc];
    const group = doc.groups[state.group];
    return { doc, group, layer: group.layers[state.layer] };
  };
  const defaultHeads = (H) => (H <= 4 ? [...Array(H).keys()] : [0]);
  /** The selected heads that a layer of H heads has, or head 0 if it has none of them. */
  function effectiveHeads(H) {
    const heads = state.heads.filter((h) => h < H);
    return heads.length ? heads : [0];
  }
  const headsText = (heads) => (heads.length === 1 ? t("head", heads[0]) : t("meanOfHeads", heads));

  /** The text `key` in the page's language (a function of `args` where it holds numbers). */
  function t(key, ...args) {
    const text = TEXTS[state.lang][key] ?? TEXTS.en[key];
    return typeof text === "function" ? text(...args) : text;
  }
  const roleName = (role) => TEXTS[state.lang].roles[role] ?? role;
  const groupName = (name) => TEXTS[state.lang].groups[name] ?? name;
  const known = (table, key) => typeof key === "string" && Object.hasOwn(table, key);

  /** The explorer's own markup in the page's language; a page built on it (the lab) labels its own. */
  function relabel() {
    document.documentElement.lang = state.lang === "zh" ? "zh-CN" : "en";
    for (const root of document.querySelectorAll(".controls, .tabs, main")) {
      for (const node of root.querySelectorAll("[data-t]")) node.textContent = t(node.dataset.t);
      for (const node of root.querySelectorAll("[data-t-title]")) node.title = t(node.dataset.tTitle);
      for (const node of root.querySelectorAll("[data-t-html]")) node.innerHTML = t(node.dataset.tHtml);
    }
    $("lang").lang = state.lang === "zh" ? "en" : "zh";   // the button names the other language, in it
    $("title").textContent = data.title || t("title");
    setOptions($("doc"), data.documents.map((doc, i) => doc.title || t("inputN", i)));
  }

  function availableViews(doc) {
    const views = ["head", "model", "matrix"];
    if (doc.image) views.push("image");
    if (doc.lm) views.push("lm");
    if (doc.kind === "translation") views.push("translation");
    return views;
  }

  function clampInt(value, lo, hi) {
    const n = Math.trunc(Number(value));
    return Number.isFinite(n) ? Math.max(lo, Math.min(hi, n)) : lo;
  }

  /** Applies a partial selection to `state`, keeping it consistent with the data. */
  function applyChange(change) {
    let resetHeads = false;
    if (change.doc !== undefined && Number(change.doc) !== state.doc) {
      state.doc = clampInt(change.doc, 0, data.documents.length - 1);
      Object.assign(state, { group: 0, layer: 0, page: 0 });
      resetHeads = true;
    }
    const doc = data.documents[state.doc];
    if (change.group !== undefined && Number(change.group) !== state.group) {
      state.group = clampInt(change.group, 0, doc.groups.length - 1);
      state.page = 0;
      resetHeads = true;
    }
    const group = doc.groups[state.group];
    if (change.layer !== undefined) state.layer = clampInt(change.layer, 0, group.layers.length - 1);
    state.layer = Math.min(state.layer, group.layers.length - 1);
    const H = group.layers[state.layer].heads;
    if (change.heads !== undefined) {
      const heads = Array.from(change.heads, Number).filter((h) => Number.isInteger(h) && h >= 0 && h < H);
      state.heads = [...new Set(heads)].sort((a, b) => a - b);
    } else {
      const had = state.heads.length;
      state.heads = state.heads.filter((h) => h < H);
      if (resetHeads || (had > 0 && state.heads.length === 0)) state.heads = defaultHeads(H);
    }
    const views = availableViews(doc);
    if (change.view !== undefined && views.includes(change.view)) state.view = change.view;
    if (known(TEXTS, change.lang)) state.lang = change.lang;
    if (LAYOUTS.includes(change.layout)) state.layout = change.layout;
    if (!views.includes(state.view)) state.view = "head";
    const pages = Math.max(1, Math.ceil(group.queries.length / PAGE));
    if (change.page !== undefined) state.page = clampInt(change.page, 0, pages - 1);
    state.page = Math.min(state.page, pages - 1);
  }

  // ------------------------------------------------------------------ rendering
  let renderGen = 0;                  // each render's number: a view stops when a newer one began
  let latest = Promise.resolve();
  const stale = (gen) => gen !== renderGen;

  function select(change = {}) {
    applyChange(change || {});
    return render();
  }

  /** Redraws the active view; resolves when the latest render (this one or a newer) is done. */
  function render() {
    const gen = ++renderGen;
    document.body.dataset.ready = "0";
    hideTooltip();
    syncControls();
    const section = $(`view-${state.view}`);
    const done = VIEWS[state.view](gen).then(
      () => { if (!stale(gen)) { clearError(); section.classList.remove("failed"); } },
      (err) => { if (!stale(gen)) { showError(err); section.classList.add("failed"); } },
    ).then(() => { if (!stale(gen)) document.body.dataset.ready = "1"; });
    latest = done;
    return done.then(() => (stale(gen) ? latest : undefined));
  }

  function showError(err) {
    const box = $("error");
    box.textContent = `${t("error")}${err && err.message ? err.message : err}`;
    box.hidden = false;
    console.error(err);
  }
  function clearError() { $("error").hidden = true; }

  // ------------------------------------------------------------------ controls
  const synced = { lang: "", doc: -1, groupKey: "", chipsKey: "" };

  function setOptions(select, labels) {
    select.replaceChildren(...labels.map((label, i) => el("option", { value: String(i), text: label })));
  }

  /** Brings selectors, head chips, tabs and sections in line with `state`. */
  function syncControls() {
    const { doc, group } = current();
    if (synced.lang !== state.lang) {  // a new language: every label, option and tooltip is made again
      Object.assign(synced, { lang: state.lang, doc: -1, groupKey: "", chipsKey: "" });
      statsKey = "";
      relabel();
    }
    $("doc").value = String(state.doc);
    if (synced.doc !== state.doc) {
      synced.doc = state.doc;
      $("doc-notes").replaceChildren(...(doc.notes || []).map((n) => el("div", { className: "note", text: n })));
      setOptions($("group"), doc.groups.map((g) => groupName(g.name)));
    }
    $("group").value = String(state.group);
    const groupKey = `${state.doc}/${state.group}`;
    if (synced.groupKey !== groupKey) {
      synced.groupKey = groupKey;
      setOptions($("layer"), group.layers.map((layer, i) => `${i}: ${layer.name}`));
    }
    $("layer").value = String(state.layer);
    const H = group.layers[state.layer].heads;
    const chipsKey = `${groupKey}/${state.layer}/${H}`;
    if (synced.chipsKey !== chipsKey) {
      synced.chipsKey = chipsKey;
      const roles = group.stats?.roles?.[state.layer] || [];
      $("heads").replaceChildren(...Array.from({ length: H }, (_, h) => el("button", {
        type: "button", className: "head-chip", text: String(h) + (roles[h] ? ` ${ROLE_MARK[roles[h]]}` : ""),
        title: t("headRole", h, roles[h] && roleName(roles[h])), dataset: { head: String(h) },
      })));
      // each chip's colour, as a custom property (explorer.css: .head-chip)
      for (const chip of $("heads").children) chip.style.setProperty("--c", headColour(Number(chip.dataset.head)));
    }
    for (const chip of $("heads").children) chip.classList.toggle("on", state.heads.includes(Number(chip.dataset.head)));
    const views = availableViews(doc);
    for (const tab of document.querySelectorAll(".tab")) {
      tab.hidden = !views.includes(tab.dataset.view);
      tab.classList.toggle("active", tab.dataset.view === state.view);
    }
    $("figure-control").hidden = !FIGURE_VIEWS.includes(state.view);
    $("head-layout").value = state.layout;
    for (const section of document.querySelectorAll("section.view")) section.hidden = section.id !== `view-${state.view}`;
  }

  function bindControls() {
    $("doc").addEventListener("change", (e) => select({ doc: Number(e.target.value) }));
    $("group").addEventListener("change", (e) => select({ group: Number(e.target.value) }));
    $("layer").addEventListener("change", (e) => select({ layer: Number(e.target.value) }));
    $("heads").addEventListener("click", (e) => {
      const chip = e.target.closest(".head-chip");
      if (!chip) return;
      const h = Number(chip.dataset.head);
      const heads = state.heads.includes(h) ? state.heads.filter((x) => x !== h) : [...state.heads, h];
      select({ heads });
    });
    $("heads-all").addEventListener("click", () => select({ heads: [...Array(current().layer.heads).keys()] }));
    $("heads-none").addEventListener("click", () => select({ heads: [] }));
    $("save-png").addEventListener("click", () => saveFigure("png"));
    $("save-svg").addEventListener("click", () => saveFigure("svg"));
    $("threshold").addEventListener("input", (e) => {
      const t = Number(e.target.value);
      if (e.target.value === "" || !Number.isFinite(t)) return;
      ui.threshold = t;
      if (state.view === "head") render();
    });
    for (const tab of document.querySelectorAll(".tab")) tab.addEventListener("click", () => select({ view: tab.dataset.view }));
    $("page-prev").addEventListener("click", () => select({ page: state.page - 1 }));
    $("page-next").addEventListener("click", () => select({ page: state.page + 1 }));
    for (const id of ["matrix-mean", "matrix-rowscale", "image-source"]) $(id).addEventListener("change", () => render());
    $("image-cls").addEventListener("click", () => { ui.imageQuery.set(state.doc, 0); render(); });
    $("head-layout").addEventListener("change", (e) => select({ layout: e.target.value }));
    $("lang").addEventListener("click", () => setLanguage(state.lang === "en" ? "zh" : "en"));
  }

  /** Shows the explorer in `lang` ("en" or "zh"): its labels, then the view redrawn. */
  function setLanguage(lang) {
    if (!known(TEXTS, lang)) throw new Error(`language must be one of ${Object.keys(TEXTS).join(", ")}; got ${JSON.stringify(lang)}`);
    return select({ lang });
  }

  // ------------------------------------------------------------------ head view
  let headLines = [];   // {node, q, k} of the lines drawn, for hover filtering
  let headDrawn = null; // what the head view drew last, for its figure: {caption, rows: null | {font, top, bottom}}
  const measure = document.createElement("canvas").getContext("2d");   // text widths

  async function drawHeadView(gen) {
    const { group, layer } = current();
    const bytes = await layerBytes(state.doc, state.group, state.layer);
    if (stale(gen)) return;
    const Lq = group.queries.length, Lk = group.keys.length, H = layer.heads;
    const pages = Math.ceil(Lq / PAGE);
    const a = state.page * PAGE, b = Math.min(Lq, a + PAGE);
    // a self group pages both sides alike; otherwise every key is shown
    const k0 = group.self ? Math.min(a, Lk) : 0, k1 = group.self ? Math.min(b, Lk) : Lk;

    $("pager").hidden = pages <= 1;
    $("page-label").textContent = t("positions", a, b - 1, Lq);
    $("page-prev").disabled = state.page === 0;
    $("page-next").disabled = state.page >= pages - 1;
    $("page-remark").hidden = !(group.self && pages > 1);

    const tokens = (labels, from, to, cls, attr) => {
      const nodes = [];
      for (let x = from; x < to; x++) {
        nodes.push(el("div", { className: `tok ${cls}`, text: shown(labels[x]), title: `${x}: ${labels[x]}`, dataset: { [attr]: String(x) } }));
      }
      return nodes;
    };
    const left = tokens(group.queries, a, b, "tok-left", "i");
    const right = tokens(group.keys, k0, k1, "tok-right", "j");
    $("tokens-left").replaceChildren(...left);
    $("tokens-right").replaceChildren(...right);
    const horizontal = state.layout === "horizontal";
    $("head-view").classList.toggle("horizontal", horizontal);
    // where each line ends: the middle of its token's row (vertical) or of its token's box (horizontal)
    let width, height, qAt, kAt, rows = null;
    if (horizontal) {
      const top = sizeBoxes(left), bottom = sizeBoxes(right);
      rows = { font: top.font || bottom.font, top, bottom };
      width = Math.max(top.width, bottom.width, 1);
      height = ROWS_GAP;
      qAt = (i) => [top.centres[i - a], 0];
      kAt = (j) => [bottom.centres[j - k0], height];
    } else {
      width = headWidth();
      height = Math.max(b - a, k1 - k0) * ROW;
      qAt = (i) => [0, (i - a + 0.5) * ROW];
      kAt = (j) => [width, (j - k0 + 0.5) * ROW];
    }

    // the lines: one per (selected head, query, key) with weight >= threshold; zeros never draw
    const minByte = Math.max(1, Math.ceil(ui.threshold * 255 - 1e-9));
    const heads = state.heads.filter((h) => h < H);
    let found = [];
    for (const h of heads) {
      for (let i = a; i < b; i++) {
        const base = (h * Lq + i) * Lk;
        for (let j = k0; j < k1; j++) {
          const v = bytes[base + j];
          if (v >= minByte) found.push([h, i, j, v]);
        }
      }
    }
    const total = found.length;
    if (total > MAX_LINES) found = found.sort((x, y) => y[3] - x[3]).slice(0, MAX_LINES);

    const svg = $("head-svg");
    svg.setAttribute("width", String(width));
    svg.setAttribute("height", String(height));
    svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
    const frag = document.createDocumentFragment();
    headLines = found.map(([h, i, j, v]) => {
      const line = document.createElementNS(SVGNS, "line");
      line.setAttribute("class", "attn-line");
      const [x1, y1] = qAt(i), [x2, y2] = kAt(j);
      line.setAttribute("x1", String(x1));
      line.setAttribute("y1", String(y1));
      line.setAttribute("x2", String(x2));
      line.setAttribute("y2", String(y2));
      line.setAttribute("stroke", headColour(h));
      line.setAttribute("stroke-opacity", String(v / 255));
      line.setAttribute("data-head", String(h));
      line.setAttribute("data-q", String(i));
      line.setAttribute("data-k", String(j));
      line.setAttribute("data-w", (v / 255).toFixed(4));
      frag.append(line);
      return { node: line, q: i, k: j };
    });
    svg.replaceChildren(frag);

    const thr = (minByte / 255).toFixed(3);
    const caption = heads.length === 0 ? t("noHeads")
      : total > MAX_LINES ? t("strongest", MAX_LINES, total, thr) : t("lines", total, thr, heads, state.layer);
    $("lines-info").textContent = heads.length && total <= MAX_LINES ? t("then", caption, t("linesHint")) : caption;
    headDrawn = { caption, rows };
    for (const node of left) hoverFilter(node, "q", Number(node.dataset.i));
    for (const node of right) hoverFilter(node, "k", Number(node.dataset.j));
  }

  /** The canvas font of a token box: its CSS font. */
  function boxFont(node) {
    const style = getComputedStyle(node);
    return `${style.fontWeight} ${style.fontSize} ${style.fontFamily}`;
  }

  /** Sizes the token boxes of a row (horizontal layout) to their text, measured in their font (the
   * longest stop at BOX_MAX and end in an ellipsis); returns each box's middle in px from the row's
   * start, its width and text, the row's width and the font. Boxes side by side in a row of known
   * widths never overlap. */
  function sizeBoxes(nodes) {
    if (!nodes.length) return { centres: [], widths: [], texts: [], width: 0, font: "" };
    const style = getComputedStyle(nodes[0]);
    const frame = ["paddingLeft", "paddingRight", "borderLeftWidth", "borderRightWidth"]
      .reduce((sum, k) => sum + (parseFloat(style[k]) || 0), 0);
    const font = boxFont(nodes[0]);
    measure.font = font;
    const centres = [], widths = [], texts = [];
    let x = 0;
    for (const node of nodes) {
      // one px to spare: a width rounded down would cut the text
      const w = Math.min(BOX_MAX, Math.ceil(measure.measureText(node.textContent).width + frame) + 1);
      node.style.width = `${w}px`;
      centres.push(x + w / 2);
      widths.push(w);
      texts.push(node.textContent);
      x += w + BOX_GAP;
    }
    return { centres, widths, texts, width: x - BOX_GAP, font };
  }

  /** The head view's px between its token columns: what the page's width leaves them, SVG_WIDTH to SVG_MAX. */
  let headFrameWidth = -1;  // the head view's width when its lines were last laid out
  const SCROLLBAR_PX = 40;  // a change of width below this is a scrollbar's, not the page's
  function headWidth() {
    const columns = document.querySelectorAll("#view-head .tok-column");
    const taken = Array.from(columns, (c) => c.offsetWidth).reduce((a, b) => a + b, 0);
    headFrameWidth = $("view-head").clientWidth;
    const free = headFrameWidth - taken - 2;
    return Math.round(Math.max(SVG_WIDTH, Math.min(SVG_MAX, free)));
  }

  /** Hovering `node` shows only the lines whose `side` ("q" or "k") is `index`; leaving shows all. */
  function hoverFilter(node, side, index) {
    node.addEventListener("mouseenter", () => {
      node.classList.add("hover");
      for (const line of headLines) line.node.style.display = line[side] === index ? "" : "none";
    });
    node.addEventListener("mouseleave", () => {
      node.classList.remove("hover");
      for (const line of headLines) line.node.style.display = "";
    });
  }

  // ------------------------------------------------------------------ model view
  const modelGrids = new Map();   // "doc/group" -> {root, drawn: Set of layers drawn}

  function buildModelGrid(group) {
    const H = Math.max(...group.layers.map((layer) => layer.heads));
    const root = el("div", { className: "model-grid" });
    root.style.gridTemplateColumns = `auto repeat(${H}, ${THUMB}px)`;
    root.append(el("div"));
    for (let h = 0; h < H; h++) root.append(el("div", { className: "col-label", text: `h${h}`, style: { color: headColour(h) } }));
    const Tq = Math.min(group.queries.length, THUMB), Tk = Math.min(group.keys.length, THUMB);
    group.layers.forEach((layer, l) => {
      root.append(el("div", { className: "row-label", text: `${l}: ${layer.name}` }));
      for (let h = 0; h < H; h++) {
        if (h >= layer.heads) { root.append(el("div")); continue; }
        root.append(el("canvas", { className: "cell", width: Tk, height: Tq, dataset: { layer: String(l), head: String(h) } }));
      }
    });
    root.addEventListener("click", (e) => {
      const cell = e.target.closest("canvas.cell");
      if (cell) select({ layer: Number(cell.dataset.layer), heads: [Number(cell.dataset.head)], view: "head" });
    });
    return { root, drawn: new Set(), lang: "" };
  }

  /** Maps positions 0..n-1 onto `t` bins (t <= n). */
  function binsOf(n, t) {
    const map = new Int32Array(n);
    for (let x = 0; x < n; x++) map[x] = Math.floor((x * t) / n);
    return map;
  }

  /** Draws every head's thumbnail of layer `l`: the largest byte of each block, so sharp patterns stay visible. */
  function drawThumbs(grid, group, l, bytes) {
    const Lq = group.queries.length, Lk = group.keys.length;
    const Tq = Math.min(Lq, THUMB), Tk = Math.min(Lk, THUMB);
    const rows = binsOf(Lq, Tq), cols = binsOf(Lk, Tk);
    for (const canvas of grid.root.querySelectorAll(`canvas.cell[data-layer="${l}"]`)) {
      const h = Number(canvas.dataset.head);
      const block = new Uint8Array(Tq * Tk);
      for (let i = 0; i < Lq; i++) {
        const base = (h * Lq + i) * Lk, r = rows[i] * Tk;
        for (let j = 0; j < Lk; j++) {
          const v = bytes[base + j], c = r + cols[j];
          if (v > block[c]) block[c] = v;
        }
      }
      const ctx = canvas.getContext("2d");
      ctx.putImageData(bytesImage(block, Tk, Tq), 0, 0);
    }
  }

  /** ImageData of `w` x `h` bytes coloured by RAMP. */
  function bytesImage(values, w, h) {
    const img = new ImageData(w, h);
    const px = img.data;
    for (let x = 0; x < w * h; x++) {
      const c = values[x] * 3;
      px[x * 4] = RAMP[c]; px[x * 4 + 1] = RAMP[c + 1]; px[x * 4 + 2] = RAMP[c + 2]; px[x * 4 + 3] = 255;
    }
    return img;
  }

  async function drawModelView(gen) {
    const { group } = current();
    const key = `${state.doc}/${state.group}`;
    if (!modelGrids.has(key)) modelGrids.set(key, buildModelGrid(group));
    const grid = modelGrids.get(key);
    const host = $("model-host");
    if (host.firstChild !== grid.root) host.replaceChildren(grid.root);
    if (grid.lang !== state.lang) {
      grid.lang = state.lang;
      for (const cell of grid.root.querySelectorAll("canvas.cell")) {
        const l = Number(cell.dataset.layer), h = Number(cell.dataset.head), role = group.stats?.roles?.[l]?.[h];
        cell.title = t("cellTitle", l, group.layers[l].name, h, role && roleName(role));
      }
    }
    for (const cell of grid.root.querySelectorAll("canvas.cell")) {
      cell.classList.toggle("selected", Number(cell.dataset.layer) === state.layer && state.heads.includes(Number(cell.dataset.head)));
    }
    // one layer a frame: the page stays responsive while a long input's layers inflate
    for (let l = 0; l < group.layers.length; l++) {
      if (grid.drawn.has(l)) continue;
      const bytes = await layerBytes(state.doc, state.group, l);
      if (stale(gen)) return;
      if (!grid.drawn.has(l)) drawThumbs(grid, group, l, bytes);
      grid.drawn.add(l);
      await nextFrame();
      if (stale(gen)) return;
    }
  }

  // ------------------------------------------------------------------ matrices (matrix and translation views)
  /** Sizes a canvas to w x h CSS px, sharp on high-density screens; returns its context. */
  function sizeCanvas(canvas, w, h) {
    const dpr = window.devicePixelRatio || 1;
    canvas.width = Math.round(w * dpr);
    canvas.height = Math.round(h * dpr);
    canvas.style.width = `${w}px`;
    canvas.style.height = `${h}px`;
    const ctx = canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    return ctx;
  }

  /** The two label canvases beside a matrix canvas (its parent is a .matrix-frame), made once. */
  function axesOf(canvas) {
    const frame = canvas.parentElement;
    let rows = frame.querySelector(":scope > .axis-rows"), cols = frame.querySelector(":scope > .axis-cols");
    if (!rows) {
      rows = el("canvas", { className: "axis axis-rows" });
      cols = el("canvas", { className: "axis axis-cols" });
      frame.prepend(cols, rows);
    }
    return { rows, cols };
  }

  /**
   * Draws map `m` = {vals: Float32Array (Lq*Lk), Lq, Lk, qLabels, kLabels, rowScale, maxPx} on
   * `canvas`: queries as rows, keys as columns, cells of 1 to 24 px; the canvas holds the cells
   * only (a cell is canvas width / Lk wide), the token labels of an axis of at most MAX_LABELS
   * tokens go on the label canvases beside it. The map stays on the canvas for the tooltip.
   */
  function drawMatrix(canvas, m) {
    const { vals, Lq, Lk } = m;
    const rowLabels = Lq <= MAX_LABELS, colLabels = Lk <= MAX_LABELS;
    let s = Math.max(1, Math.min(24, Math.floor(m.maxPx / Math.max(Lq, Lk, 1))));
    if (rowLabels || colLabels) s = Math.max(s, 9);   // labels need rows of their height
    const ctx = sizeCanvas(canvas, Lk * s, Lq * s);

    // the cells, at one pixel each, then scaled up without smoothing
    const img = new ImageData(Math.max(Lk, 1), Math.max(Lq, 1));
    const px = img.data;
    for (let i = 0; i < Lq; i++) {
      let scale = 255;
      if (m.rowScale) {
        let max = 0;
        for (let j = 0; j < Lk; j++) max = Math.max(max, vals[i * Lk + j]);
        scale = max > 0 ? 255 / max : 0;
      }
      for (let j = 0; j < Lk; j++) {
        const x = i * Lk + j, c = Math.min(255, Math.round(vals[x] * scale)) * 3;
        px[x * 4] = RAMP[c]; px[x * 4 + 1] = RAMP[c + 1]; px[x * 4 + 2] = RAMP[c + 2]; px[x * 4 + 3] = 255;
      }
    }
    const cells = document.createElement("canvas");
    cells.width = img.width;
    cells.height = img.height;
    cells.getContext("2d").putImageData(img, 0, 0);
    ctx.imageSmoothingEnabled = false;
    ctx.drawImage(cells, 0, 0, Lk * s, Lq * s);

    const axes = axesOf(canvas);
    drawLabels(axes.rows, rowLabels ? m.qLabels : null, s, false);
    drawLabels(axes.cols, colLabels ? m.kLabels : null, s, true);
    canvas.matrix = { ...m, s };
    canvas.dataset.cell = String(s);
    attachTooltip(canvas);
  }

  /**
   * Token labels along a matrix: right-aligned row labels, or column labels read upwards, each
   * at most LABEL_PX long (a longer one ends in an ellipsis); hovering one shows it whole.
   * The canvas keeps `labels`: {shown, full}.
   */
  function drawLabels(canvas, labels, s, vertical) {
    canvas.hidden = !labels;
    canvas.labels = labels ? { full: labels, shown: [], s, vertical } : null;
    if (!labels) return;
    const font = `${Math.min(11, s)}px system-ui, -apple-system, "Segoe UI", sans-serif`;
    const measure = canvas.getContext("2d");
    measure.font = font;
    const texts = labels.map((t) => fitText(measure, shown(t), LABEL_PX));
    canvas.labels.shown = texts;
    const depth = Math.ceil(Math.max(0, ...texts.map((t) => measure.measureText(t).width))) + 6;
    const along = labels.length * s;
    const ctx = vertical ? sizeCanvas(canvas, along, depth) : sizeCanvas(canvas, depth, along);
    ctx.font = font;
    ctx.fillStyle = "#1f2328";
    ctx.textBaseline = "middle";
    ctx.textAlign = vertical ? "left" : "right";
    texts.forEach((t, k) => {
      if (!vertical) { ctx.fillText(t, depth - 4, (k + 0.5) * s); return; }
      ctx.save();
      ctx.translate((k + 0.5) * s, depth - 4);
      ctx.rotate(-Math.PI / 2);
      ctx.fillText(t, 0, 0);
      ctx.restore();
    });
    if (canvas.dataset.tooltip) return;
    canvas.dataset.tooltip = "1";
    canvas.addEventListener("mousemove", (e) => {
      const m = canvas.labels;
      if (!m) return;
      const rect = canvas.getBoundingClientRect();
      const k = Math.floor((m.vertical ? e.clientX - rect.left : e.clientY - rect.top) / m.s);
      if (k < 0 || k >= m.full.length) { hideTooltip(); return; }
      showTooltip(e, t("labelTip", m.vertical, k, shown(m.full[k])));
    });
    canvas.addEventListener("mouseleave", hideTooltip);
  }

  /** The tooltip of a matrix canvas: query i "tok" → key j "tok": weight. */
  function attachTooltip(canvas) {
    if (canvas.dataset.tooltip) return;
    canvas.dataset.tooltip = "1";
    canvas.addEventListener("mousemove", (e) => {
      const m = canvas.matrix;
      if (!m) return;
      const rect = canvas.getBoundingClientRect();
      const j = Math.floor((e.clientX - rect.left) / m.s);
      const i = Math.floor((e.clientY - rect.top) / m.s);
      if (i < 0 || j < 0 || i >= m.Lq || j >= m.Lk) { hideTooltip(); return; }
      const v = m.vals[i * m.Lk + j];
      showTooltip(e, t("cellTip", i, shown(m.qLabels[i]), j, shown(m.kLabels[j]), v.toFixed(3)));
    });
    canvas.addEventListener("mouseleave", hideTooltip);
  }

  function showTooltip(e, text) {
    const tip = $("tooltip");
    tip.textContent = text;
    tip.hidden = false;
    const x = Math.min(e.clientX + 14, window.innerWidth - tip.offsetWidth - 4);
    const y = e.clientY + 16 + tip.offsetHeight > window.innerHeight ? e.clientY - tip.offsetHeight - 8 : e.clientY + 16;
    tip.style.left = `${Math.max(0, x)}px`;
    tip.style.top = `${Math.max(0, y)}px`;
  }
  function hideTooltip() { $("tooltip").hidden = true; }

  // ------------------------------------------------------------------ matrix view
  async function drawMatrixView(gen) {
    const { group, layer } = current();
    const bytes = await layerBytes(state.doc, state.group, state.layer);
    if (stale(gen)) return;
    const heads = effectiveHeads(layer.heads);
    const used = $("matrix-mean").checked ? heads : [heads[0]];
    const rowScale = $("matrix-rowscale").checked;
    const Lq = group.queries.length, Lk = group.keys.length;
    const title = t("matrixTitle", groupName(group.name), state.layer, layer.name, headsText(used), rowScale);
    $("matrix-title").textContent = t("then", title, t("matrixHint"));
    const shownMatrix = {
      vals: headMap(bytes, Lq, Lk, used), Lq, Lk, qLabels: group.queries, kLabels: group.keys, rowScale, maxPx: MATRIX_PX,
    };
    drawMatrix($("matrix-canvas"), shownMatrix);
    lastMatrix = { ...shownMatrix, title };
    drawStats(group);
  }

  // ------------------------------------------------------------------ a figure to keep
const FIGURE_VIEWS = ["head", "model", "matrix", "image"];  // the views saved as a figure
  let lastMatrix = null;  // what the matrix view drew last: its figure
  const FIGURE_FONT = "system-ui, 'Noto Sans CJK SC', 'WenQuanYi Zen Hei', sans-serif";
  const esc = (text) => String(text).replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[c]);
  const rgb = (byte) => `rgb(${RAMP[byte * 3]},${RAMP[byte * 3 + 1]},${RAMP[byte * 3 + 2]})`;

  function svgDocument(width, height, title, body) {
    return `<svg xmlns="${SVGNS}" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}" `
      + `font-family="${FIGURE_FONT}" font-size="12"><rect width="100%" height="100%" fill="#fff"/>`
      + `<text x="8" y="16" font-size="13" fill="#24292f">${esc(title)}</text>${body}</svg>`;
  }

  /** The head view's lines shown (a hover hides some), moved by (`dx`, `dy`). */
  function headLinesFigure(dx, dy) {
    let body = `<g transform="translate(${dx},${dy})">`;
    for (const line of $("head-svg").querySelectorAll("line")) {
      if (line.style.display === "none") continue;
      body += `<line x1="${line.getAttribute("x1")}" y1="${line.getAttribute("y1")}" x2="${line.getAttribute("x2")}" `
        + `y2="${line.getAttribute("y2")}" stroke="${line.getAttribute("stroke")}" stroke-opacity="${line.getAttribute("stroke-opacity")}" stroke-width="2"/>`;
    }
    return body + "</g>";
  }

  /** The head view as drawn: its tokens as text, its lines with their colours and weights. */
  function headFigure() {
    if (headDrawn.rows) return headRowsFigure(headDrawn.rows);
    const lines = $("head-svg");
    const width = Number(lines.getAttribute("width")), height = Number(lines.getAttribute("height"));
    const left = Array.from($("tokens-left").children, (n) => n.textContent);
    const right = Array.from($("tokens-right").children, (n) => n.textContent);
    const label = 150, top = 28;
    let body = headLinesFigure(label, top);
    left.forEach((tok, i) => { body += `<text x="${label - 6}" y="${top + (i + 0.5) * ROW + 4}" text-anchor="end">${esc(tok)}</text>`; });
    right.forEach((tok, j) => { body += `<text x="${label + width + 6}" y="${top + (j + 0.5) * ROW + 4}">${esc(tok)}</text>`; });
    return svgDocument(2 * label + width, top + height + 8, headDrawn.caption, body);
  }

  /** The horizontal head view as drawn: the query boxes above, the key boxes below, the lines between. */
  function headRowsFigure(rows) {
    const lines = $("head-svg");
    const width = Number(lines.getAttribute("width")), height = Number(lines.getAttribute("height"));
    const margin = 8, box = 22, top = 28, pad = 12;
    measure.font = rows.font;
    const boxes = (row, y) => row.centres.map((x, k) => {
      const w = row.widths[k], text = fitText(measure, row.texts[k], w - pad);
      return `<rect x="${margin + x - w / 2}" y="${y}" width="${w}" height="${box}" rx="3" fill="#f6f8fa" stroke="#d0d7de"/>`
        + `<text x="${margin + x}" y="${y + box / 2 + 4}" text-anchor="middle">${esc(text)}</text>`;
    }).join("");
    const body = headLinesFigure(margin, top + box) + boxes(rows.top, top) + boxes(rows.bottom, top + box + height);
    return svgDocument(2 * margin + width, top + 2 * box + height + 8, headDrawn.caption, body);
  }

  /** The matrix as drawn: one square a weight, its token labels where the matrix has room for them. */
  function matrixFigure() {
    const m = lastMatrix;
    const cell = Math.max(4, Math.min(18, Math.floor(MATRIX_PX / Math.max(m.Lq, m.Lk, 1))));
    const rows = m.Lq <= MAX_LABELS, cols = m.Lk <= MAX_LABELS;
    const left = rows ? 110 : 10, top = 28 + (cols ? 90 : 0);
    let body = `<g transform="translate(${left},${top})">`;
    for (let i = 0; i < m.Lq; i++) {
      let scale = 255;
      if (m.rowScale) {
        let max = 0;
        for (let j = 0; j < m.Lk; j++) max = Math.max(max, m.vals[i * m.Lk + j]);
        scale = max > 0 ? 255 / max : 0;
      }
      for (let j = 0; j < m.Lk; j++) {
        const byte = Math.min(255, Math.round(m.vals[i * m.Lk + j] * scale));
        if (byte > 0) body += `<rect x="${j * cell}" y="${i * cell}" width="${cell}" height="${cell}" fill="${rgb(byte)}"/>`;
      }
    }
    body += `<rect width="${m.Lk * cell}" height="${m.Lq * cell}" fill="none" stroke="#d0d7de"/></g>`;
    if (rows) m.qLabels.forEach((tok, i) => { body += `<text x="${left - 4}" y="${top + (i + 0.5) * cell + 4}" text-anchor="end">${esc(shown(tok))}</text>`; });
    if (cols) m.kLabels.forEach((tok, j) => {
      const x = left + (j + 0.5) * cell + 4, y = top - 4;
      body += `<text x="${x}" y="${y}" transform="rotate(-60 ${x} ${y})">${esc(shown(tok))}</text>`;
    });
    return svgDocument(left + m.Lk * cell + 16, top + m.Lq * cell + 12, m.title, body);
  }

  /** The model view as a figure: every layer's row of head thumbnails (each a picture, its pixels
   * kept sharp), the layers' names and the heads' numbers as text. Layers not drawn yet are drawn first. */
  async function modelFigure() {
    const { group } = current();
    const grid = modelGrids.get(`${state.doc}/${state.group}`);
    for (let l = 0; l < group.layers.length; l++) {
      if (grid.drawn.has(l)) continue;
      drawThumbs(grid, group, l, await layerBytes(state.doc, state.group, l));
      grid.drawn.add(l);
    }
    const H = Math.max(...group.layers.map((layer) => layer.heads));
    const label = 150, top = 44, gap = 4, size = THUMB;
    let body = "";
    for (let h = 0; h < H; h++) {
      body += `<text x="${label + h * (size + gap) + size / 2}" y="${top - 6}" text-anchor="middle" fill="${headColour(h)}">h${h}</text>`;
    }
    group.layers.forEach((layer, l) => {
      const y = top + l * (size + gap);
      body += `<text x="${label - 8}" y="${y + size / 2 + 4}" text-anchor="end">${esc(`${l}: ${layer.name}`)}</text>`;
      for (const canvas of grid.root.querySelectorAll(`canvas.cell[data-layer="${l}"]`)) {
        const x = label + Number(canvas.dataset.head) * (size + gap);
        body += `<image x="${x}" y="${y}" width="${size}" height="${size}" preserveAspectRatio="none" `
          + `style="image-rendering:pixelated" href="${canvas.toDataURL("image/png")}"/>`
          + `<rect x="${x}" y="${y}" width="${size}" height="${size}" fill="none" stroke="#d0d7de"/>`;
      }
    });
    const width = label + H * (size + gap) + 8, height = top + group.layers.length * (size + gap) + 8;
    return svgDocument(width, height, `${groupName(group.name)}: ${t("tabModel")}`, body);
  }

  /** The image view as a figure: the picture with its patches tinted as drawn, and its caption as text. */
  function imageFigure() {
    const canvas = $("image-canvas"), { W, H } = canvas.grid;
    const caption = $("image-caption").textContent;
    const top = 28;
    measure.font = `12px ${FIGURE_FONT}`;
    const lines = [];  // the caption wrapped to the picture's width (at least 320 px)
    const width = Math.max(W, 320);
    for (const word of caption.split(" ")) {
      const last = lines.length - 1;
      if (last >= 0 && measure.measureText(`${lines[last]} ${word}`).width <= width) lines[last] += ` ${word}`;
      else lines.push(word);
    }
    let body = `<image x="8" y="${top}" width="${W}" height="${H}" href="${canvas.toDataURL("image/png")}"/>`;
    lines.forEach((line, i) => { body += `<text x="8" y="${top + H + 18 + 16 * i}">${esc(line)}</text>`; });
    return svgDocument(width + 16, top + H + 18 + 16 * lines.length, t("tabImage"), body);
  }

  /** The view shown as a figure: ``"svg"`` (text) or ``"png"`` (a data URL, drawn from the SVG at
   * twice its size); the head view, the model view, the matrix and the image view have one. */
  async function figure(format) {
    const drawn = { head: () => headDrawn, matrix: () => lastMatrix, model: () => true,
                    image: () => $("image-canvas").grid }[state.view];
    if (!drawn || !drawn()) throw new Error(t("figureViews"));
    const svg = state.view === "head" ? headFigure() : state.view === "matrix" ? matrixFigure()
      : state.view === "model" ? await modelFigure() : imageFigure();
    if (format === "svg") return svg;
    const image = new Image();
    image.src = "data:image/svg+xml;charset=utf-8," + encodeURIComponent(svg);
    await image.decode();
    const canvas = document.createElement("canvas");
    canvas.width = 2 * image.naturalWidth;
    canvas.height = 2 * image.naturalHeight;
    const ctx = canvas.getContext("2d");
    ctx.scale(2, 2);
    ctx.drawImage(image, 0, 0);
    return canvas.toDataURL("image/png");
  }

  /** Another page's data (the lab's second model) drawn as a matrix on `canvas` (inside a .matrix-frame):
   * its first group, layer `l` (its last if it has fewer), the mean of `heads` it has. */
  async function drawMatrixOf(other, l, heads, canvas) {
    const group = other.documents[0].groups[0];
    const layer = group.layers[Math.min(l, group.layers.length - 1)];
    const Lq = group.queries.length, Lk = group.keys.length;
    const bytes = await inflate(layer.data);
    if (bytes.length !== layer.heads * Lq * Lk) throw new Error(`${layer.name}: ${bytes.length} values, expected ${layer.heads * Lq * Lk}`);
    const kept = heads.filter((h) => h < layer.heads);
    const used = kept.length ? kept : [0];
    drawMatrix(canvas, { vals: headMap(bytes, Lq, Lk, used), Lq, Lk, qLabels: group.queries, kLabels: group.keys, maxPx: PANEL_PX });
    return { layer: layer.name, heads: used };
  }

  async function saveFigure(format) {
    try {
      const out = await figure(format);
      const link = el("a", {
        href: format === "svg" ? "data:image/svg+xml;charset=utf-8," + encodeURIComponent(out) : out,
        download: `attention-${state.view}-layer${state.layer}.${format}`,
      });
      document.body.append(link);
      link.click();
      link.remove();
    } catch (err) {
      showError(err);
    }
  }

  const STAT_KEYS = ["entropy", "distance", "previous", "first", "diagonal", "induction", "ablation"];
  // a head's role (attnlab.viz.explorer.documents.ROLES) as its chip shows it
  const ROLE_MARK = { "previous-token": "←", "induction": "⇢", "first-token": "⊢" };
  const STAT_DIGITS = { entropy: 2, distance: 1, previous: 3, first: 3, diagonal: 3, induction: 3, ablation: 3 };
  let statsKey = "";
  let statRows = [];   // {layer, head, entropy, ..., tr}

  /** The table of per-head statistics of a group (built once per group, sorted and marked each time). */
  function drawStats(group) {
    const panel = $("stats-panel");
    const stats = group.stats;
    panel.hidden = !stats;
    if (!stats) return;
    const key = `${state.doc}/${state.group}`;
    if (statsKey !== key) {
      statsKey = key;
      statRows = [];
      group.layers.forEach((layer, l) => {
        for (let h = 0; h < layer.heads; h++) {
          const row = { layer: l, head: h };
          for (const k of STAT_KEYS) row[k] = Number(stats[k]?.[l]?.[h] ?? NaN);
          const profile = stats.profile?.[l]?.[h] || [];
          row.role = stats.roles?.[l]?.[h] || "";
          row.tr = el("tr", { dataset: { layer: String(l), head: String(h) } }, [
            el("td", { text: String(l) }),
            el("td", { text: String(h), style: { color: headColour(h), fontWeight: "600" } }),
            el("td", { className: "role", text: row.role ? roleName(row.role) : "–" }),
            ...STAT_KEYS.map((k) => statCell(k, row[k])),
            el("td", {}, [sparkline(profile, stats.profile_bins || [])]),
          ]);
          statRows.push(row);
        }
      });
      for (const th of document.querySelectorAll("#head-table th[data-key]")) {
        th.onclick = () => {
          const k = th.dataset.key;
          ui.sort = { key: k, dir: ui.sort.key === k ? -ui.sort.dir : 1 };
          sortStats();
        };
      }
      $("head-table").tBodies[0].onclick = (e) => {
        const tr = e.target.closest("tr[data-layer]");
        if (tr) select({ layer: Number(tr.dataset.layer), heads: [Number(tr.dataset.head)] });
      };
    }
    sortStats();
  }

  function statCell(key, value) {
    const td = el("td", { text: Number.isFinite(value) ? value.toFixed(STAT_DIGITS[key]) : "–" });
    // shares of weight (0..1) get a faint background in proportion
    if (["previous", "first", "diagonal", "induction"].includes(key) && Number.isFinite(value)) {
      td.style.background = `rgba(84, 174, 255, ${Math.min(1, Math.max(0, value)) * 0.55})`;
    }
    // the loss a head's removal adds (nats a token): red where the head helped, a full shade at 0.5
    if (key === "ablation" && Number.isFinite(value) && value > 0) {
      td.style.background = `rgba(255, 99, 71, ${Math.min(1, value / 0.5) * 0.55})`;
    }
    return td;
  }

  /** A tiny bar chart (inline SVG: a canvas each row costs far more to paint) of a head's profile. */
  function sparkline(profile, bins) {
    const w = 64, h = 16, n = profile.length;
    const svg = document.createElementNS(SVGNS, "svg");
    svg.setAttribute("class", "spark");
    svg.setAttribute("width", String(w));
    svg.setAttribute("height", String(h));
    svg.setAttribute("viewBox", `0 0 ${w} ${h}`);
    let bars = "";   // one rectangle a bin (the baseline is the svg's CSS border)
    profile.forEach((v, b) => {
      const bh = Math.max(0, Math.min(1, Number(v))) * h;
      const bw = w / n;
      bars += `M${(b * bw + 0.5).toFixed(1)} ${h}v${(-bh).toFixed(2)}h${Math.max(1, bw - 1).toFixed(1)}v${bh.toFixed(2)}z`;
    });
    const path = document.createElementNS(SVGNS, "path");
    path.setAttribute("d", bars);
    const title = document.createElementNS(SVGNS, "title");
    title.textContent = profile.map((v, b) => `${bins[b] ?? b}: ${Number(v).toFixed(3)}`).join("\n");
    svg.append(title, path);
    return svg;
  }

  function sortStats() {
    const { key, dir } = ui.sort;
    const rows = statRows.slice();
    if (key) {
      // missing values last either way; ties by (layer, head)
      rows.sort((x, y) => {
        const a = x[key], b = y[key];
        if (typeof a === "string") {  // the role: unlabelled heads last either way
          if (!a !== !b) return a ? -1 : 1;
          return a.localeCompare(b) * dir || x.layer - y.layer || x.head - y.head;
        }
        if (Number.isNaN(a) !== Number.isNaN(b)) return Number.isNaN(a) ? 1 : -1;
        return (a - b) * dir || x.layer - y.layer || x.head - y.head;
      });
    }
    const body = $("head-table").tBodies[0];
    body.replaceChildren(...rows.map((r) => r.tr));
    for (const r of rows) r.tr.classList.toggle("selected", r.layer === state.layer && state.heads.includes(r.head));
    for (const th of document.querySelectorAll("#head-table th[data-key]")) {
      th.classList.toggle("sorted-asc", th.dataset.key === key && dir > 0);
      th.classList.toggle("sorted-desc", th.dataset.key === key && dir < 0);
    }
  }

  // ------------------------------------------------------------------ image view
  const images = new Map();   // document -> Promise<HTMLImageElement>

  function loadImage(d) {
    if (!images.has(d)) {
      const img = new Image();
      img.src = data.documents[d].image.src;
      images.set(d, img.decode().then(() => img, () => {
        images.delete(d);
        throw new Error(`document ${d}: the image could not be read`);
      }));
    }
    return images.get(d);
  }

  async function drawImageView(gen) {
    const d = state.doc, { doc } = current(), image = doc.image;
    const group = doc.groups[image.group];
    const [rows, cols] = image.grid;
    const prefix = image.prefix || 0, n = prefix + rows * cols;
    if (group.keys.length !== n) throw new Error(`image: ${group.name} has ${group.keys.length} keys, expected ${prefix} + ${rows}x${cols}`);
    const source = $("image-source");
    const choices = image.rollout ? [t("meanSource"), t("rolloutSource")] : [t("meanSource")];
    if (Array.from(source.options, (o) => o.text).join("\n") !== choices.join("\n")) {
      const was = source.value;
      setOptions(source, choices);
      if (Number(was) < choices.length) source.value = was;
    }
    const useRollout = image.rollout && source.value === "1";
    $("image-cls").hidden = prefix === 0;
    $("image-cls").textContent = t("queryButton", shown(group.queries[0]));

    const Lq = group.queries.length;
    let q = ui.imageQuery.get(d) ?? 0;   // default: the class token, or patch 0 (index 0 either way)
    q = Math.min(q, (useRollout ? n : Lq) - 1);
    const img = await loadImage(d);
    let row, what;
    if (useRollout) {
      const bytes = await rolloutBytes(d);
      row = Float32Array.from(bytes.subarray(q * n + prefix, q * n + n), (b) => b / 255);
      what = t("rolloutWhat");
    } else {
      const l = Math.min(state.layer, group.layers.length - 1), layer = group.layers[l];
      const bytes = await layerBytes(d, image.group, l);
      const heads = effectiveHeads(layer.heads);
      row = headRow(bytes, Lq, n, heads, q, prefix, n);
      what = t("layerWhat", groupName(group.name), l, layer.name, headsText(heads));
    }
    if (stale(gen)) return;

    const canvas = $("image-canvas");
    const scale = 320 / Math.max(img.naturalWidth, img.naturalHeight, 1);
    const W = Math.round(img.naturalWidth * scale), H = Math.round(img.naturalHeight * scale);
    const ctx = sizeCanvas(canvas, W, H);
    ctx.imageSmoothingEnabled = scale < 2;   // a small image is shown in its pixels
    ctx.drawImage(img, 0, 0, W, H);
    // the picture muted to grey, then each patch tinted orange in proportion to its weight: readable on dark
    // pictures (a digit on black) as on light ones
    ctx.fillStyle = "rgba(128, 128, 128, 0.45)";
    ctx.fillRect(0, 0, W, H);
    const max = Math.max(...row, 1e-9);
    const pw = W / cols, ph = H / rows;
    for (let p = 0; p < rows * cols; p++) {
      ctx.fillStyle = `rgba(255, 90, 0, ${(0.6 * row[p] / max).toFixed(3)})`;
      ctx.fillRect((p % cols) * pw, Math.floor(p / cols) * ph, pw, ph);
    }
    // the patches the model cut the image into, as thin lines
    ctx.strokeStyle = "rgba(255, 255, 255, 0.35)";
    ctx.lineWidth = 1;
    ctx.beginPath();
    for (let c = 1; c < cols; c++) { ctx.moveTo(Math.round(c * pw) + 0.5, 0); ctx.lineTo(Math.round(c * pw) + 0.5, H); }
    for (let r = 1; r < rows; r++) { ctx.moveTo(0, Math.round(r * ph) + 0.5); ctx.lineTo(W, Math.round(r * ph) + 0.5); }
    ctx.stroke();
    if (q >= prefix) {   // the query patch, outlined
      const p = q - prefix;
      ctx.lineWidth = 2.5;
      ctx.strokeStyle = "#00e5ff";
      ctx.strokeRect((p % cols) * pw + 1.25, Math.floor(p / cols) * ph + 1.25, pw - 2.5, ph - 2.5);
    }
    canvas.dataset.query = String(q);
    canvas.grid = { rows, cols, prefix, W, H };
    $("image-caption").textContent = t("imageCaption", q, shown(group.queries[q] ?? q), what, rows, cols,
      Math.min(...row).toFixed(3), max.toFixed(3));
  }

  function bindImage() {
    const canvas = $("image-canvas");
    canvas.addEventListener("click", (e) => {
      const g = canvas.grid;
      if (!g) return;
      const rect = canvas.getBoundingClientRect();
      const c = Math.min(g.cols - 1, Math.max(0, Math.floor(((e.clientX - rect.left) / g.W) * g.cols)));
      const r = Math.min(g.rows - 1, Math.max(0, Math.floor(((e.clientY - rect.top) / g.H) * g.rows)));
      ui.imageQuery.set(state.doc, g.prefix + r * g.cols + c);
      render();
    });
  }

  // ------------------------------------------------------------------ language-model view
  const lm = { doc: -1, spans: [], bytes: null, Lq: 0, Lk: 0, heads: [0], desc: "" };

  async function drawLmView(gen) {
    const d = state.doc, { doc } = current(), group = doc.groups[0];
    const l = Math.min(state.layer, group.layers.length - 1), layer = group.layers[l];
    const bytes = await layerBytes(d, 0, l);
    if (stale(gen)) return;
    const promptLen = doc.lm.prompt_len;
    if (lm.doc !== d) {
      lm.doc = d;
      lm.spans = group.queries.map((t, i) => el("span", {
        className: `lm-tok ${i < promptLen ? "prompt" : "generated"}`, text: String(t), title: `${i}: ${t}`, dataset: { i: String(i) },
      }));
      const text = $("lm-text");
      text.replaceChildren(...lm.spans);
      text.onmouseover = (e) => { const s = e.target.closest(".lm-tok"); if (s) showLm(Number(s.dataset.i)); };
      text.onmouseleave = () => showLm(pinned());
      text.onclick = (e) => {
        const s = e.target.closest(".lm-tok");
        if (s) { ui.lmPin.set(lm.doc, Number(s.dataset.i)); showLm(Number(s.dataset.i)); }
      };
    }
    Object.assign(lm, { bytes, Lq: group.queries.length, Lk: group.keys.length, heads: effectiveHeads(layer.heads) });
    lm.desc = t("lmDesc", l, layer.name, headsText(lm.heads));
    showLm(pinned());
  }

  /** The position shown when nothing is hovered: the one clicked, else the prompt's last. */
  function pinned() {
    const promptLen = data.documents[lm.doc].lm.prompt_len;
    return ui.lmPin.get(lm.doc) ?? Math.max(0, Math.min(promptLen, lm.Lq) - 1);
  }

  /** Shades the tokens up to i by token i's attention and lists the model's next tokens after i. */
  function showLm(i) {
    const doc = data.documents[lm.doc];
    const group = doc.groups[0];
    const row = headRow(lm.bytes, lm.Lq, lm.Lk, lm.heads, i, 0, Math.min(i + 1, lm.Lk));
    lm.spans.forEach((span, j) => {
      const w = j <= i && j < row.length ? row[j] : 0;
      span.style.backgroundColor = w > 0 ? `rgba(33, 113, 181, ${w.toFixed(4)})` : "";
      span.style.color = w > 0.55 ? "#fff" : "";
      span.classList.toggle("current", j === i);
    });
    const top = doc.lm.top?.[i] || [];
    const next = group.queries[i + 1];
    $("lm-caption").textContent = t("lmAfter", i, shown(group.queries[i]), lm.desc, top.length > 0);
    $("topk").replaceChildren(...top.map(([token, p]) => el("tr", { className: token === next ? "actual" : "" }, [
      el("td", { className: "token", text: shown(token) }),
      el("td", { className: "bar" }, [el("div", { className: "bar-fill", style: { width: `${Math.max(0, Math.min(1, p)) * 100}%` } })]),
      el("td", { className: "prob", text: Number(p).toFixed(3) }),
    ])));
  }

  // ------------------------------------------------------------------ translation view
  const TRANSLATION_GROUPS = ["encoder self-attention", "cross-attention", "decoder self-attention"];

  async function drawTranslationView(gen) {
    const d = state.doc, { doc } = current();
    const panels = [];
    for (const name of TRANSLATION_GROUPS) {
      const g = doc.groups.findIndex((x) => x.name === name);
      const panel = el("div", { className: `panel${name === "cross-attention" ? " middle" : ""}` });
      panels.push(panel);
      if (g < 0) {
        panel.append(el("h3", { text: groupName(name) }), el("p", { className: "caption", text: t("missingGroup") }));
        continue;
      }
      const group = doc.groups[g];
      const has = state.layer < group.layers.length;
      const l = has ? state.layer : group.layers.length - 1, layer = group.layers[l];
      const bytes = await layerBytes(d, g, l);
      if (stale(gen)) return;
      const heads = effectiveHeads(layer.heads);
      const canvas = el("canvas", { className: "matrix", id: `translation-${name.split(" ")[0]}` });
      panel.append(
        el("h3", { text: groupName(name) }),
        el("p", { className: "caption", text: t("panelCaption", l, layer.name, has, state.layer, headsText(heads)) }),
        el("div", { className: "scroll" }, [el("div", { className: "matrix-frame" }, [canvas])]),
      );
      const Lq = group.queries.length, Lk = group.keys.length;
      drawMatrix(canvas, { vals: headMap(bytes, Lq, Lk, heads), Lq, Lk, qLabels: group.queries, kLabels: group.keys, maxPx: PANEL_PX });
    }
    $("translation-panels").replaceChildren(...panels);
  }

  const VIEWS = {
    head: drawHeadView, model: drawModelView, matrix: drawMatrixView,
    image: drawImageView, lm: drawLmView, translation: drawTranslationView,
  };

  // ------------------------------------------------------------------ start
  /** The test hook's weights: a layer's (heads * Lq * Lk) values byte / 255. */
  async function weights(d, g, l) {
    const group = data.documents[d]?.groups?.[g];
    if (!group || !group.layers[l]) throw new Error(`no layer ${l} in group ${g} of document ${d}`);
    const bytes = await layerBytes(d, g, l);
    const out = new Float32Array(bytes.length);
    for (let x = 0; x < bytes.length; x++) out[x] = bytes[x] / 255;
    return out;
  }

  /** A new width of the head view redraws it, its lines taking the width there is: a window resized,
   * or a frame (a report's) that starts at the browser's default size and takes its own a moment
   * later. The width compared is the one the lines were laid out for. */
  function bindResize() {
    let timer = 0;
    const changed = () => {
      clearTimeout(timer);
      timer = setTimeout(() => {
        const width = $("view-head").clientWidth;
        // a scrollbar that the view's own lines bring or take is not a new width (the redraw would move
        // them under the reader's pointer): a frame sized, or shown, after the first draw is
        if (state.view !== "head" || width === 0 || Math.abs(width - headFrameWidth) < SCROLLBAR_PX) return;
        headFrameWidth = width;  // once for this width, whichever layout draws
        render();
      }, 150);
    };
    window.addEventListener("resize", changed);
    new ResizeObserver(changed).observe($("view-head"));  // also a frame shown or sized without a resize event
  }

  let started = false;

  function start() {
    // the page's language: the data's, else English; a later load() keeps the one the reader chose
    if (!started) state.lang = known(TEXTS, data.lang) ? data.lang : "en";
    $("title").textContent = data.title || t("title");
    $("subtitle").textContent = data.subtitle || "";
    $("notes").replaceChildren(...(data.notes || []).map((n) => el("div", { className: "note", text: n })));
    if (data.format !== "attnlab-explorer/1") showError(new Error(`unknown data format ${JSON.stringify(data.format)}`));
    if (!data.documents || !data.documents.length) throw new Error("the data holds no document");
    $("doc-control").hidden = data.documents.length < 2;
    synced.lang = "";   // the inputs' names are labelled anew
    if (!started) {  // the controls are bound once; a later load() keeps them
      started = true;
      $("threshold").value = String(ui.threshold);
      bindControls();
      bindImage();
      bindResize();
      applyChange({});
      state.heads = defaultHeads(current().layer.heads);
    } else {
      applyChange({ doc: Math.min(state.doc, data.documents.length - 1) });
    }
    return render();
  }

  /** New data in the page (a page built on the explorer, the lab, after each edit): what was
   * decoded or drawn of the old data is dropped; the view, layer and heads stay where the new
   * data has them. Resolves once the view is drawn. */
  function load(next) {
    data = next;
    decoded.clear();
    modelGrids.clear();
    images.clear();
    ui.imageQuery.clear();
    ui.lmPin.clear();
    statsKey = "";
    clearError();
    return start();
  }

  let ready;
  try {
    data = JSON.parse($("attnlab-data").textContent);
    ready = start();
  } catch (err) {
    showError(err);
    document.body.dataset.ready = "1";
    ready = Promise.resolve();
  }
  ready = ready.then(() => { performance.mark("attnlab-ready"); });
  window.attnlabExplorer = { ready, state, select, setLanguage, weights, load, figure, drawMatrixOf, current: () => data };
})();
