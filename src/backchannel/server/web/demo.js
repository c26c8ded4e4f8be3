// The backchannel demo page: a chat with the supervisor beside live cards for its background subagents.
// It only uses the server's LangGraph API (threads, runs and their SSE streams): no build step, no libraries.
"use strict";

const page = document.body.dataset;
const MODES = ["messages-tuple", "updates", "lifecycle", "async_tasks"];
// Task statuses (async_tasks events, the supervisor's state) and subagent lifecycle events, as card statuses.
const TASK_STATUS = {pending: "pending", running: "running", success: "complete", error: "error", timeout: "error",
                     cancelled: "cancelled", waiting: "waiting"};
const LIFECYCLE_STATUS = {started: "running", completed: "complete", failed: "error", cancelled: "cancelled",
                          interrupted: "waiting"};
const RANK = {pending: 0, running: 1, waiting: 1, complete: 2, error: 2, cancelled: 2};
const ACTIVE_RUN = new Set(["pending", "running"]);

const $ = (id) => document.getElementById(id);
const chat = {threadId: null, streaming: 0, following: false, typing: null, seenRuns: new Set(),
              drained: false,  // the supervisor has heard its last pending task
              requests: new AbortController()};  // aborted when the page leaves the conversation
const cards = new Map();  // task_id -> card
const byCall = new Map();  // id of the tool call that started a task -> task_id
const early = new Map();  // lifecycle statuses that arrived before their task, by tool call id

// -- the API ------------------------------------------------------------------------------------

// The API as this conversation calls it (api.js's api(), its calls dropped when the page leaves it).
const chatApi = (method, path, body) => api(method, path, {body, signal: chat.requests.signal});

const getJSON = async (path) => (await chatApi("GET", path)).json();

// Server-sent events from a fetch response: {event, data} for each, comments (heartbeats) skipped.
async function* serverEvents(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const {value, done} = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.search(/\r?\n\r?\n/)) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end).replace(/^\r?\n\r?\n/, "");
      let event = "message";
      const data = [];
      for (const line of block.split(/\r?\n/)) {
        if (!line || line.startsWith(":")) continue;
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        const text = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
        if (field === "event") event = text;
        else if (field === "data") data.push(text);
      }
      if (data.length) yield {event, data: JSON.parse(data.join("\n"))};
    }
  }
}

// -- conversation turns and following the thread ------------------------------------------------

async function send(text) {
  text = text.trim();
  if (!text || chat.streaming) return;
  chat.streaming++;
  updateComposer();
  try {
    if (!chat.threadId) {
      const thread = await (await chatApi("POST", "/threads", {metadata: {title: text.slice(0, 80), source: "web demo"}})).json();
      setThread(thread.thread_id);
    }
    addUserMessage(text);
    const response = await chatApi("POST", `/threads/${chat.threadId}/runs/stream`, {
      assistant_id: page.assistant, input: {messages: [{role: "user", content: text}]}, stream_mode: MODES,
      multitask_strategy: "enqueue"});
    await consume(response);
    await refresh();
  } catch (error) {
    showError(error);
  } finally {
    chat.streaming--;
    updateComposer();
    follow();
  }
}

async function consume(response) {
  try {
    for await (const {event, data} of serverEvents(response)) {
      onPart(event, data);
      updateActivity();
    }
  } finally {
    chat.typing = null;
  }
}

// While tasks work in the background (and a little after), join the runs that wake the supervisor up
// with their results, and poll tasks whose events no open stream carries.
async function follow() {
  if (chat.following || !chat.threadId) return;
  chat.following = true;
  const threadId = chat.threadId;
  try {
    let quiet = 0;
    while (threadId === chat.threadId && quiet < 3) {
      const joined = chat.streaming ? false : await joinNewRuns(threadId);
      if (!joined) {
        if (!chat.streaming) await pollTasks();
        await sleep(1000);
      }
      quiet = joined || chat.streaming || activeCards().length ? 0 : quiet + 1;
      updateActivity();
    }
  } catch (error) {
    showError(error);
  } finally {
    chat.following = false;
  }
}

async function joinNewRuns(threadId) {
  const runs = (await getJSON(`/threads/${threadId}/runs?limit=10`)).reverse();
  let changed = false;
  let joined = false;
  for (const run of runs) {
    if (chat.seenRuns.has(run.run_id) || chat.streaming || threadId !== chat.threadId) continue;
    chat.seenRuns.add(run.run_id);
    changed = true;
    if (!ACTIVE_RUN.has(run.status)) continue;  // already over: refresh() shows what it said
    joined = true;
    chat.streaming++;
    updateComposer();
    try {
      const modes = encodeURIComponent(JSON.stringify(MODES));
      await consume(await chatApi("GET", `/threads/${threadId}/runs/${run.run_id}/stream?stream_mode=${modes}`));
    } finally {
      chat.streaming--;
      updateComposer();
    }
  }
  if (changed && threadId === chat.threadId) await refresh();
  return joined;
}

// A task's status from its run, as LangGraph reports runs: one cancelled is "interrupted"; one that paused
// for a human is "success", with its thread "interrupted".
async function pollTasks() {
  for (const card of activeCards()) {
    if (!card.runId) continue;
    const run = await getJSON(`/threads/${card.id}/runs/${card.runId}`);
    let status = run.status === "interrupted" ? "cancelled" : TASK_STATUS[run.status];
    if (run.status === "success" && (await getJSON(`/threads/${card.id}`)).status === "interrupted") status = "waiting";
    if (status) setStatus(card, status, card.runId);
  }
}

// The thread's state is the record: after each run the chat is drawn again from it.
async function refresh() {
  if (!chat.threadId) return;
  const state = await getJSON(`/threads/${chat.threadId}/state`);
  const values = state.values || {};
  for (const task of Object.values(values.async_tasks || {})) upsertTask(task, {restored: true});
  renderMessages(values.messages || []);
}

function setThread(threadId) {
  chat.threadId = threadId;
  history.replaceState(null, "", threadId ? `#thread=${threadId}` : location.pathname);
}

// Runs of the conversation left behind carry on at the server; the page stops following them.
function newConversation() {
  chat.requests.abort();
  chat.requests = new AbortController();
  setThread(null);
  chat.seenRuns.clear();
  chat.drained = false;
  cards.clear();
  byCall.clear();
  early.clear();
  document.querySelectorAll(".card, .notice.alert").forEach((el) => el.remove());
  renderMessages([]);
  updateCount();
  updateActivity();
  $("prompt").focus();
}

// -- stream parts -------------------------------------------------------------------------------

function onPart(event, data) {
  const [mode, ...namespace] = event.split("|");
  if (mode === "metadata") chat.seenRuns.add(data.run_id);
  else if (mode === "messages" && !namespace.length) onMessageChunk(data[0]);
  else if (mode === "updates" && !namespace.length) onUpdates(data);
  else if (mode === "lifecycle") onLifecycle(data);
  else if (mode === "async_tasks" && data.event === "drained") onDrained();
  else if (mode === "async_tasks") upsertTask(data);
  else if (mode === "error") showError(new Error(data.message || data.error || "the run failed"));
}

function onMessageChunk(chunk) {
  if (!chunk || chunk.type !== "AIMessageChunk") return;
  const text = textOf(chunk.content);
  if (!text) return;
  const bubble = ensureBubble(chunk.id);
  bubble.raw += text;
  setText(bubble.text, bubble.raw);
  chat.typing = chunk.id;
  scrollDown();
}

function onUpdates(data) {
  for (const update of Object.values(data || {})) {
    for (const message of (update && update.messages) || []) {
      if (message.type === "ai") {
        finishBubble(message);
        if (chat.typing === message.id) chat.typing = null;
      } else if (message.type === "human" && notificationOf(message)) {
        if (!document.querySelector(`[data-id="${CSS.escape(message.id)}"]`)) addNotice(message);
      }
    }
  }
}

function onLifecycle(data) {
  const callId = data.cause && data.cause.tool_call_id;
  const status = LIFECYCLE_STATUS[data.event];
  if (!callId || !status || (data.namespace || []).length !== 1) return;
  const card = cards.get(byCall.get(callId));
  if (card) setStatus(card, status, card.runId);
  else early.set(callId, status);
}

// -- the chat -----------------------------------------------------------------------------------

function renderMessages(messages) {
  const box = $("messages");
  const stick = nearBottom();
  const errors = [...box.querySelectorAll(".notice.alert")];  // not in the state: kept, at the end
  box.querySelectorAll(".msg, .notice").forEach((el) => el.remove());
  for (const message of messages) {
    if (message.type === "human") {
      if (notificationOf(message)) addNotice(message);
      else addUserMessage(textOf(message.content), message.id);
    } else if (message.type === "ai") {
      finishBubble(message);
    }
  }
  box.append(...errors);
  $("welcome").hidden = messages.length > 0 || errors.length > 0;
  if (stick) scrollDown();
}

function addUserMessage(text, id) {
  $("welcome").hidden = true;
  const el = element("div", "msg user");
  if (id) el.dataset.id = id;
  const body = el.appendChild(element("div", "body"));
  setText(body.appendChild(element("div", "text")), text);
  $("messages").appendChild(el);
  scrollDown();
}

function ensureBubble(id) {
  let el = document.querySelector(`.msg.ai[data-id="${CSS.escape(id)}"]`);
  if (!el) {
    $("welcome").hidden = true;
    el = element("div", "msg ai");
    el.dataset.id = id;
    el.appendChild(element("div", "avatar", "S"));
    const body = el.appendChild(element("div", "body"));
    body.appendChild(element("div", "who", "supervisor"));
    el.text = body.appendChild(element("div", "text"));
    el.raw = "";
    $("messages").appendChild(el);
  }
  return el;
}

function finishBubble(message) {
  const text = textOf(message.content);
  const calls = message.tool_calls || [];
  if (!text && !calls.length) return;
  const bubble = ensureBubble(message.id);
  bubble.raw = text;
  setText(bubble.text, text);
  bubble.text.hidden = !text;
  bubble.querySelectorAll(".dispatch").forEach((el) => el.remove());
  if (calls.length) {
    const list = bubble.querySelector(".body").appendChild(element("ul", "dispatch"));
    for (const call of calls) {
      const item = list.appendChild(element("li"));
      const args = call.args || {};
      if (call.name === "start_async_task") {
        item.appendChild(element("span", "verb", "started"));
        item.appendChild(element("b", null, args.subagent_type || "subagent"));
        item.appendChild(element("span", "what", args.description || ""));
      } else {
        item.appendChild(element("span", "verb", "called"));
        item.appendChild(element("b", null, call.name));
      }
    }
  }
  scrollDown();
}

function addNotice(message) {
  const note = notificationOf(message);
  const status = TASK_STATUS[note.status] || note.status;
  const el = element("div", `notice ${status}`);
  el.dataset.id = message.id || "";
  el.dataset.taskId = note.task_id;
  el.appendChild(element("span", "dot"));
  el.appendChild(element("b", null, note.subagent));
  el.appendChild(element("span", "verb", {complete: "reported back", waiting: "needs input", error: "failed"}[status] ||
    status));
  // "[task_id=…][subagent=…] Completed. Result: …" (or "Error: …", "Waiting for input: …"): what follows
  const body = textOf(message.content).replace(/^(\[[^\]]*\])+\s*/, "").replace(/^(Completed\. Result|Error|Waiting for input): /, "");
  el.appendChild(element("span", "excerpt", body));
  el.title = "Show this task in the sidebar";
  el.addEventListener("click", () => focusCard(note.task_id));
  $("messages").appendChild(el);
  $("welcome").hidden = true;
  scrollDown();
}

function showError(error) {
  if (error.name === "AbortError") return;  // the page left that conversation
  const el = element("div", "notice alert");
  el.appendChild(element("span", "dot"));
  el.appendChild(element("b", null, "error"));
  el.appendChild(element("span", "excerpt", error.message || String(error)));
  $("messages").appendChild(el);
  $("welcome").hidden = true;
  scrollDown();
}

function updateComposer() {
  const busy = chat.streaming > 0;
  $("send").disabled = busy;
  $("suggestion").disabled = busy;
  $("composer").classList.toggle("busy", busy);
  updateActivity();
}

function updateActivity() {
  const working = activeCards().length;
  let text = null;
  if (chat.streaming && !chat.typing) {
    text = working ? `Waiting for ${working} subagent${working > 1 ? "s" : ""} to report back` : "The supervisor is thinking";
  } else if (!chat.streaming && working) {
    text = `${working} subagent${working > 1 ? "s" : ""} working in the background`;
  }
  $("activity").hidden = text === null;
  if (text !== null) $("activity-text").textContent = text;
}

// -- the subagent cards -------------------------------------------------------------------------

function upsertTask(task, {restored = false} = {}) {
  let card = cards.get(task.task_id);
  const status = TASK_STATUS[task.status] || "pending";
  if (!card) {
    card = createCard(task, restored);
    cards.set(task.task_id, card);
  }
  if (task.tool_call_id) {
    byCall.set(task.tool_call_id, task.task_id);
    if (early.has(task.tool_call_id)) {
      setStatus(card, early.get(task.tool_call_id), card.runId);
      early.delete(task.tool_call_id);
    }
  }
  if (task.description) card.el.querySelector(".desc").textContent = task.description;
  const runId = task.run_id || card.runId;
  setStatus(card, status, runId, restored && task.updated_at ? Date.parse(task.updated_at) : Date.now());
  return card;
}

function createCard(task, restored) {
  const el = element("article", "card");
  el.tabIndex = 0;
  el.dataset.taskId = task.task_id;
  el.dataset.subagent = task.subagent;
  const head = el.appendChild(element("header"));
  head.appendChild(element("span", "agent-icon", (task.subagent || "?").slice(0, 1).toUpperCase()));
  head.appendChild(element("span", "name", task.subagent));
  head.appendChild(element("span", "status"));
  el.appendChild(element("p", "desc", task.description || ""));
  const foot = el.appendChild(element("footer"));
  foot.appendChild(element("span", "elapsed"));
  foot.appendChild(element("span", "task-id", `task ${task.task_id.slice(0, 8)}`));
  // What the task did, on the conversation's timeline (its lane picked out), in a tab of its own.
  const timeline = foot.appendChild(element("a", "timeline", "timeline"));
  timeline.href = `/timeline?thread=${encodeURIComponent(chat.threadId)}&focus=${encodeURIComponent(task.task_id)}`;
  timeline.target = "_blank";
  timeline.addEventListener("click", (event) => event.stopPropagation());
  foot.appendChild(element("span", "hint", "show result"));
  el.appendChild(element("div", "progress"));
  const result = el.appendChild(element("div", "result"));
  result.hidden = true;
  const start = restored && task.created_at ? Date.parse(task.created_at) : Date.now();
  const card = {id: task.task_id, el, status: null, runId: task.run_id, history: [], start, end: null,
                result: null, open: false};
  el.addEventListener("click", () => toggleResult(card));
  el.addEventListener("keydown", (e) => { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); toggleResult(card); } });
  $("no-cards").hidden = true;
  $("cards").appendChild(el);
  return card;
}

function setStatus(card, status, runId, at = Date.now()) {
  const sameRun = !runId || runId === card.runId;
  if (card.status === status && sameRun) return;
  if (card.status && sameRun && RANK[status] < RANK[card.status]) return;  // events of one run never go back
  if (!sameRun) {  // a follow-up run of the same task starts over
    card.runId = runId;
    card.start = at;
    card.result = null;
  }
  card.status = status;
  card.history.push(status);
  card.end = RANK[status] === 2 ? Math.max(at, card.start) : null;
  const el = card.el;
  el.className = `card ${status}${card.open ? " open" : ""}`;
  el.dataset.status = status;
  el.dataset.history = card.history.join(" ");
  const badge = el.querySelector(".status");
  badge.className = `status ${status}`;
  badge.textContent = status;
  el.querySelector(".hint").textContent = card.open ? "hide" : RANK[status] === 2 ? "show result" : "";
  tick(card);
  updateCount();
  if (card.open) loadResult(card);
}

// The stream's "drained" part: every task has reported back and the supervisor has heard them all.
function onDrained() {
  chat.drained = true;
  updateCount();
}

function updateCount() {
  const all = [...cards.values()];
  const done = all.filter((c) => RANK[c.status] === 2).length;
  const running = all.filter((c) => c.status === "running").length;
  if (done < all.length) chat.drained = false;
  $("task-count").textContent = !all.length ? "none yet" :
    done < all.length ? `${done} of ${all.length} done${running ? ` · ${running} running` : ""}` :
    chat.drained ? `all ${all.length} reported back` : `all ${all.length} done`;
  $("no-cards").hidden = all.length > 0;
}

function activeCards() {
  return [...cards.values()].filter((c) => c.status === "pending" || c.status === "running");
}

function tick(card) {
  const ms = Math.max(0, (card.end ?? Date.now()) - card.start);
  card.el.querySelector(".elapsed").textContent = formatDuration(ms);
}

function toggleResult(card) {
  card.open = !card.open;
  card.el.classList.toggle("open", card.open);
  card.el.querySelector(".result").hidden = !card.open;
  card.el.querySelector(".hint").textContent = card.open ? "hide" : RANK[card.status] === 2 ? "show result" : "";
  if (card.open) loadResult(card);
}

async function loadResult(card) {
  const box = card.el.querySelector(".result");
  if (RANK[card.status] !== 2) {
    setText(box, "Still working: the result shows here when it is done.");
    return;
  }
  if (card.result === null) {
    setText(box, "Loading…");
    try {
      const state = await getJSON(`/threads/${card.id}/state`);
      const answers = ((state.values || {}).messages || []).filter((m) => m.type === "ai" && textOf(m.content));
      const last = answers.length ? textOf(answers[answers.length - 1].content) : "";
      card.result = card.status === "complete" ? last || "(no answer)" :
        card.status === "cancelled" ? "The task was cancelled." : "The task failed before it finished.";
    } catch (error) {
      setText(box, error.message);
      return;
    }
  }
  box.classList.toggle("failed", card.status !== "complete");
  setText(box, card.result);
}

function focusCard(taskId) {
  const card = cards.get(taskId);
  if (!card) return;
  card.el.scrollIntoView({block: "nearest", behavior: "smooth"});
  card.el.classList.remove("flash");
  void card.el.offsetWidth;  // restart the animation
  card.el.classList.add("flash");
  if (!card.open) toggleResult(card);
}

// -- helpers ------------------------------------------------------------------------------------

function notificationOf(message) {
  return (message.additional_kwargs || {}).task_notification || null;
}

function textOf(content) {
  if (typeof content === "string") return content;
  if (Array.isArray(content)) return content.map((b) => (typeof b === "string" ? b : b.text || "")).join("");
  return "";
}

function element(tag, className, text) {
  const el = document.createElement(tag);
  if (className) el.className = className;
  if (text !== undefined) el.textContent = text;
  return el;
}

// Text with **bold** and `code`, everything else shown as written.
function setText(el, text) {
  el.replaceChildren();
  for (const piece of text.split(/(\*\*[^*]+\*\*|`[^`]+`)/)) {
    if (piece.startsWith("**") && piece.endsWith("**") && piece.length > 4) el.appendChild(element("strong", null, piece.slice(2, -2)));
    else if (piece.startsWith("`") && piece.endsWith("`") && piece.length > 2) el.appendChild(element("code", null, piece.slice(1, -1)));
    else if (piece) el.appendChild(document.createTextNode(piece));
  }
}

function formatDuration(ms) {
  const s = ms / 1000;
  if (s < 60) return `${s.toFixed(1)}s`;
  return `${Math.floor(s / 60)}m ${String(Math.floor(s % 60)).padStart(2, "0")}s`;
}

function nearBottom() {
  const box = $("messages");
  return box.scrollHeight - box.scrollTop - box.clientHeight < 80;
}

function scrollDown() {
  const box = $("messages");
  box.scrollTop = box.scrollHeight;
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// -- start --------------------------------------------------------------------------------------

function start() {
  const prompt = $("prompt");
  const suggestion = $("suggestion");
  if (page.prompt) suggestion.textContent = page.prompt;
  else suggestion.hidden = true;
  suggestion.addEventListener("click", () => send(page.prompt));
  $("composer").addEventListener("submit", (e) => {
    e.preventDefault();
    const text = prompt.value;
    if (!text.trim() || chat.streaming) return;
    prompt.value = "";
    prompt.style.height = "";
    send(text);
  });
  prompt.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      $("composer").requestSubmit();
    }
  });
  prompt.addEventListener("input", () => {
    prompt.style.height = "";
    prompt.style.height = `${Math.min(prompt.scrollHeight, 160)}px`;
  });
  $("new-chat").addEventListener("click", newConversation);
  $("model").classList.toggle("offline", page.offline === "true");
  setInterval(() => activeCards().forEach(tick), 100);

  const match = location.hash.match(/thread=([\w-]+)/);
  if (match) {
    setThread(match[1]);
    refresh().then(follow, (error) => { showError(error); setThread(null); });
  }
  prompt.focus();
}

start();
