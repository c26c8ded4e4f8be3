// The timeline page: a thread's runs, model calls, tool calls and subagents as a waterfall on one time axis.
// Background tasks get lanes of their own, under the thread that started them; a dashed line goes from the
// tool call that started a task to its run, an arrow from the task's run back to the notification its
// supervisor took in. Data: GET /threads/{id}/timeline (the spans each run recorded). Plain script, no build step.
"use strict";

const REFRESH_MS = 1000;  // while something runs
const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
let timer = null;
let shown = null;  // the data on the page

function element(tag, className, text) {
  const el = document.createElement(tag);
  if (className) el.className = className;
  if (text !== undefined) el.textContent = text;
  return el;
}

const getJSON = async (path) => (await api("GET", path)).json();  // api.js's api(): with the key the server wants

// -- formatting ---------------------------------------------------------------------------------

function duration(seconds) {
  const ms = seconds * 1000;
  if (ms < 1) return "<1 ms";
  if (ms < 1000) return `${Math.round(ms)} ms`;
  return `${(ms / 1000).toFixed(ms < 10000 ? 2 : 1)} s`;
}

const count = (n) => Number(n || 0).toLocaleString("en-US");

function tokens(usage) {
  if (!usage) return "";
  const total = usage.total_tokens ?? (usage.input_tokens || 0) + (usage.output_tokens || 0);
  return total ? `${count(usage.input_tokens)} in · ${count(usage.output_tokens)} out` : "";
}

// -- loading ------------------------------------------------------------------------------------

async function load(threadId) {
  clearTimeout(timer);
  let data;
  try {
    data = await getJSON(`/threads/${encodeURIComponent(threadId)}/timeline`);
  } catch (error) {
    showMessage(`Cannot show thread ${threadId}: ${error.message}`, true);
    return;
  }
  render(data);
  const active = data.threads.some((t) => t.runs.some((r) => r.status === "pending" || r.status === "running"));
  if (active) timer = setTimeout(() => load(threadId), REFRESH_MS);
}

function showMessage(text, failed = false) {
  $("message").textContent = text;
  $("message").className = failed ? "message failed" : "message";
  $("message").hidden = false;
  $("chart").hidden = true;
  $("summary").hidden = true;
}

// -- rows -----------------------------------------------------------------------------------------

// Every span as a row, lane by lane: the thread's own runs, then each task's, each run as a tree.
function buildRows(data) {
  const rows = [];
  for (const lane of data.threads) {
    rows.push({type: "lane", lane});
    for (const run of lane.runs) {
      if (!run.spans || !run.spans.length) {
        rows.push({type: "span", lane, run, depth: 0, span: pendingSpan(run)});
        continue;
      }
      const children = new Map();
      for (const span of run.spans) {
        const key = span.parent ?? "root";
        if (!children.has(key)) children.set(key, []);
        children.get(key).push(span);
      }
      const visit = (span, depth) => {
        rows.push({type: "span", lane, run, depth, span});
        for (const child of (children.get(span.id) || []).sort((a, b) => a.start - b.start)) visit(child, depth + 1);
      };
      for (const root of children.get("root") || []) visit(root, 0);
    }
  }
  return rows;
}

// A run without recorded spans (queued, running, or from before spans were recorded): its row from its times.
function pendingSpan(run) {
  const start = Date.parse(run.created_at) / 1000;
  const end = run.status === "pending" || run.status === "running" ? Date.now() / 1000 : Date.parse(run.updated_at) / 1000;
  return {id: "run", kind: "run", name: run.name || "run", start, end, status: run.status, usage: run.usage};
}

function bounds(rows) {
  let t0 = Infinity, t1 = -Infinity;
  for (const row of rows) {
    if (row.type !== "span") continue;
    t0 = Math.min(t0, row.span.start);
    t1 = Math.max(t1, row.span.end);
  }
  if (!Number.isFinite(t0)) t0 = t1 = Date.now() / 1000;
  return [t0, Math.max(t1, t0 + 0.001)];
}

function rowKind(span, depth) {
  if (span.kind === "run") return depth === 0 ? "run" : "subagent";
  return span.kind;
}

function label(span, depth) {
  switch (span.kind) {
    case "run": return depth === 0 ? `${span.name} run` : `${span.name} (subagent)`;
    case "model": return `chat ${span.name}`;
    case "tool": return `${span.name}()`;
    case "notification": return `${span.name} reported back: ${span.task_status}`;
    default: return span.name;
  }
}

function describe(span, depth) {
  const lines = [label(span, depth), `${span.status} · ${duration(span.end - span.start)}`];
  if (span.usage && tokens(span.usage)) lines.push(`tokens: ${tokens(span.usage)}`);
  if (span.tool_call_id) lines.push(`tool call ${span.tool_call_id}`);
  if (span.task_id) lines.push(`task ${span.task_id}, run ${span.task_run_id}`);
  if (span.error) lines.push(span.error);
  return lines.join("\n");
}

function laneRow(lane, data) {
  const row = element("div", "row lane");
  row.dataset.threadId = lane.thread_id;
  if (params.get("focus") === lane.thread_id) row.classList.add("focus");
  const cell = row.appendChild(element("div", "label", lane.name));
  if (lane.thread_id !== data.thread_id) cell.appendChild(element("span", "badge background", "background task"));
  cell.appendChild(element("span", "badge", lane.status));
  const usage = tokens(lane.usage);
  cell.appendChild(element("span", "meta", `thread ${lane.thread_id.slice(0, 8)}${usage ? ` · ${usage}` : ""}`));
  if (lane.thread_id !== data.thread_id) {
    const link = cell.appendChild(element("a", "", "its own timeline"));
    link.href = `/timeline?thread=${encodeURIComponent(lane.thread_id)}`;
  }
  return row;
}

function spanRow({span, depth, lane, run}, t0, t1) {
  const kind = rowKind(span, depth);
  const failed = span.status === "error" || span.status === "timeout";
  const row = element("div", `row ${kind} ${span.status}${failed ? " error" : ""}`);
  Object.assign(row.dataset, {kind, status: span.status, name: span.name, thread: lane.thread_id, run: run.run_id,
                              span: String(span.id)});
  if (span.tool_call_id) row.dataset.toolCall = span.tool_call_id;
  if (span.task_id) Object.assign(row.dataset, {task: span.task_id, taskRun: span.task_run_id});
  const cell = row.appendChild(element("div", "label", label(span, depth)));
  cell.style.paddingLeft = `${12 + depth * 16}px`;
  if (failed && span.error) cell.appendChild(element("span", "err", span.error));
  cell.title = describe(span, depth);
  const track = row.appendChild(element("div", "track"));
  const bar = track.appendChild(element("div", "bar"));
  const left = ((span.start - t0) / (t1 - t0)) * 100;
  bar.style.left = `${left}%`;
  bar.style.width = `${((span.end - span.start) / (t1 - t0)) * 100}%`;
  bar.title = describe(span, depth);
  const text = [duration(span.end - span.start)];
  if ((kind === "model" || depth === 0) && tokens(span.usage)) text.push(tokens(span.usage));
  if (kind !== "notification") bar.appendChild(element("span", "text", text.join(" · ")));
  // Its text beside it, on whichever side has room; inside it when it is wide enough itself.
  const width = ((span.end - span.start) / (t1 - t0)) * 100;
  if (width > 30) bar.classList.add("inside");
  else if (left + width > 75) bar.classList.add("flip");
  return row;
}

// -- drawing ------------------------------------------------------------------------------------

function render(data) {
  $("message").hidden = true;
  $("chart").hidden = false;
  $("subtitle").textContent = `Thread ${data.thread_id}`;
  document.title = `backchannel · timeline · ${data.thread_id.slice(0, 8)}`;
  const rows = buildRows(data);
  const [t0, t1] = bounds(rows);
  renderSummary(data, rows, t1 - t0);
  renderAxis(t1 - t0);
  const container = $("rows");
  container.replaceChildren(...rows.map((row) => row.type === "lane" ? laneRow(row.lane, data) : spanRow(row, t0, t1)));
  shown = data;
  drawArrows(data);
}

function renderSummary(data, rows, seconds) {
  const spans = rows.filter((r) => r.type === "span").map((r) => r.span);
  const errors = spans.filter((s) => s.status === "error" || s.status === "timeout").length;
  const usage = data.usage || {};
  const stats = [
    [duration(seconds), "wall time"],
    [count(usage.total_tokens), `tokens (${count(usage.input_tokens)} in, ${count(usage.output_tokens)} out)`],
    [count(usage.model_calls), "model calls"],
    [count(spans.filter((s) => s.kind === "tool").length), "tool calls"],
    [count(data.threads.length - 1), "background tasks"],
    [count(errors), "errors"],
  ];
  for (const [name, counts] of Object.entries(usage.subagents || {})) {
    stats.push([count(counts.total_tokens), `tokens: ${name}`]);
  }
  $("summary").replaceChildren(...stats.map(([value, what]) => {
    const stat = element("div", "stat");
    stat.appendChild(element("b", "", value));
    stat.appendChild(element("span", "", what));
    return stat;
  }));
  $("summary").hidden = false;
}

function renderAxis(seconds) {
  const axis = $("axis");
  const ticks = [];
  const step = niceStep(seconds / 8);
  for (let t = 0; t <= seconds + 1e-9; t += step) {
    const at = (t / seconds) * 100;
    const tick = element("div", at > 92 ? "tick end" : "tick", duration(t).replace("<1 ms", "0"));
    tick.style.left = `${at}%`;
    ticks.push(tick);
  }
  axis.replaceChildren(...ticks);
}

function niceStep(raw) {
  const power = 10 ** Math.floor(Math.log10(raw));
  return [1, 2, 5, 10].map((m) => m * power).find((s) => s >= raw) || raw;
}

// Arrows over the rows: from a task's run back to the notification its supervisor took in, and (dashed)
// from the tool call that started a task to the task's first run.
function drawArrows(data) {
  const svg = $("arrows");
  svg.querySelectorAll("path:not(marker path)").forEach((p) => p.remove());
  const box = $("chart").getBoundingClientRect();
  const point = (row, where) => {
    const bar = row.querySelector(".bar").getBoundingClientRect();
    const x = where === "start" ? bar.left : where === "end" ? bar.right : bar.left + bar.width / 2;
    return [x - box.left, bar.top + bar.height / 2 - box.top];
  };
  const rows = [...document.querySelectorAll(".row:not(.lane)")];
  const runRow = (thread, run) => rows.find((r) => r.dataset.thread === thread && r.dataset.run === run
                                                   && r.dataset.kind === "run");
  for (const note of rows.filter((r) => r.dataset.kind === "notification")) {
    const from = runRow(note.dataset.task, note.dataset.taskRun);
    if (from) addPath(svg, point(from, "end"), point(note, "middle"), "note");
  }
  const causes = new Map(data.threads.map((t) => [t.thread_id, t.tool_call_id]));  // what started each task
  for (const lane of document.querySelectorAll(".row.lane")) {
    const first = rows.find((r) => r.dataset.thread === lane.dataset.threadId && r.dataset.kind === "run");
    const starter = first && rows.find((r) => r.dataset.kind === "tool" && r.dataset.toolCall
                                             && r.dataset.toolCall === causes.get(lane.dataset.threadId));
    if (starter) addPath(svg, point(starter, "end"), point(first, "start"), "spawn");
  }
}

function addPath(svg, [x1, y1], [x2, y2], kind) {
  const path = document.createElementNS("http://www.w3.org/2000/svg", "path");
  const bend = Math.max(24, Math.abs(x2 - x1) / 3);
  path.setAttribute("d", kind === "note"
    ? `M ${x1} ${y1} C ${x1 + bend} ${y1}, ${x2} ${y2 + (y1 > y2 ? bend : -bend)}, ${x2} ${y2}`
    : `M ${x1} ${y1} C ${x1 + bend} ${y1}, ${x2 - bend} ${y2}, ${x2} ${y2}`);
  path.setAttribute("class", kind);
  if (kind === "note") path.setAttribute("marker-end", "url(#head)");
  path.dataset.kind = kind;
  svg.appendChild(path);
}

// -- the page -----------------------------------------------------------------------------------

function open(threadId) {
  $("thread-input").value = threadId;
  showMessage(`Loading thread ${threadId}…`);
  load(threadId);
}

$("open").addEventListener("submit", (event) => {
  event.preventDefault();
  const threadId = $("thread-input").value.trim();
  if (!threadId) return;
  history.pushState(null, "", `/timeline?thread=${encodeURIComponent(threadId)}`);
  open(threadId);
});
window.addEventListener("resize", () => { if (shown && !$("chart").hidden) drawArrows(shown); });
if (params.get("thread")) open(params.get("thread"));
