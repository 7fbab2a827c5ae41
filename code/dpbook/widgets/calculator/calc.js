/* The book's calculators, offline: the formulas of dpbook.memory, dpbook.costs and
   dpbook.decision, and the number formatter of dpbook.vi, in plain JavaScript.
   window.dpbookCalc.{ledger, stepBytes, stepTime, recommend} take the Python keyword arguments
   as one object and return the Python fields (bytes, seconds), or {error: message} with the
   Vietnamese message of the Python ValueError. tests/widgets/test_calculator.py checks them
   against Python in headless Chromium. The tables (presets, cards, bytes per parameter) come
   from Python as JSON (DATA below); only the formulas are written twice.
   JavaScript has one kind of number: an integral value counts as a Python int. */
(function () {
  if (window.dpbookCalc) { return; }
  var DATA = JSON.parse(document.querySelector("script.dpbook-calc-data").textContent);
  var GB = 1e9, MB = 1e6, KB = 1e3, NARROW = "\u202f";

  // --- Python's repr, for the messages of dpbook.checks
  function repr(v) {
    if (v === null || v === undefined) { return "None"; }
    if (v === true) { return "True"; }
    if (v === false) { return "False"; }
    if (typeof v === "string") {
      var q = v.indexOf("'") >= 0 && v.indexOf('"') < 0 ? '"' : "'";
      var body = v.replace(/\\/g, "\\\\");
      if (q === "'") { body = body.replace(/'/g, "\\'"); }
      return q + body + q;
    }
    if (typeof v === "number") {
      if (isNaN(v)) { return "nan"; }
      if (!isFinite(v)) { return v > 0 ? "inf" : "-inf"; }
      if (Number.isInteger(v) && Math.abs(v) < 1e16) { return String(v); }
      var e = v.toExponential(), m = e.split("e"), exp = parseInt(m[1], 10);
      if (exp < -4 || exp >= 16) {
        return m[0] + "e" + (exp < 0 ? "-" : "+") + (Math.abs(exp) < 10 ? "0" : "") + Math.abs(exp);
      }
      return String(v);
    }
    if (Array.isArray(v)) { return "[" + v.map(repr).join(", ") + "]"; }
    return String(v);
  }
  function tuple(items) {
    return "(" + items.map(repr).join(", ") + (items.length === 1 ? ",)" : ")");
  }
  function fail(message) { var e = new Error(message); e.dpbook = true; throw e; }
  function isInt(v) { return typeof v === "number" && Number.isInteger(v); }
  function oneOf(name, value, allowed) {
    if (allowed.indexOf(value) < 0) {
      fail(name + "=" + repr(value) + " không hợp lệ; chỉ nhận một trong " + tuple(allowed) + ".");
    }
  }
  function intAtLeast(name, value, minimum) {
    minimum = minimum === undefined ? 1 : minimum;
    if (!isInt(value) || value < minimum) {
      fail(name + " phải là số nguyên >= " + minimum + ", nhận được " + repr(value) + ".");
    }
  }
  function nonNegative(name, value) {
    if (typeof value !== "number" || value < 0) {
      fail(name + " phải là số không âm, nhận được " + repr(value) + ".");
    }
  }
  function positive(name, value) {
    if (typeof value !== "number" || !(value > 0)) {
      fail(name + " phải là số dương, nhận được " + repr(value) + ".");
    }
  }
  function pick(inputs, name, fallback) {
    return inputs[name] === undefined ? fallback : inputs[name];
  }

  // --- dpbook.vi: Python's format(x, ",.{d}f") with a decimal comma and the given grouping
  function increment(digits) {
    var out = digits.split(""), i = out.length - 1;
    while (i >= 0) {
      if (out[i] === "9") { out[i] = "0"; i -= 1; } else { out[i] = String(+out[i] + 1); break; }
    }
    return (i < 0 ? "1" : "") + out.join("");
  }
  function fixed(x, d) {  // format(x, f".{d}f"): the exact binary value, ties to even
    if (isNaN(x)) { return "nan"; }
    if (!isFinite(x)) { return x > 0 ? "inf" : "-inf"; }
    var neg = x < 0 || (x === 0 && 1 / x < 0), s = Math.abs(x).toFixed(Math.min(100, d + 40));
    // From 1e21 on toFixed writes an exponent; such a double is a whole number, and BigInt
    // gives its exact digits, as Python prints them.
    if (Math.abs(x) >= 1e21) { s = BigInt(Math.abs(x)).toString() + "." + "0".repeat(d + 1); }
    var dot = s.indexOf("."), ip = s.slice(0, dot), fp = s.slice(dot + 1);
    var keep = fp.slice(0, d), rest = fp.slice(d), digits = ip + keep;
    var last = +digits[digits.length - 1];
    if (rest[0] > "5" || (rest[0] === "5" && (/[1-9]/.test(rest.slice(1)) || last % 2 === 1))) {
      digits = increment(digits);
    }
    var head = digits.slice(0, digits.length - d), tail = digits.slice(digits.length - d);
    return (neg ? "-" : "") + head + (d > 0 ? "." + tail : "");
  }
  function number(x, decimals, opts) {
    opts = opts || {};
    decimals = decimals || 0;
    var group = opts.group || "", text = fixed(x, decimals);
    if (opts.trim && text.indexOf(".") >= 0) { text = text.replace(/0+$/, "").replace(/\.$/, ""); }
    var neg = text[0] === "-", body = neg ? text.slice(1) : text, dot = body.indexOf(".");
    var ip = dot < 0 ? body : body.slice(0, dot), fp = dot < 0 ? "" : body.slice(dot + 1);
    if (group && /^[0-9]+$/.test(ip)) { ip = ip.replace(/\B(?=(\d{3})+(?!\d))/g, group); }
    var sign = neg ? "-" : (opts.sign ? "+" : "");
    return sign + ip + (dot < 0 ? "" : "," + fp);
  }
  function short(x) { return number(x, x >= 100 ? 0 : x >= 10 ? 1 : 2, {trim: true}); }
  function nbytes(n) {
    var units = [["GB", GB], ["MB", MB], ["KB", KB]];
    for (var i = 0; i < units.length; i++) {
      if (n >= units[i][1]) { return short(n / units[i][1]) + " " + units[i][0]; }
    }
    return short(n) + " B";
  }
  function grouped(n, sep) { return number(n, 0, {group: sep === undefined ? NARROW : sep}); }
  function percent(f, d) { return number(100 * f, d === undefined ? 1 : d) + "%"; }
  function ms(s, d) { return number(s * 1e3, d === undefined ? 2 : d) + " ms"; }

  // --- dpbook.memory.vram_ledger
  var M = DATA.memory;
  function applyPreset(a, keys) {
    if (a.preset === undefined) { return a; }
    oneOf("preset", a.preset, Object.keys(DATA.presets));
    var p = DATA.presets[a.preset], out = {};
    for (var k in a) { if (k !== "preset") { out[k] = a[k]; } }
    out.num_params = p.num_params;
    out[keys[0]] = p.largest_unit;
    out[keys[1]] = p.root_unit;
    return out;
  }
  function bytesPerParam(precision, optimizer) {
    oneOf("precision", precision, M.precisions);
    oneOf("optimizer", optimizer, M.optimizers);
    return M.bytes_per_param[precision][optimizer];
  }
  function vramLedger(a) {
    var P = a.num_params, N = pick(a, "world_size", 1), strategy = pick(a, "strategy", "DDP");
    var phase = pick(a, "phase", "rest"), S = pick(a, "shard_size", null);
    var unit = pick(a, "largest_unit_params", 0), root = pick(a, "root_unit_params", 0);
    var act = pick(a, "activation_bytes", 0);
    intAtLeast("num_params", P);
    intAtLeast("world_size", N);
    oneOf("strategy", strategy, M.strategies);
    oneOf("phase", phase, M.phases);
    if (strategy === "HYBRID_SHARD" && !(isInt(S) && S >= 1 && N % S === 0)) {
      fail("HYBRID_SHARD cần shard_size là ước số nguyên dương của world_size=" + N +
           " (thường là số GPU mỗi máy), nhận được " + repr(S) + ".");
    }
    if (!(isInt(unit) && isInt(root) && unit >= 0 && root >= 0 && unit + root <= P)) {
      fail("largest_unit_params và root_unit_params phải là số nguyên không âm, tổng (số tham " +
           "số gom về cùng lúc) không quá num_params=" + P + "; nhận được " + repr(unit) +
           " và " + repr(root) + ".");
    }
    nonNegative("activation_bytes", act);
    var offload = pick(a, "offload", false), view = pick(a, "bucket_view", false);
    if (typeof offload !== "boolean") { fail("offload phải là True hoặc False, nhận được " + repr(offload) + "."); }
    if (offload && M.offload_strategies.indexOf(strategy) < 0) {
      fail("offload=True chỉ dùng được với các chiến lược FSDP " + tuple(M.offload_strategies) +
           " (CPUOffloadPolicy); PyTorch không có CPU offload cho " + strategy + ", nhận được strategy=" +
           repr(strategy) + ".");
    }
    if (typeof view !== "boolean") { fail("bucket_view phải là True hoặc False, nhận được " + repr(view) + "."); }
    var b = bytesPerParam(pick(a, "precision", "fp32"), pick(a, "optimizer", "adam"));
    var n = strategy === "HYBRID_SHARD" ? S : N, sh = M.sharded[strategy];
    if (offload) {
      var onGpu = phase === "rest" ? 0 : (strategy === "SHARD_GRAD_OP" ? P * b[0] : (unit + root) * b[0]);
      var off = {params: onGpu, grads: 0, optimizer: 0, activations: act, host: P * (b[0] + b[1] + b[2]) / n,
                 buffers: 0};
      return totals(off);
    }
    var params = P * b[0] / (sh[0] ? n : 1);
    if (phase === "step" && strategy === "SHARD_GRAD_OP") {
      params = P * b[0];
    } else if (phase === "step" && ["FULL_SHARD", "ZeRO-3", "HYBRID_SHARD"].indexOf(strategy) >= 0) {
      params += (unit + root) * b[0] * (n - 1) / n;
    }
    // DDP's bucket copy of the gradients (memory.Ledger.buffers), none with bucket_view
    var led = {params: params, grads: P * b[1] / (sh[1] ? n : 1),
               optimizer: P * b[2] / (sh[2] ? n : 1), activations: act, host: 0,
               buffers: strategy === "DDP" && !view ? P * b[1] : 0};
    return totals(led);
  }
  function totals(led) {  // memory.Ledger.state and .total
    led.state = led.params + led.grads + led.optimizer;
    led.total = led.state + led.buffers + led.activations;
    return led;
  }
  function zeroRedundancyLedger(P, N, optimizer, act) {  // memory.zero_redundancy_ledger, bucket_view=True
    oneOf("optimizer", optimizer, M.optimizers);
    var b = M.zero_redundancy_bytes[optimizer];
    return totals({params: P * b[0], grads: P * b[1], optimizer: P * b[2] / N, activations: act, host: 0,
                   buffers: 0});
  }
  function ledger(inputs) {
    return guard(function () {
      var led = vramLedger(applyPreset(inputs, ["largest_unit_params", "root_unit_params"]));
      led.fits = DATA.cards.map(function (c) { return led.total <= c.usable_bytes; });
      return led;
    });
  }

  // --- dpbook.costs
  var C = DATA.costs;
  function ringBytes(collective, nbytes, n) {
    nonNegative("nbytes", nbytes);
    var f = collective === "all_reduce" ? 2 * (n - 1) / n : (n - 1) / n;
    return f * nbytes;
  }
  function volume(ag1, ag2, rs, ar) {
    var v = {all_gather_forward: ag1, all_gather_backward: ag2, reduce_scatter: rs,
             all_reduce: ar};
    v.total = 0 + ag1 + ag2 + rs + ar;
    return v;
  }
  function ddpStepBytes(gradBytes, n) { return volume(0, 0, 0, ringBytes("all_reduce", gradBytes, n)); }
  function fsdpStepBytes(paramBytes, n, strategy, rootBytes, shardSize) {
    nonNegative("param_bytes", paramBytes);
    intAtLeast("world_size", n);
    oneOf("strategy", strategy, C.strategies);
    if (!(0 <= rootBytes && rootBytes <= paramBytes)) {
      fail("root_bytes phải nằm trong [0, param_bytes], nhận được " + repr(rootBytes) + ".");
    }
    if (strategy === "DDP" || strategy === "NO_SHARD") { return ddpStepBytes(paramBytes, n); }
    var replicas = 1;
    if (strategy === "HYBRID_SHARD") {
      if (shardSize === null || n % shardSize) {
        fail("HYBRID_SHARD cần shard_size chia hết world_size=" + n + ", nhận được shard_size=" +
             repr(shardSize) + ".");
      }
      intAtLeast("shard_size", shardSize);
      replicas = n / shardSize;
    }
    var group = strategy === "HYBRID_SHARD" ? shardSize : n;
    var regather = strategy === "SHARD_GRAD_OP" ? 0 : paramBytes - rootBytes;
    return volume(ringBytes("all_gather", paramBytes, group), ringBytes("all_gather", regather, group),
                  ringBytes("reduce_scatter", paramBytes, group),
                  ringBytes("all_reduce", paramBytes / group, replicas));
  }
  function internodeBytes(v, strategy, nodes, gpus) {
    intAtLeast("nodes", nodes);
    intAtLeast("gpus_per_node", gpus);
    if (nodes === 1) { return 0; }
    return strategy === "HYBRID_SHARD" ? gpus * v.all_reduce : v.total;
  }
  function stepBytes(inputs) {
    return guard(function () {
      var nodes = inputs.nodes, gpus = inputs.gpus_per_node, strategy = inputs.strategy;
      intAtLeast("nodes", nodes);
      intAtLeast("gpus_per_node", gpus);
      var v = fsdpStepBytes(inputs.param_bytes, nodes * gpus, strategy, pick(inputs, "root_bytes", 0),
                            strategy === "HYBRID_SHARD" ? gpus : null);
      v.internode_bytes = internodeBytes(v, strategy, nodes, gpus);
      return v;
    });
  }
  function stepTime(a) {
    return guard(function () {
      var nodes = a.nodes, gpus = a.gpus_per_node, strategy = a.strategy;
      var messages = pick(a, "messages", 1), compute = a.compute_seconds;
      intAtLeast("nodes", nodes);
      intAtLeast("gpus_per_node", gpus);
      oneOf("strategy", strategy, C.strategies);
      nonNegative("compute_seconds", compute);
      intAtLeast("messages", messages);
      nonNegative("alpha_intra", a.alpha_intra);
      positive("bandwidth_intra", a.bandwidth_intra);
      nonNegative("alpha_inter", a.alpha_inter);
      positive("bandwidth_inter", a.bandwidth_inter);
      var world = nodes * gpus, hybrid = strategy === "HYBRID_SHARD";
      var v = fsdpStepBytes(a.param_bytes, world, strategy, pick(a, "root_bytes", 0),
                            hybrid ? gpus : null);
      var group = hybrid ? gpus : world, flat = nodes > 1 && !hybrid;
      var rings = [[v.all_gather_forward, group - 1, flat, 1],
                   [v.all_gather_backward, group - 1, flat, 1],
                   [v.reduce_scatter, group - 1, flat, 1],
                   [v.all_reduce, 2 * ((hybrid ? nodes : world) - 1), nodes > 1, hybrid ? gpus : 1]];
      var comm = 0;
      rings.forEach(function (r) {
        var bytes = r[0], steps = r[1];
        if (bytes === 0) { return; }
        if (r[2]) {
          comm += messages * steps * a.alpha_inter + Math.max(bytes / a.bandwidth_intra,
                                                             r[3] * bytes / a.bandwidth_inter);
        } else {
          comm += messages * steps * a.alpha_intra + bytes / a.bandwidth_intra;
        }
      });
      return {comm_seconds: comm, serial_seconds: compute + comm,
              overlap_seconds: Math.max(compute + comm / messages, comm)};
    });
  }

  // --- dpbook.decision: Job, ladder, price, recommend
  var D = DATA.decision;
  function card(name) {
    var names = DATA.cards.map(function (c) { return c.name; });
    oneOf("card", name, names);
    return DATA.cards[names.indexOf(name)];
  }
  function gbText(nbytes, digits) { return number(nbytes / GB, digits === undefined ? 1 : digits, {group: NARROW}); }
  function checkpointedActivations(act, blocks) { return act * (M.kept_fraction + 1 / blocks); }
  function makeJob(a) {
    a = applyPreset(a, ["largest_unit_params", "root_unit_params"]);
    var gpu = card(a.gpu);
    var job = {num_params: a.num_params, gpu: gpu, gpus_per_node: pick(a, "gpus_per_node", 8),
               nodes: pick(a, "nodes", 1), precision: pick(a, "precision", "mixed"),
               optimizer: pick(a, "optimizer", "adam"), activation_gb: pick(a, "activation_gb", 0),
               largest_unit_params: pick(a, "largest_unit_params", 0), headroom: pick(a, "headroom", 0.1),
               root_unit_params: pick(a, "root_unit_params", 0),
               allow_checkpointing: pick(a, "allow_checkpointing", true),
               allow_offload: pick(a, "allow_offload", true), host_gb: pick(a, "host_gb", 2000),
               bucket_view: pick(a, "bucket_view", true)};
    intAtLeast("num_params", job.num_params);
    intAtLeast("gpus_per_node", job.gpus_per_node);
    intAtLeast("nodes", job.nodes);
    oneOf("precision", job.precision, M.precisions);
    oneOf("optimizer", job.optimizer, M.optimizers);
    nonNegative("activation_gb", job.activation_gb);
    ["largest_unit_params", "root_unit_params"].forEach(function (name) {
      if (!(0 <= job[name] && job[name] <= job.num_params)) {
        fail(name + " phải nằm trong [0, num_params], nhận được " + repr(job[name]) + ".");
      }
    });
    if (job.largest_unit_params + job.root_unit_params > job.num_params) {
      fail("largest_unit_params + root_unit_params phải không quá num_params.");
    }
    if (typeof job.headroom !== "number" || !(0 <= job.headroom && job.headroom < 1)) {
      fail("headroom là phần VRAM để trống, phải nằm trong [0, 1), nhận được " + repr(job.headroom) + ".");
    }
    ["allow_checkpointing", "allow_offload", "bucket_view"].forEach(function (name) {
      if (typeof job[name] !== "boolean") { fail(name + " phải là True hoặc False, nhận được " + repr(job[name]) + "."); }
    });
    nonNegative("host_gb", job.host_gb);
    job.world_size = job.gpus_per_node * job.nodes;
    job.capacity_bytes = gpu.usable_bytes * (1 - job.headroom);
    job.host_capacity_bytes = job.host_gb * GB * (1 - job.headroom);
    job.comm_bytes = job.num_params * bytesPerParam(job.precision, job.optimizer)[0];
    job.num_blocks = job.largest_unit_params ?
      Math.floor((job.num_params - job.root_unit_params) / job.largest_unit_params) : 0;
    job.can_checkpoint = job.allow_checkpointing && job.num_blocks > 0 && job.activation_gb > 0;
    return job;
  }
  function activationBytes(job, ckpt) {
    var full = job.activation_gb * GB;
    return ckpt ? checkpointedActivations(full, job.num_blocks) : full;
  }
  function label(o) {
    return D.labels[o.strategy] + (o.checkpointing ? " + activation checkpointing" : "") +
           (o.offload ? " + CPU offload" : "");
  }
  function ladder(job) {
    var base = ["DDP"].concat(job.nodes === 1 ? D.in_node : D.across_nodes), rungs = [];
    D.tiers.forEach(function (t) {
      if ((t[0] && !job.can_checkpoint) || (t[1] && !job.allow_offload)) { return; }
      base.forEach(function (s) { if (!t[1] || D.offloadable.indexOf(s) >= 0) { rungs.push([s, t[0], t[1]]); } });
    });
    return rungs;
  }
  function stepVolume(job, strategy) {
    var n = job.world_size, psi = job.comm_bytes;
    if (strategy === "ZeRO-1") {  // DDP's AllReduce of Psi, then the fp32 parameters broadcast
      var v = ddpStepBytes(psi, n);
      return volume(ringBytes("all_gather", D.zero_broadcast_bytes * job.num_params, n), 0, 0, v.all_reduce);
    }
    return fsdpStepBytes(psi, n, strategy, 0, strategy === "HYBRID_SHARD" ? job.gpus_per_node : null);
  }
  function pcieBytes(job, strategy) {
    var n = strategy === "HYBRID_SHARD" ? job.gpus_per_node : job.world_size;
    var gathers = strategy === "SHARD_GRAD_OP" ? 1 : 2;
    return D.offload_copy_bytes * job.num_params / n * (gathers + 1);
  }
  function price(job, strategy, ckpt, off) {
    oneOf("strategy", strategy, D.candidates);
    if (strategy === "HYBRID_SHARD" && job.nodes < 2) { fail("HYBRID_SHARD cần ít nhất 2 node (nodes >= 2)."); }
    var led = strategy === "ZeRO-1" ?  // as PyTorch runs it (dpbook.decision)
      zeroRedundancyLedger(job.num_params, job.world_size, job.optimizer, activationBytes(job, ckpt)) :
      vramLedger({num_params: job.num_params, world_size: job.world_size, strategy: strategy,
                  precision: job.precision, optimizer: job.optimizer, phase: "step",
                  largest_unit_params: job.largest_unit_params,
                  root_unit_params: job.root_unit_params,
                  activation_bytes: activationBytes(job, ckpt), offload: off, bucket_view: true,
                  shard_size: strategy === "HYBRID_SHARD" ? job.gpus_per_node : null});
    if ((strategy === "DDP" || strategy === "ZeRO-1") && !job.bucket_view) {  // the fp32 bucket copy
      led.buffers = D.bucket_copy_bytes * job.num_params;
      totals(led);
    }
    var v = stepVolume(job, strategy), host = led.host * job.gpus_per_node;
    return {strategy: strategy, memory_bytes: led.total, sent_bytes: v.total,
            internode_bytes: internodeBytes(v, strategy, job.nodes, job.gpus_per_node),
            fits: led.total <= job.capacity_bytes && host <= job.host_capacity_bytes,
            checkpointing: ckpt, offload: off, host_bytes: host,
            pcie_bytes: off ? pcieBytes(job, strategy) : 0};
  }
  function tierText(job, ckpt, off) {
    if (ckpt && !off) {
      return "với activation checkpointing (activation " + gbText(activationBytes(job, false)) + " → " +
             gbText(activationBytes(job, true)) + " GB mỗi GPU): ";
    }
    return !ckpt && off ? "với CPU offload (trạng thái đã chia ra bộ nhớ CPU): " : "với cả hai: ";
  }
  function shortfall(job, o) {
    var text = o.strategy + " cần " + gbText(o.memory_bytes) + " GB";
    if (o.memory_bytes > job.capacity_bytes) { text += " (thiếu " + gbText(o.memory_bytes - job.capacity_bytes) + " GB)"; }
    if (o.host_bytes > job.host_capacity_bytes) {
      text += ", bộ nhớ CPU mỗi node " + gbText(o.host_bytes) + " GB > " + gbText(job.host_capacity_bytes) + " GB";
    }
    return text;
  }
  function chosenText(job, o) {
    var where = o.strategy === "HYBRID_SHARD" ? "chia trong một node (" + job.gpus_per_node + " GPU)"
                                              : "trên " + job.world_size + " GPU";
    var text = o.strategy + " " + where + " còn " + gbText(o.memory_bytes) + " GB (dư " +
               gbText(job.capacity_bytes - o.memory_bytes) + " GB): chọn " + label(o);
    if (o.strategy === "HYBRID_SHARD") {
      text += " (HSDP), giữa các node chỉ còn AllReduce trên các shard gradient";
    } else if (o.strategy === "FULL_SHARD" && job.nodes > 1) {
      text += " trên mọi node";
    }
    if (o.checkpointing) { text += "; mỗi bước tính lại lượt truyền xuôi của " + job.num_blocks + " khối"; }
    if (o.offload) {
      text += "; mỗi node giữ " + gbText(o.host_bytes) + " GB trạng thái trong bộ nhớ CPU, mỗi GPU chép " +
              gbText(o.pcie_bytes) + " GB qua PCIe mỗi bước, bước cập nhật chạy trên CPU";
    }
    return text + ".";
  }
  function nothingText(job) {
    var skipped = [];
    if (!job.allow_checkpointing) {
      skipped.push("activation checkpointing (không được phép)");
    } else if (!job.num_blocks) {
      skipped.push("activation checkpointing (cần largest_unit_params để biết số khối)");
    }
    if (!job.allow_offload) { skipped.push("CPU offload (không được phép)"); }
    var tried = skipped.length ? "; chưa thử " + skipped.join(", ") : "";
    return "Không bậc nào vừa" + tried + ": cần thêm GPU, hoặc song song mô hình (các chương sau).";
  }
  function reason(job, rungs, at) {
    var cap = gbText(job.capacity_bytes);
    if (at === 0) {
      return "DDP cần " + gbText(rungs[0].memory_bytes) + " GB mỗi GPU, vừa " + cap +
             " GB dùng được: chọn DDP (mã đơn giản nhất, giao tiếp ít nhất).";
    }
    var failed = at < 0 ? rungs : rungs.slice(0, at), parts = [], tier = [false, false];
    failed.forEach(function (o) {
      var same = o.checkpointing === tier[0] && o.offload === tier[1];
      parts.push((same ? "" : tierText(job, o.checkpointing, o.offload)) + shortfall(job, o));
      tier = [o.checkpointing, o.offload];
    });
    var text = "Mỗi GPU dùng được " + cap + " GB. Không vừa: " + parts.join("; ") + ". ";
    return text + (at < 0 ? nothingText(job) : chosenText(job, rungs[at]));
  }
  function decide(job) {
    var opts = {};
    D.candidates.forEach(function (c) { if (c !== "HYBRID_SHARD" || job.nodes > 1) { opts[c] = price(job, c, false, false); } });
    var rungs = ladder(job).map(function (r) {
      return r[1] || r[2] ? price(job, r[0], r[1], r[2]) : opts[r[0]];
    });
    var at = -1;
    for (var i = 0; i < rungs.length; i++) { if (rungs[i].fits) { at = i; break; } }
    return {at: at, rungs: rungs, opts: opts, reason: reason(job, rungs, at)};
  }
  function recommend(inputs) {
    return guard(function () {
      var job = makeJob(inputs), r = decide(job), chosen = r.at < 0 ? null : r.rungs[r.at];
      return {choice: chosen ? chosen.strategy : null, checkpointing: !!(chosen && chosen.checkpointing),
              offload: !!(chosen && chosen.offload), label: chosen ? label(chosen) : D.nothing_fits,
              reason: r.reason, capacity_bytes: job.capacity_bytes,
              host_capacity_bytes: job.host_capacity_bytes, num_blocks: job.num_blocks, options: r.opts,
              ladder: r.rungs.map(function (o) { var c = merge(o); c.label = label(o); return c; })};
    });
  }
  function merge(o) { var c = {}; for (var k in o) { c[k] = o[k]; } return c; }

  function guard(f) {
    try { return f(); } catch (e) { if (e.dpbook) { return {error: e.message}; } throw e; }
  }

  window.dpbookCalc = {
    ledger: ledger, stepBytes: stepBytes, stepTime: stepTime, recommend: recommend, data: DATA,
    vi: {number: number, short: short, nbytes: nbytes, grouped: grouped, percent: percent, ms: ms},
    repr: repr, panels: {}
  };
})();
