// The dashboard page: polls the read-only API and folds each run's events into step cards.
// A poll asks only for the events after the last seq it holds, and only the cards those events
// touch are drawn again, so watching a long run costs what watching a short one does. The run's
// figures (its tokens and cost, what a crash made it spend again) come with each answer, folded
// by the server from the whole log, compacted prefix included.
"use strict";

const RUN_POLL_MS = 500;
const LIST_POLL_MS = 2000;
const $ = (id) => document.getElementById(id);

const list = { offset: 0, next: null, status: "", selected: null };
let view = null; // the selected run's folded state
let runTimer = null;

function fresh(runId) {
  return {
    runId, lastSeq: 0, process: 0, live: false, row: null, compacted: 0, terminal: null,
    cards: new Map(), nodes: new Map(), boundaries: 0, timers: new Map(),
    retries: 0, reexecuted: 0, tokens: 0, dirty: new Set(), redrawAll: true,
    branches: new Map(), children: new Map(), metrics: null, tree: null,
  };
}

// -- talking to the server ------------------------------------------------------------------

async function getJSON(url) {
  let response;
  try {
    response = await fetch(url, { cache: "no-store" });
  } catch (err) {
    throw new Error("dashboard server unreachable");
  }
  const body = await response.json().catch(() => ({ error: `HTTP ${response.status}` }));
  if (!response.ok) {
    const err = new Error(body.error || `HTTP ${response.status}`);
    err.status = response.status;
    throw err;
  }
  return body;
}

function health(text) {
  $("health").textContent = text || "";
}

// -- the run list ---------------------------------------------------------------------------

function listQuery() {
  const q = new URLSearchParams({ offset: String(list.offset) });
  if (list.status) q.set("status", list.status);
  return q.toString();
}

async function pollList() {
  const q = listQuery();
  try {
    const page = await getJSON(`/api/runs?${q}`);
    health("");
    // A page asked for before the filter or the offset changed is dropped: drawn, it would
    // overwrite the page the reader asked for last.
    if (q !== listQuery()) return;
    drawList(page);
  } catch (err) {
    health(err.status === 503 || !err.status ? "database unavailable: " + err.message : err.message);
  }
}

function age(seconds) {
  const s = Math.max(0, Date.now() / 1000 - seconds);
  if (s < 60) return `${Math.round(s)} s`;
  if (s < 3600) return `${Math.round(s / 60)} min`;
  if (s < 86400) return `${Math.round(s / 3600)} h`;
  return `${Math.round(s / 86400)} d`;
}

function drawList(page) {
  const body = $("runs").tBodies[0];
  body.replaceChildren();
  for (const run of page.runs) {
    const tr = document.createElement("tr");
    tr.setAttribute("aria-selected", String(run.run_id === list.selected));
    const link = runLink(run.run_id);
    const status = document.createElement("span");
    status.className = `status ${statusClass(run.status)}`;
    status.textContent = statusOf(run);
    const cells = [link, status, run.workflow, String(run.steps), age(run.updated_s)];
    for (const cell of cells) {
      const td = document.createElement(cell === link ? "th" : "td");
      if (cell === link) td.scope = "row";
      td.append(cell);
      tr.append(td);
    }
    body.append(tr);
  }
  if (!page.runs.length) {
    const tr = body.insertRow();
    const td = tr.insertCell();
    td.colSpan = 5;
    td.textContent = list.status ? `no ${list.status} runs` : "no runs yet";
  }
  list.next = page.next_offset;
  $("older").disabled = page.next_offset === null;
  $("newer").disabled = list.offset === 0;
}

function runLink(runId) {
  const a = document.createElement("a");
  a.href = `#run=${encodeURIComponent(runId)}`;
  a.textContent = runId;
  return a;
}

// Each status has its own look in the list: "st-continued" for CONTINUED, and so on.
function statusClass(status) {
  return `st-${String(status).toLowerCase().replace(/_/g, "-")}`;
}

// -- one run: folding its events --------------------------------------------------------------

function describe(kind, data) {
  if (!Array.isArray(data)) return kind;
  const [what, ...rest] = data;
  if (what === "model") return `model call: ${short(rest[0])}`;
  if (what === "tool") return `tool ${rest[0]}(${short(rest[1])})`;
  if (what === "sleep") return `sleep ${rest[0]} s`;
  if (what === "signal") return `wait for signal "${rest[0]}"${rest[1] == null ? "" : `, up to ${rest[1]} s`}`;
  if (what === "child") return `child run of ${rest[0]}(${short(rest[1])})`;
  if (what === "continue") return `continue as a new run(${short(rest[0])})`;
  if (what === "parallel") return `parallel: ${rest[0].length} steps at once`;
  return `${what} ${short(rest)}`;
}

// A waiting run says what it waits for and since when, in the list and on its own page.
function statusOf(run) {
  const w = run.waiting_for;
  if (!w) return run.status;
  if (w.child != null) return `${run.status} for child run ${w.child} since ${clock(w.since_s)}`;
  const until = w.timeout_at_s == null ? "" : `, times out ${clock(w.timeout_at_s)}`;
  return `${run.status} for signal "${w.signal}" since ${clock(w.since_s)}${until}`;
}

function short(value, n = 110) {
  const text = typeof value === "string" ? value : JSON.stringify(value);
  return text === undefined ? "" : text.length > n ? text.slice(0, n - 1) + "…" : text;
}

function card(v, step) {
  let c = v.cards.get(step);
  if (!c) {
    c = { step, kind: "", text: `step ${step}`, state: "started", process: v.process,
      doneProcess: 0, attempts: 0, note: "", error: "", retryAt: null, dueAt: null,
      spend: null, partials: [], retries: 0 };
    v.cards.set(step, c);
    v.nodes.set(`s${step}`, null);
  } else if (c.process < v.process) {
    // a later process acted on it: its card moves below that process's boundary line
    c.process = v.process;
    v.nodes.delete(`s${step}`);
    v.nodes.set(`s${step}`, null);
    v.redrawAll = true;
  }
  v.dirty.add(step);
  return c;
}

function fold(v, e) {
  const d = e.data;
  switch (e.kind) {
    case "RUN_STARTED":
    case "RUN_RESUMED": {
      v.process += 1;
      v.boundaries += 1;
      const who = d && d.pid ? `pid ${d.pid} on ${d.host}` : "a new process";
      const label = e.kind === "RUN_STARTED"
        ? `process 1 started the run (${who}) at ${clock(e.at_s)}`
        : `process ${v.process} took over (${who}) at ${clock(e.at_s)}: the steps above it come from the log`;
      v.nodes.set(`b${v.boundaries}`, { label, seq: e.seq });
      v.redrawAll = true;
      for (const c of v.cards.values()) cutOff(c, "died"); // its streams died with it
      break;
    }
    case "STEP_STARTED": {
      const prior = v.cards.get(e.step);
      if (prior && prior.attempts > 0 && prior.process < v.process && prior.state !== "done") {
        v.reexecuted += 1; // a call a dead process had begun, made again
      }
      const c = card(v, e.step);
      cutOff(c, "died"); // started again with no outcome in between: a crash lost the attempt
      c.kind = Array.isArray(d) ? d[0] : "";
      c.text = describe(e.kind, d);
      if (c.kind === "signal") c.signal = true;
      if (c.kind === "parallel") {
        // its branches take the positions after its own, in the order given
        d[1].forEach((_, i) => v.branches.set(e.step + 1 + i, { of: e.step, n: i + 1, count: d[1].length }));
      }
      c.attempts += 1;
      c.state = c.signal ? "waiting" : "started";
      break;
    }
    case "TOOL_DISPATCHED": card(v, e.step).state = "dispatched"; break;
    case "TOOL_COMPLETED": // a tool's opening and result in one event: fold both
      fold(v, { ...e, kind: "STEP_STARTED", data: d[0] });
      fold(v, { ...e, kind: "STEP_COMPLETED", data: d[1] });
      break;
    case "STEP_COMPLETED": {
      const c = card(v, e.step);
      c.state = "done";
      c.doneProcess = v.process;
      const answer = d && typeof d === "object" && !Array.isArray(d) ? d : null;
      c.note = c.kind === "model" && answer && typeof answer.text === "string"
        ? short(answer.text, 90) : short(d, 90);
      c.partials = c.partials.filter((p) => p.ended); // the attempt that finished is its answer
      const usage = answer ? answer.usage : null;
      if (usage && typeof usage === "object") {
        const tokens = tokensOf(usage);
        v.tokens += tokens;
        if (c.kind === "model") {
          c.spend = { tokens, usage, model: answer.model, cost: answer.cost_usd, priced: "cost_usd" in answer };
        }
      }
      break;
    }
    case "STEP_PARTIAL": {
      const c = card(v, e.step);
      const attempt = d && d.attempt;
      const text = d && typeof d.text === "string" ? d.text : "";
      const known = c.partials.find((p) => p.attempt === attempt);
      if (known) known.text = text; else c.partials.push({ attempt, text, ended: null });
      break;
    }
    case "STEP_RETRY": {
      const c = card(v, e.step);
      c.state = "retrying";
      c.retryAt = d && d.retry_at_s;
      c.error = failure(d);
      c.retries += 1;
      cutOff(c, "retry");
      v.retries += 1;
      break;
    }
    case "STEP_FAILED": {
      const c = card(v, e.step);
      c.state = "failed";
      c.error = failure(d);
      cutOff(c, "failed");
      break;
    }
    case "TIMER_ARMED": {
      const c = card(v, e.step);
      c.state = "waiting";
      c.dueAt = d && d.fire_at_s;
      v.timers.set(e.step, c.dueAt);
      break;
    }
    case "TIMER_FIRED": {
      const c = card(v, e.step);
      c.state = "done";
      c.doneProcess = v.process;
      v.timers.delete(e.step);
      break;
    }
    case "CTX_RECORDED": {
      const c = card(v, e.step);
      c.kind = "ctx";
      c.text = `ctx value ${short(d, 60)}`;
      c.state = "done";
      c.doneProcess = v.process;
      break;
    }
    case "DEAD_LETTERED": card(v, e.step).state = "dead"; break;
    case "DLQ_REDRIVEN": card(v, e.step).note = "redriven by an operator"; break;
    case "DLQ_RESOLVED": card(v, e.step).note = "resolved by an operator"; break;
    case "RUN_COMPLETED":
    case "RUN_FAILED":
    case "RUN_CANCELLED":
    case "RUN_CONTINUED":
      v.terminal = e.kind;
      break;
    default:
      break;
  }
  v.lastSeq = e.seq;
}

// A streamed attempt that ends without an answer was cut off: what it had streamed was spent.
function cutOff(c, why) {
  for (const p of c.partials) {
    if (!p.ended) p.ended = why;
  }
}

function tokensOf(usage) {
  return usage.total_tokens ?? ((usage.input_tokens ?? usage.prompt_tokens ?? 0)
    + (usage.output_tokens ?? usage.completion_tokens ?? 0));
}

function plural(n, what) {
  return `${n} ${what}${n === 1 ? "" : "s"}`;
}

function dollars(usd) {
  return `$${Number(usd).toFixed(6)}`;
}

// What answers cost: a model with no price is unknown, never free.
function costText(costUsd, unpriced, tokens) {
  if (!tokens) return "unknown: the answers report no usage";
  if (!unpriced) return dollars(costUsd);
  const unknown = `unknown for ${plural(unpriced, "answer")} of a model with no price`;
  return costUsd ? `${dollars(costUsd)} + ${unknown}` : unknown;
}

function failure(d) {
  if (d && typeof d === "object" && d.error_type) {
    return short(`${d.error_type}: ${d.message ?? ""}` + (d.attempt ? ` (attempt ${d.attempt})` : ""), 200);
  }
  return short(d, 200);
}

function clock(at_s) {
  return at_s ? new Date(at_s * 1000).toLocaleTimeString() : "";
}

// -- one run: drawing ---------------------------------------------------------------------------

const OPERATOR = (run) =>
  `an operator decides: durabl dlq redrive ${run} (call it again), ` +
  `durabl dlq resolve ${run} --result JSON (supply its result) or durabl dlq cancel ${run}`;

function shown(v, c) {
  if (c.kind === "child" && c.state === "started") {
    return ["s-waiting", "waiting for its child run", ""];
  }
  switch (c.state) {
    case "done":
      return c.doneProcess === v.process
        ? ["s-done-here", "done in this process", c.note]
        : ["s-done-log", "done, from the log", c.note];
    case "started":
      return v.live
        ? ["s-running", "running", `attempt ${c.attempts}`]
        : ["s-pending", "pending", "its process is gone; the next one to resume the run starts here"];
    case "dispatched":
      return ["s-dispatched", "dispatched: ambiguous window",
        v.live ? "control is in the tool; a crash now cannot tell whether it ran"
          : "the process died inside the tool: it ran zero or one times (IDEMPOTENT tools are called again, AT_MOST_ONCE ones dead-lettered)"];
    case "retrying": return ["s-retrying", "retrying", `next attempt at ${clock(c.retryAt)}; ${c.error}`];
    case "waiting": return c.signal
      ? ["s-waiting", "waiting for a signal", c.dueAt ? `times out at ${clock(c.dueAt)}` : "no timeout"]
      : ["s-waiting", "sleeping", `timer due at ${clock(c.dueAt)}`];
    case "failed": return ["s-failed", "failed", c.error];
    case "dead": return ["s-dead", "dead-lettered", OPERATOR(v.runId)];
    default: return ["s-pending", c.state, ""];
  }
}

function drawCard(v, c) {
  const [cls, label, detail] = shown(v, c);
  const li = document.createElement("li");
  li.className = `card ${cls}`;
  li.id = `step-${c.step}`;
  li.dataset.state = label;
  const head = document.createElement("header");
  const h = document.createElement("h4");
  const branch = v.branches.get(c.step);
  if (branch) li.classList.add("branch");
  h.textContent = branch
    ? `${c.step}. branch ${branch.n} of ${branch.count} (step ${branch.of}): ${c.text}`
    : `${c.step}. ${c.text}`;
  const s = document.createElement("span");
  s.className = "state";
  s.textContent = label;
  head.append(h, s);
  li.append(head);
  const child = c.kind === "child" ? v.children.get(c.step) : null;
  if (child) {
    const p = document.createElement("p");
    p.append("child run ", runLink(child.run_id), `: ${child.status || "not in this database"}`);
    li.append(p);
  }
  if (detail) {
    const p = document.createElement("p");
    p.textContent = detail;
    li.append(p);
  }
  if (c.spend) li.append(drawSpend(c.spend));
  for (const partial of c.partials) li.append(drawPartial(v, c, partial));
  return li;
}

function drawSpend(spend) {
  const p = document.createElement("p");
  p.className = "spend";
  const u = spend.usage;
  const parts = [u.input_tokens ?? u.prompt_tokens, u.output_tokens ?? u.completion_tokens];
  let split = "";
  if (parts[0] != null && parts[1] != null) {
    split = ` (${parts[0]} in, ${parts[1]} out${u.cached_tokens ? `, ${u.cached_tokens} cached` : ""})`;
  }
  const cost = typeof spend.cost === "number" ? dollars(spend.cost)
    : spend.priced ? `cost unknown: no price for ${spend.model || "its model"}` : "cost unknown";
  p.textContent = `${spend.tokens} tokens${split} · ${cost}`;
  return p;
}

const CUT_BY = {
  died: "its process died; the call was made again",
  retry: "the attempt failed; the call was made again",
  failed: "the attempt failed",
};

// The text an attempt had streamed: while its process streams, what it has so far; once the
// attempt ended without an answer (or its process is gone), what was spent and cut off.
function drawPartial(v, c, partial) {
  const box = document.createElement("div");
  box.className = "partial";
  box.dataset.attempt = String(partial.attempt);
  const streaming = !partial.ended && v.live && c.state === "started";
  box.dataset.cut = String(!streaming);
  const label = document.createElement("p");
  const chars = plural(partial.text.length, "character");
  label.textContent = streaming
    ? `streaming, attempt ${partial.attempt}: ${chars} so far`
    : `cut off mid-stream, attempt ${partial.attempt} (${chars}): ` +
      (CUT_BY[partial.ended] || "its process is gone; the next process to resume the run makes the call again");
  const text = document.createElement("blockquote");
  text.textContent = short(partial.text, 600);
  box.append(label, text);
  return box;
}

function drawBoundary(info) {
  const li = document.createElement("li");
  li.className = "boundary";
  li.setAttribute("role", "separator");
  li.setAttribute("aria-label", info.label);
  li.textContent = info.label;
  return li;
}

function drawRun(v) {
  const ol = $("steps");
  if (v.redrawAll) {
    ol.replaceChildren();
    for (const [key, info] of v.nodes) {
      const node = key[0] === "b" ? drawBoundary(info) : drawCard(v, v.cards.get(Number(key.slice(1))));
      if (key[0] !== "b") v.nodes.set(key, node);
      ol.append(node);
    }
  } else {
    for (const step of v.dirty) {
      const key = `s${step}`;
      const old = v.nodes.get(key);
      const node = drawCard(v, v.cards.get(step));
      if (old) old.replaceWith(node); else ol.append(node);
      v.nodes.set(key, node);
    }
  }
  v.dirty.clear();
  v.redrawAll = false;
  drawHeld(v, ol);
  drawSummary(v);
}

// A held run's code yields something the log does not hold; nothing of it was written, so its
// card is drawn from the run's status and its error, which names the step and the difference.
function drawHeld(v, ol) {
  let li = document.getElementById("held");
  if (v.row.status !== "HELD") {
    if (li) li.remove();
    return;
  }
  if (!li) {
    li = document.createElement("li");
    li.id = "held";
    li.className = "card s-held";
    li.dataset.state = "held";
    const head = document.createElement("header");
    const h = document.createElement("h4");
    h.textContent = "held on non-determinism";
    const s = document.createElement("span");
    s.className = "state";
    s.textContent = "held";
    head.append(h, s);
    const p = document.createElement("p");
    li.append(head, p);
  }
  li.querySelector("p").textContent = v.row.error || "held for an operator";
  ol.append(li);
}

// The runs this one is linked to, each a link to its own page: the parent whose ChildRun
// started it, the runs before and after it in a ContinueAsNew chain, the children it started.
function drawLinks(v) {
  const links = v.row.links;
  const ul = $("links");
  ul.replaceChildren();
  const item = (label, run, after) => {
    const li = document.createElement("li");
    li.append(`${label} `, runLink(run.run_id));
    if (after) li.append(after);
    ul.append(li);
  };
  if (links) {
    if (links.parent) item("parent run", links.parent, `, step ${links.parent.step}`);
    if (links.continued_from) item("continued from run", links.continued_from);
    if (links.continued_as) item("continued as run", links.continued_as);
    for (const child of links.children) {
      item("child run", child, ` (step ${child.step}): ${child.status || "not in this database"}`);
    }
    const more = links.children_count - links.children.length;
    if (more > 0) {
      const li = document.createElement("li");
      li.textContent = `and ${more} more child runs: durabl show ${v.runId}`;
      ul.append(li);
    }
  }
  ul.hidden = ul.children.length === 0;
}

// A child's card says what its child run is doing: drawn again when the child's status changes.
function takeLinks(v, links) {
  for (const child of links ? links.children : []) {
    const before = v.children.get(child.step);
    if (!before || before.status !== child.status) {
      v.children.set(child.step, child);
      if (v.cards.has(child.step)) v.dirty.add(child.step);
    }
  }
}

function drawSummary(v) {
  const row = v.row;
  $("run-title").textContent = `Run ${v.runId}`;
  const bits = [statusOf(row), row.workflow];
  if (v.live && row.owner) bits.push(`driven by pid ${row.owner.pid}`);
  if (v.compacted) bits.push(`seqs 1..${v.compacted} compacted into a snapshot`);
  if (row.error) bits.push(row.error);
  $("run-status").textContent = bits.join(" · ");
  const steps = v.cards.size; // ctx values take a step position too, as in the run list
  const m = v.metrics;
  const figures = [["steps", steps], ["processes", v.process], ["retries", v.retries],
    ["re-executed calls", v.reexecuted], ["tokens", m ? m.total_tokens : v.tokens]];
  figures.push(...spendFigures(v));
  const dl = $("metrics");
  dl.replaceChildren();
  for (const [name, value] of figures) {
    const div = document.createElement("div");
    const dt = document.createElement("dt");
    dt.textContent = name;
    const dd = document.createElement("dd");
    dd.textContent = String(value);
    div.append(dt, dd);
    dl.append(div);
  }
  const ul = $("timers");
  ul.replaceChildren();
  for (const [step, due] of v.timers) {
    const li = document.createElement("li");
    li.textContent = `step ${step}: due at ${clock(due)}`;
    ul.append(li);
  }
  $("timers-pane").hidden = v.timers.size === 0;
  drawLinks(v);
}

// What the run spent on models, from the server's fold of its whole log; and with the runs it
// started (child runs, continued runs) where it started any.
function spendFigures(v) {
  const m = v.metrics;
  const figures = [];
  if (m && (m.model_calls || m.total_tokens || m.partial_chars)) {
    figures.push(["cost", costText(m.cost_usd, m.unpriced_model_calls, m.total_tokens)]);
    let again = "none";
    if (m.reexecuted_model_calls) {
      let cost = dollars(m.reexecuted_cost_usd);
      if (lostUnpriced(v)) cost = m.reexecuted_cost_usd ? `${cost} + unknown` : "unknown";
      again = `${cost} · ${m.reexecuted_tokens} tokens ` +
        `(${plural(m.reexecuted_model_calls, "model call")} made again)`;
    }
    figures.push(["re-executed spend (estimated)", again]);
    figures.push(["cut-off streamed text", plural(m.partial_chars, "character")]);
  }
  const t = v.tree;
  if (t && t.runs > 1) {
    let all = `${costText(t.cost_usd, t.unpriced_calls, t.tokens)} · ${t.tokens} tokens · ` +
      `${plural(t.runs, "run")}`;
    if (!t.complete) all += ` (not all of them: durabl metrics ${v.runId})`;
    figures.push(["with the runs it started", all]);
  }
  return figures;
}

// An answer of a model with no price that a crash made the run ask for again: its re-executed
// cost is unknown too (steps compacted away are not seen here).
function lostUnpriced(v) {
  for (const c of v.cards.values()) {
    if (c.spend && typeof c.spend.cost !== "number" && c.attempts - c.retries > 1) return true;
  }
  return false;
}

async function pollRun() {
  const v = view;
  if (!v) return;
  try {
    const answer = await getJSON(`/api/runs/${encodeURIComponent(v.runId)}?after=${v.lastSeq}`);
    if (v !== view) return;
    health("");
    const liveBefore = v.live;
    v.row = answer.run;
    v.live = answer.run.live;
    if (answer.compacted) v.compacted = answer.compacted;
    for (const e of answer.events) fold(v, e);
    v.metrics = answer.metrics;
    v.tree = answer.with_runs_started;
    takeLinks(v, answer.run.links);
    if (v.live !== liveBefore || v.row.status === "HELD") v.redrawAll = true;
    drawRun(v);
    runTimer = setTimeout(pollRun, answer.more ? 0 : RUN_POLL_MS);
  } catch (err) {
    if (v !== view) return;
    if (err.status === 404 || err.status === 400) {
      $("run-title").textContent = "No such run";
      $("run-status").textContent = err.message;
      return; // nothing to poll
    }
    health("database unavailable: " + err.message);
    runTimer = setTimeout(pollRun, RUN_POLL_MS);
  }
}

function select() {
  const match = /^#run=(.+)$/.exec(location.hash);
  const runId = match ? decodeURIComponent(match[1]) : null;
  list.selected = runId;
  clearTimeout(runTimer);
  view = runId ? fresh(runId) : null;
  $("steps").replaceChildren();
  $("metrics").replaceChildren();
  $("links").replaceChildren();
  $("links").hidden = true;
  $("run-status").textContent = "";
  $("run-title").textContent = runId ? `Run ${runId}` : "Select a run";
  if (view) pollRun();
  pollList();
}

$("status").addEventListener("change", (e) => {
  list.status = e.target.value;
  list.offset = 0;
  pollList();
});
$("older").addEventListener("click", () => { if (list.next !== null) { list.offset = list.next; pollList(); } });
$("newer").addEventListener("click", () => { list.offset = Math.max(0, list.offset - 25); pollList(); });
window.addEventListener("hashchange", select);
select();
setInterval(pollList, LIST_POLL_MS);
