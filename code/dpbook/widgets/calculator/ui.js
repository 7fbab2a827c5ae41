/* The calculators' page logic: read a panel's form, call window.dpbookCalc, draw the result,
   keep the inputs in the URL hash under "<key>.<panel>.<field>" (the calculator's own keys
   only: other calculators' keys on the page are left as they are). */
(function () {
  var C = window.dpbookCalc;
  if (C.mount) { return; }
  var vi = C.vi, GB = 1e9, NARROW = "\u202f", SVGNS = "http://www.w3.org/2000/svg";
  var COLOURS = {params: "#0072B2", grads: "#E69F00", optimizer: "#009E73", buffers: "#56B4E9",
                 activations: "#CC79A7"};
  // bottom to top, as memory.Ledger.total adds them: the state, DDP's bucket copy, activations
  var KINDS = [["params", "tham số"], ["grads", "gradient"], ["optimizer", "trạng thái bộ tối ưu"],
               ["buffers", "bộ đệm bucket của DDP"], ["activations", "activation"]];
  var PRESET_FIELDS = {num_params: "num_params", largest_unit_params: "largest_unit",
                       root_unit_params: "root_unit"};
  // The library's arguments, each with the field a reader types it in, often in other units (GB
  // for bytes, ms for seconds, % for a fraction). A library message names the argument and
  // quotes the converted value; the reader is shown the field's label and what was typed.
  var ARGS = {num_params: "num_params", param_bytes: "num_params",
              largest_unit_params: "largest_unit_params", root_unit_params: "root_unit_params",
              root_bytes: "root_params", world_size: "world_size", shard_size: "shard_size",
              nodes: "nodes", gpus_per_node: "gpus_per_node", messages: "messages",
              activation_bytes: "activation_gb", activation_gb: "activation_gb",
              compute_seconds: "compute_ms", alpha_intra: "alpha_intra_us",
              bandwidth_intra: "bandwidth_intra_gbs", alpha_inter: "alpha_inter_us",
              bandwidth_inter: "bandwidth_inter_gbs", headroom: "headroom_pct", host_gb: "host_gb"};
  var NUM = "-?[0-9]+(?:\\.[0-9]+)?(?:e[+-]?[0-9]+)?";
  var ARG_RE = new RegExp("\\b(" + Object.keys(ARGS).join("|") + ")\\b(?:=(" + NUM + "))?", "g");

  function gb(x, d) { return vi.number(x / GB, d === undefined ? 2 : d, {group: NARROW}); }
  function esc(s) {
    return String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  }
  function readHash() {
    var out = {}, h = location.hash.replace(/^#/, "");
    if (!h) { return out; }
    h.split("&").forEach(function (part) {
      var i = part.indexOf("=");
      if (i > 0) { out[decodeURIComponent(part.slice(0, i))] = decodeURIComponent(part.slice(i + 1)); }
    });
    return out;
  }
  function writeHash(own, prefix) {
    var all = readHash(), parts = [];
    Object.keys(all).forEach(function (k) { if (k.indexOf(prefix) !== 0) { parts.push([k, all[k]]); } });
    Object.keys(own).forEach(function (k) { parts.push([prefix + k, own[k]]); });
    var h = parts.map(function (p) { return encodeURIComponent(p[0]) + "=" + encodeURIComponent(p[1]); }).join("&");
    var url = location.href.split("#")[0] + (h ? "#" + h : "");
    try { history.replaceState(null, "", url); } catch (e) { location.hash = h; }
  }

  function field(panel, name) { return panel.querySelector('[name="' + name + '"]'); }
  function quoted(el) { return "“" + el.dataset.label + "”"; }
  function typed(el) { return el.value.replace(".", ","); }  // as typed, with the book's decimal comma
  function range(el) {  // the LIMITS of render.py, in words
    var lo = vi.grouped(Number(el.dataset.min)), hi = vi.grouped(Number(el.dataset.max));
    var upto = el.dataset.maxOpen === "1" ? "dưới " + hi : hi;
    return el.dataset.minOpen === "1" ? "lớn hơn " + lo + " và " + (el.dataset.maxOpen === "1" ? "" : "không quá ") + upto
                                      : "từ " + lo + " đến " + upto;
  }
  // Each field is checked here, in the reader's units, before any formula runs: an empty field
  // would reach the library as NaN and come back as "nan" or as a wrong verdict. The first field
  // at fault, in the form's order, is the message.
  function checkFields(panel) {
    var els = panel.querySelectorAll("input[data-kind]");
    for (var i = 0; i < els.length; i++) {
      var el = els[i], whole = el.dataset.kind === "int", x = Number(el.value);
      if (el.disabled) { continue; }
      var want = (whole ? "số nguyên" : "số") + " " + range(el);
      if (el.value === "") {  // a number input gives "" for text that is no number, too
        return "Ô " + quoted(el) + (el.validity && el.validity.badInput ? " không chứa một số" : " đang trống") +
               ": hãy nhập một " + want + ".";
      }
      var lo = Number(el.dataset.min), hi = Number(el.dataset.max);
      if (!isFinite(x) || (whole && !Number.isInteger(x)) || x < lo || x > hi ||
          (el.dataset.minOpen === "1" && x === lo) || (el.dataset.maxOpen === "1" && x === hi)) {
        return quoted(el) + " phải là " + want + ", nhận được " + typed(el) + ".";
      }
    }
    return null;
  }
  // A library message, for a rule between fields that only the library checks, in the form's words.
  function speak(message, inputs, panel) {
    var subject = null;
    var text = message.replace(ARG_RE, function (all, name, value) {
      var el = field(panel, ARGS[name]);
      if (!el) { return all; }
      subject = subject || name;
      if (value === undefined) { return quoted(el); }
      return quoted(el) + " = " + (value === C.repr(inputs[name]) ? typed(el) : value);
    });
    if (subject && inputs[subject] !== undefined) {
      var got = C.repr(inputs[subject]).replace(/[.+]/g, "\\$&");
      text = text.replace(new RegExp("nhận được " + got + "(?![0-9e]|\\.[0-9])"),
                          "nhận được " + typed(field(panel, ARGS[subject])));
    }
    return text;
  }
  function scroller(table) {  // a table wider than a phone scrolls inside its own box
    return '<div class="dpc-scroll" tabindex="0" role="region" aria-label="Bảng kết quả (cuộn ngang)">' +
           table + "</div>";
  }

  function values(panel) {  // the form as typed, and as the library's inputs (bytes, seconds)
    var v = {};
    panel.querySelectorAll("[name]").forEach(function (el) {
      v[el.name] = el.dataset.kind === "text" ? el.value : (el.value === "" ? NaN : Number(el.value));
    });
    return v;
  }
  function model(v) {  // what the library takes about the model: a preset, or the counts typed
    if (v.preset) { return {preset: v.preset}; }
    var out = {num_params: v.num_params};
    if (v.largest_unit_params !== undefined) { out.largest_unit_params = v.largest_unit_params; }
    if (v.root_unit_params !== undefined) { out.root_unit_params = v.root_unit_params; }
    return out;
  }
  function merge(a, b) { var o = {}, k; for (k in a) { o[k] = a[k]; } for (k in b) { o[k] = b[k]; } return o; }

  // --- the ledger: one stacked bar per strategy against the cards
  function svgEl(tag, attrs, text) {
    var e = document.createElementNS(SVGNS, tag);
    for (var k in attrs) { e.setAttribute(k, attrs[k]); }
    if (text !== undefined) { e.textContent = text; }
    return e;
  }
  function ledgerOut(v, out, panel) {
    var base = merge(model(v), {world_size: v.world_size, precision: v.precision, optimizer: v.optimizer,
                                phase: v.phase, shard_size: v.shard_size,
                                activation_bytes: v.activation_gb * GB,
                                bucket_view: v.bucket_view === "1"});
    var asked = merge(base, {strategy: v.strategy}), chosen = C.ledger(asked);
    if (chosen.error) { return speak(chosen.error, asked, panel); }
    var bars = C.data.memory.strategies.map(function (s) { return [s, C.ledger(merge(base, {strategy: s}))]; });
    var cards = C.data.cards, maxCard = Math.max.apply(null, cards.map(function (c) { return c.usable_bytes; }));
    var tallest = Math.max.apply(null, bars.map(function (b) { return b[1].error ? 0 : b[1].total; }));
    var top = (tallest > 1.3 * maxCard ? 1.15 * maxCard : Math.max(tallest, maxCard)) * 1.08;
    var W = 1000, X0 = 120, X1 = 860, Y0 = 60, Y1 = 380, slot = (X1 - X0) / bars.length;
    var svg = svgEl("svg", {viewBox: "0 0 " + W + " 440", role: "img",
                            "aria-label": "Sổ kế toán VRAM mỗi GPU"});
    function y(b) { return Y1 - (Y1 - Y0) * Math.min(b, top) / top; }
    var lx = X0;
    KINDS.forEach(function (k) {
      svg.appendChild(svgEl("rect", {x: lx, y: 14, width: 16, height: 16, fill: COLOURS[k[0]]}));
      svg.appendChild(svgEl("text", {x: lx + 22, y: 27, "font-size": 17}, k[1]));
      lx += 40 + 9 * k[1].length;
    });
    svg.appendChild(svgEl("line", {x1: X0, y1: Y1, x2: X1, y2: Y1, stroke: "#111"}));
    svg.appendChild(svgEl("text", {x: 8, y: Y0 - 10, "font-size": 15}, "GB mỗi GPU"));
    for (var t = 0; t <= 4; t++) {
      var val = top * t / 4;
      svg.appendChild(svgEl("text", {x: X0 - 8, y: y(val) + 5, "font-size": 15, "text-anchor": "end"},
                            vi.short(val / GB)));
    }
    bars.forEach(function (b, i) {
      var cx = X0 + slot * (i + 0.5), w = Math.min(0.6 * slot, 70), led = b[1], acc = 0;
      var sel = b[0] === v.strategy;
      svg.appendChild(svgEl("text", {x: cx, y: Y1 + 22 + (i % 2 ? 22 : 0), "font-size": 14, "text-anchor": "middle",
                                     "font-weight": sel ? "bold" : "normal"}, b[0]));
      if (led.error) {
        svg.appendChild(svgEl("text", {x: cx, y: Y1 - 10, "font-size": 14, "text-anchor": "middle"}, "—"));
        return;
      }
      KINDS.forEach(function (k) {
        var h = led[k[0]];
        if (h > 0 && acc < top) {
          svg.appendChild(svgEl("rect", {x: cx - w / 2, y: y(acc + h), width: w, height: y(acc) - y(acc + h),
                                         fill: COLOURS[k[0]], stroke: sel ? "#000" : "#555",
                                         "stroke-width": sel ? 3 : 1}));
        }
        acc += h;
      });
      svg.appendChild(svgEl("text", {x: cx, y: y(led.total) - 8, "font-size": 14, "text-anchor": "middle",
                                     "font-weight": "bold"}, (led.total > top ? "↑ " : "") + vi.nbytes(led.total)));
    });
    cards.forEach(function (c) {
      if (c.usable_bytes > top) { return; }
      var cy = y(c.usable_bytes);
      svg.appendChild(svgEl("line", {x1: X0, y1: cy, x2: X1, y2: cy, stroke: "#D55E00",
                                     "stroke-dasharray": "8 5", "stroke-width": 2}));
      svg.appendChild(svgEl("text", {x: X1 + 6, y: cy + 5, "font-size": 14, fill: "#D55E00"},
                            c.name + " " + vi.short(c.usable_bytes / GB) + " GB"));
    });
    var fits = cards.map(function (c, i) { return esc(c.name) + (chosen.fits[i] ? " ✓" : " ✗"); }).join(", ");
    out.innerHTML = "<p><b>" + esc(v.strategy) + ", N = " + v.world_size + "</b>: tham số " + gb(chosen.params) +
      " + gradient " + gb(chosen.grads) + " + trạng thái bộ tối ưu " + gb(chosen.optimizer) +
      (v.strategy === "DDP" ? " + bộ đệm bucket của DDP " + gb(chosen.buffers) : "") +
      " + activation " + gb(chosen.activations) + " = <b>" + gb(chosen.total) +
      " GB</b> mỗi GPU (GB = 10⁹ byte). Vừa card (phần PyTorch cấp phát được): " + fits + ".</p>";
    out.insertBefore(svg, out.firstChild);
    return null;
  }

  // --- communication and time of one step, every strategy of dpbook.costs
  function trafficOut(v, out, panel) {
    var b = Number(v.comm_bytes), rows = [], error = null;
    var P = v.preset ? C.data.presets[v.preset].num_params : v.num_params;
    var common = {param_bytes: P * b, root_bytes: v.root_params * b, nodes: v.nodes,
                  gpus_per_node: v.gpus_per_node};
    C.data.costs.strategies.forEach(function (s) {
      var root = s === "DDP" || s === "NO_SHARD" ? 0 : common.root_bytes;
      var asked = merge(common, {strategy: s, root_bytes: root, compute_seconds: v.compute_ms / 1e3,
                                 messages: v.messages, alpha_intra: v.alpha_intra_us * 1e-6,
                                 bandwidth_intra: v.bandwidth_intra_gbs * GB,
                                 alpha_inter: v.alpha_inter_us * 1e-6,
                                 bandwidth_inter: v.bandwidth_inter_gbs * GB});
      var bytes = C.stepBytes(merge(common, {strategy: s, root_bytes: root})), time = C.stepTime(asked);
      if (bytes.error || time.error) {
        error = error || speak(bytes.error || time.error, asked, panel);
        return;
      }
      rows.push("<tr><td>" + s + "</td><td>" + gb(bytes.all_gather_forward) + "</td><td>" +
                gb(bytes.all_gather_backward) + "</td><td>" + gb(bytes.reduce_scatter) + "</td><td>" +
                gb(bytes.all_reduce) + "</td><td><b>" + gb(bytes.total) + "</b></td><td>" +
                gb(bytes.internode_bytes) + "</td><td>" + vi.ms(time.comm_seconds, 1) + "</td><td>" +
                vi.ms(time.serial_seconds, 1) + "</td><td><b>" + vi.ms(time.overlap_seconds, 1) +
                "</b></td></tr>");
    });
    if (error) { return error; }
    out.innerHTML = scroller("<table><thead><tr><th>Chiến lược</th><th>AllGather xuôi</th><th>AllGather ngược</th>" +
      "<th>ReduceScatter</th><th>AllReduce</th><th>Gửi mỗi GPU</th><th>Ra khỏi mỗi node</th>" +
      "<th>Giao tiếp</th><th>Không chồng lấp</th><th>Cận dưới khi chồng lấp</th></tr></thead><tbody>" +
      rows.join("") + "</tbody></table>") + "<p>Byte mỗi bước tính bằng GB (10⁹ byte), mỗi GPU gửi (và nhận " +
      "bằng chừng ấy); thời gian theo mô hình alpha-beta: mỗi vòng ring chạy theo liên kết chậm nhất, " +
      "HYBRID_SHARD chia trong một node.</p>";
    return null;
  }

  // --- the decision rule of 4.1.8: every rung of the ladder, the lowest that fits chosen
  function decisionOut(v, out, panel) {
    var asked = merge(model(v), {gpu: v.gpu, nodes: v.nodes, gpus_per_node: v.gpus_per_node,
                                 precision: v.precision, optimizer: v.optimizer,
                                 activation_gb: v.activation_gb, headroom: v.headroom_pct / 100,
                                 allow_checkpointing: v.allow_checkpointing === "1",
                                 allow_offload: v.allow_offload === "1", host_gb: v.host_gb,
                                 bucket_view: v.bucket_view === "1"});
    var rec = C.recommend(asked);
    if (rec.error) { return speak(rec.error, asked, panel); }
    var rows = rec.ladder.map(function (o) {
      var chosen = rec.choice !== null && o.label === rec.label;
      var open = chosen ? "<b>" : "", shut = chosen ? "</b>" : "";
      return "<tr><td>" + open + esc(o.label) + shut + "</td><td>" + gb(o.memory_bytes, 1) + (o.fits ? "\u00a0✓" : "\u00a0✗") +
             "</td><td>" + (o.offload ? gb(o.host_bytes, 1) : "—") + "</td><td>" +
             (o.offload ? gb(o.pcie_bytes, 1) : "—") + "</td><td>" + gb(o.sent_bytes, 1) + "</td><td>" +
             gb(o.internode_bytes, 1) + "</td></tr>";
    });
    out.innerHTML = '<div class="dpc-choice">' + esc(rec.choice ? "Chọn " + rec.label : "Không phương án nào vừa") +
      "</div><p>" + esc(rec.reason) + "</p>" + scroller("<table><thead><tr><th>Bậc (từ thấp lên)</th><th>GPU (GB)</th>" +
      "<th>CPU mỗi node (GB)</th><th>PCIe mỗi GPU mỗi bước (GB)</th><th>Gửi mỗi GPU mỗi bước (GB)</th>" +
      "<th>Ra khỏi mỗi node (GB)</th></tr></thead><tbody>" + rows.join("") +
      "</tbody></table>") + "<p>Dùng được mỗi GPU: " + gb(rec.capacity_bytes, 1) + " GB; bộ nhớ CPU mỗi node cho offload: " +
      gb(rec.host_capacity_bytes, 1) + " GB; số khối được tính lại: " + rec.num_blocks + ".</p>";
    return null;
  }
  var OUT = {ledger: ledgerOut, traffic: trafficOut, decision: decisionOut};

  function syncPreset(panel) {
    var sel = panel.querySelector('[name="preset"]'), p = sel && sel.value ? C.data.presets[sel.value] : null;
    Object.keys(PRESET_FIELDS).forEach(function (f) {
      var el = panel.querySelector('[name="' + f + '"]');
      if (!el) { return; }
      el.disabled = !!p;
      if (p) { el.value = p[PRESET_FIELDS[f]]; }
    });
  }
  function update(panel) {
    syncPreset(panel);
    var error = null, out = panel.querySelector(".dpc-out");
    try {
      error = checkFields(panel) || OUT[panel.dataset.panel](values(panel), out, panel);
    } catch (e) { error = String(e); }
    panel.querySelector(".dpc-error").textContent = error || "";
    if (error) { out.innerHTML = ""; }
  }

  C.mount = function (rootId) {
    var root = document.getElementById(rootId);
    if (!root) { return; }
    var key = root.dataset.key, panels = root.querySelectorAll(".dpc-panel");
    function save() {
      var own = {};
      panels.forEach(function (panel) {
        panel.querySelectorAll("[name]").forEach(function (el) {
          if (!el.disabled && el.value !== el.dataset.default) { own[panel.dataset.panel + "." + el.name] = el.value; }
        });
      });
      writeHash(own, key + ".");
    }
    function load() {
      var h = readHash();
      panels.forEach(function (panel) {
        panel.querySelectorAll("[name]").forEach(function (el) {
          var k = key + "." + panel.dataset.panel + "." + el.name;
          el.value = h[k] !== undefined ? h[k] : el.dataset.default;
        });
        update(panel);
      });
    }
    panels.forEach(function (panel) {
      panel.addEventListener("input", function () { update(panel); save(); });
      panel.addEventListener("change", function () { update(panel); save(); });
    });
    root.querySelector(".dpc-present-btn").onclick = function () { root.classList.toggle("dpc-present"); };
    root.querySelector(".dpc-full-btn").onclick = function () {
      if (document.fullscreenElement) { document.exitFullscreen(); } else if (root.requestFullscreen) { root.requestFullscreen(); }
    };
    root.querySelector(".dpc-reset-btn").onclick = function () { writeHash({}, key + "."); load(); };
    window.addEventListener("hashchange", load);
    load();
    C.panels[rootId] = {load: load, update: function () { panels.forEach(update); }};
  };
})();
