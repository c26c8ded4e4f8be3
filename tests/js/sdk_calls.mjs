// Every call of the official LangGraph JavaScript SDK against a server: `node sdk_calls.mjs <url>`.
// Prints one JSON line per call ({"call", "ok", "error"}) and exits with the number of calls that failed.
// The agents are tests/server/server_agents.py's: echo, calc, mailer (asks before sending), slow, glacial,
// delegator (a sync subagent), looper (never finishes).
import assert from "node:assert/strict";
import { Client } from "@langchain/langgraph-sdk";

const url = process.argv[2];
const client = new Client({ apiUrl: url, apiKey: null });
const user = (text) => ({ messages: [{ role: "user", content: text }] });
const last = (values) => values.messages[values.messages.length - 1].content;
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
let failures = 0;

async function check(call, fn) {
  try {
    await fn();
    console.log(JSON.stringify({ call, ok: true }));
  } catch (error) {
    failures += 1;
    console.log(JSON.stringify({ call, ok: false, error: String(error?.stack ?? error) }));
  }
}

async function collect(stream) {
  const parts = [];
  for await (const part of stream) parts.push(part);
  return parts;
}

async function untilStatus(threadId, runId, status) {
  for (let i = 0; i < 200; i += 1) {
    if ((await client.runs.get(threadId, runId)).status === status) return;
    await sleep(25);
  }
  throw new Error(`run ${runId} never became ${status}`);
}

// -- assistants -------------------------------------------------------------------------------------
await check("assistants.search", async () => {
  const found = await client.assistants.search({ limit: 100 });
  assert.ok(found.some((a) => a.graph_id === "echo"));
  const sorted = await client.assistants.search({ limit: 100, sortBy: "graph_id", sortOrder: "asc" });
  assert.deepEqual(sorted.map((a) => a.graph_id), [...sorted.map((a) => a.graph_id)].sort());
});
await check("assistants.count", async () => assert.ok((await client.assistants.count({ graphId: "echo" })) >= 1));
await check("assistants.get", async () => assert.equal((await client.assistants.get("echo")).graph_id, "echo"));
await check("assistants.getGraph", async () => {
  const graph = await client.assistants.getGraph("calc");
  assert.ok(graph.nodes.some((n) => n.id === "tools"));
});
await check("assistants.getSchemas", async () => {
  assert.ok("messages" in (await client.assistants.getSchemas("calc")).state_schema.properties);
});
await check("assistants.getSubgraphs", async () => assert.deepEqual(await client.assistants.getSubgraphs("calc"), {}));
let made;
await check("assistants.create", async () => {
  made = await client.assistants.create({
    graphId: "echo", name: "js echo", metadata: { js: "made" }, context: { tone: "dry" }, description: "from Node",
  });
  assert.equal(made.graph_id, "echo");
  assert.equal(made.version, 1);
  assert.deepEqual(made.context, { tone: "dry" });
  const again = await client.assistants.create({ graphId: "echo", assistantId: made.assistant_id, ifExists: "do_nothing" });
  assert.equal(again.name, "js echo");
});
await check("assistants.update", async () => {
  const updated = await client.assistants.update(made.assistant_id, { name: "js echo 2", metadata: { more: 1 } });
  assert.equal(updated.version, 2);
  assert.deepEqual(updated.metadata, { js: "made", more: 1 });
});
await check("assistants.getVersions", async () => {
  const versions = await client.assistants.getVersions(made.assistant_id);
  assert.deepEqual(versions.map((v) => v.version), [2, 1]);
});
await check("assistants.setLatest", async () => {
  const back = await client.assistants.setLatest(made.assistant_id, 1);
  assert.equal(back.version, 1);
  assert.equal(back.name, "js echo");
});
await check("assistants.search (includePagination, sortBy)", async () => {
  const page = await client.assistants.search({ metadata: { js: "made" }, sortBy: "name", includePagination: true });
  assert.deepEqual(page.assistants.map((a) => a.assistant_id), [made.assistant_id]);
  assert.equal(page.next, null);
});
await check("assistants.getSubgraphs (namespace)", async () => {
  assert.deepEqual(await client.assistants.getSubgraphs(made.assistant_id, { namespace: "tools", recurse: true }), {});
});
await check("runs.wait (a created assistant)", async () => {
  const thread = await client.threads.create();
  const values = await client.runs.wait(thread.thread_id, made.assistant_id, { input: user("made") });
  assert.equal(last(values), "echo: made");
  assert.equal((await client.threads.get(thread.thread_id)).metadata.assistant_id, made.assistant_id);
});
await check("assistants.delete", async () => {
  await client.assistants.delete(made.assistant_id, { deleteThreads: true });
  await assert.rejects(client.assistants.get(made.assistant_id), /404|not found/i);
});

// -- threads ----------------------------------------------------------------------------------------
const thread = await client.threads.create({ metadata: { js: "yes" } });
const tid = thread.thread_id;
await check("threads.create", async () => {
  assert.equal(thread.status, "idle");
  const again = await client.threads.create({ threadId: tid, ifExists: "do_nothing" });
  assert.equal(again.thread_id, tid);
});
await check("threads.get", async () => assert.equal((await client.threads.get(tid)).metadata.js, "yes"));
await check("threads.update", async () => {
  assert.equal((await client.threads.update(tid, { metadata: { more: 1 } })).metadata.more, 1);
});
await check("threads.search", async () => {
  const found = await client.threads.search({ metadata: { js: "yes" }, select: ["thread_id", "status"] });
  assert.deepEqual(found, [{ thread_id: tid, status: "idle" }]);
  await client.threads.search({ sortBy: "state_updated_at", sortOrder: "desc" });
});
await check("threads.count", async () => assert.equal(await client.threads.count({ metadata: { js: "yes" } }), 1));

// -- runs -------------------------------------------------------------------------------------------
await check("runs.wait", async () => {
  assert.equal(last(await client.runs.wait(tid, "calc", { input: user("2+3?") })), "the answer is 5");
});
await check("runs.wait (stateless)", async () => {
  assert.equal(last(await client.runs.wait(null, "echo", { input: user("hi") })), "echo: hi");
});
await check("runs.wait (recursion_limit)", async () => {
  await assert.rejects(client.runs.wait(null, "looper", { input: user("go"), config: { recursion_limit: 3 } }),
    /GraphRecursionError/);
});
await check("runs.stream", async () => {
  const parts = await collect(client.runs.stream(tid, "calc", {
    input: user("again"), streamMode: ["values", "updates", "messages-tuple"] }));
  assert.equal(parts[0].event, "metadata");
  const events = new Set(parts.map((p) => p.event));
  for (const mode of ["values", "updates", "messages"]) assert.ok(events.has(mode), mode);
});
await check("runs.stream (stateless, subgraphs)", async () => {
  const parts = await collect(client.runs.stream(null, "delegator", {
    input: user("look"), streamMode: ["updates"], streamSubgraphs: true }));
  assert.ok(parts.some((p) => p.event.startsWith("updates|tools:")), parts.map((p) => p.event).join());
});
await check("runs.stream (onRunCreated)", async () => {
  let created;
  await collect(client.runs.stream(tid, "echo", { input: user("x"), onRunCreated: (meta) => { created = meta; } }));
  assert.equal(created.thread_id, tid);
  assert.ok(created.run_id);
});
await check("runs.create + join", async () => {
  const run = await client.runs.create(tid, "echo", { input: user("joined") });
  assert.equal(last(await client.runs.join(tid, run.run_id)), "echo: joined");
});
await check("runs.joinStream", async () => {
  const run = await client.runs.create(tid, "slow", { input: user("follow"), streamResumable: true });
  const parts = await collect(client.runs.joinStream(tid, run.run_id, { streamMode: ["values", "updates"] }));
  const events = new Set(parts.map((p) => p.event));
  assert.ok(events.has("values") && events.has("updates"), [...events].join());
});
await check("runs.list", async () => {
  const runs = await client.runs.list(tid, { limit: 3, select: ["run_id", "status"] });
  assert.equal(runs.length, 3);
  assert.deepEqual(Object.keys(runs[0]).sort(), ["run_id", "status"]);
});
await check("runs.get", async () => {
  const [run] = await client.runs.list(tid, { limit: 1 });
  assert.equal((await client.runs.get(tid, run.run_id)).run_id, run.run_id);
});
await check("runs.cancel", async () => {
  const run = await client.runs.create(tid, "glacial", { input: user("slowly") });
  await untilStatus(tid, run.run_id, "running");
  await client.runs.cancel(tid, run.run_id, true);
  assert.equal((await client.runs.get(tid, run.run_id)).status, "interrupted");
  assert.equal((await client.threads.get(tid)).status, "idle");
});
await check("runs.delete", async () => {
  const run = await client.runs.create(tid, "echo", { input: user("doomed") });
  await client.runs.join(tid, run.run_id);
  await client.runs.delete(tid, run.run_id);
  await assert.rejects(client.runs.get(tid, run.run_id), /404|not found/i);
});
await check("runs.createBatch", async () => {
  const runs = await client.runs.createBatch([
    { assistantId: "echo", input: user("one"), on_completion: "keep" },
    { assistantId: "echo", input: user("two"), on_completion: "keep" },
  ]);
  assert.equal(runs.length, 2);
  assert.notEqual(runs[0].thread_id, runs[1].thread_id);
  assert.equal(last(await client.runs.join(runs[1].thread_id, runs[1].run_id)), "echo: two");
});
await check("runs.cancelMany", async () => {
  const run = await client.runs.create(tid, "glacial", { input: user("many") });
  await untilStatus(tid, run.run_id, "running");
  await client.runs.cancelMany({ threadId: tid, runIds: [run.run_id], action: "interrupt" });
  await untilStatus(tid, run.run_id, "interrupted");
  await assert.rejects(client.runs.cancelMany({ threadId: tid, runIds: [crypto.randomUUID()] }), /404|no runs/i);
});

// -- interrupts, commands and state ---------------------------------------------------------------
const mail = (await client.threads.create()).thread_id;
await check("runs.wait (interrupt, then resume beside an empty input)", async () => {
  const paused = await client.runs.wait(mail, "mailer", { input: user("hello Ada") });
  assert.equal(paused.__interrupt__[0].value.action_requests[0].name, "send_email");
  assert.equal((await client.threads.get(mail)).status, "interrupted");
  const done = await client.runs.wait(mail, "mailer", {
    input: {}, command: { resume: { decisions: [{ type: "approve" }] }, goto: [] } });
  assert.equal(last(done), "done: sent to ada@example.com: hello Ada");
});
await check("threads.getState", async () => {
  const state = await client.threads.getState(mail);
  assert.equal(last(state.values), "done: sent to ada@example.com: hello Ada");
  const picked = await client.threads.getState(mail, undefined, { select: ["values.messages"] });
  assert.deepEqual(Object.keys(picked), ["values"]);
});
await check("threads.getHistory", async () => {
  const history = await client.threads.getHistory(mail, { limit: 3 });
  assert.equal(history.length, 3);
  const older = await client.threads.getHistory(mail, { limit: 2, before: history[0].checkpoint });
  assert.equal(older[0].checkpoint.checkpoint_id, history[1].checkpoint.checkpoint_id);
  const byConfig = await client.threads.getHistory(mail, {
    limit: 1, before: { configurable: { checkpoint_id: history[0].checkpoint.checkpoint_id } } });
  assert.equal(byConfig[0].checkpoint.checkpoint_id, history[1].checkpoint.checkpoint_id);
});
await check("threads.getState (at a checkpoint)", async () => {
  const [, second] = await client.threads.getHistory(mail, { limit: 2 });
  const byId = await client.threads.getState(mail, second.checkpoint.checkpoint_id);
  const byConfig = await client.threads.getState(mail, second.checkpoint);
  assert.equal(byId.checkpoint.checkpoint_id, second.checkpoint.checkpoint_id);
  assert.equal(byConfig.checkpoint.checkpoint_id, second.checkpoint.checkpoint_id);
});
await check("threads.updateState", async () => {
  const written = await client.threads.updateState(mail, { values: { messages: [{ role: "user", content: "noted" }] } });
  assert.ok(written.checkpoint.checkpoint_id);
  assert.equal(last((await client.threads.getState(mail)).values), "noted");
});
await check("threads.copy", async () => {
  const copy = await client.threads.copy(mail);
  assert.notEqual(copy.thread_id, mail);
  assert.equal(last((await client.threads.getState(copy.thread_id)).values), "noted");
});
await check("threads.delete", async () => {
  const doomed = await client.threads.create();
  await client.threads.delete(doomed.thread_id);
  await assert.rejects(client.threads.get(doomed.thread_id), /404|not found/i);
});

await check("threads.joinStream (every run of the thread)", async () => {
  const followed = (await client.threads.create()).thread_id;
  const abort = new AbortController();
  const seen = [];
  const following = (async () => {
    try {
      for await (const part of client.threads.joinStream(followed, { signal: abort.signal })) seen.push(part);
    } catch (error) {
      if (error?.name !== "AbortError") throw error;
    }
  })();
  await sleep(300);
  const run = await client.runs.create(followed, "echo", { input: user("followed") });
  for (let i = 0; i < 200 && !seen.some((p) => p.data?.status === "run_done"); i += 1) await sleep(25);
  abort.abort();
  await following;
  assert.equal(seen[0].event, "metadata");
  assert.equal(seen[0].data.run_id, run.run_id);
  assert.ok(seen.some((p) => p.event === "values"));
  assert.deepEqual(seen.at(-1).data, { status: "run_done", run_id: run.run_id });
});

await check("threads.create + update with ttl, get with include ttl", async () => {
  const lived = (await client.threads.create({ ttl: 60 })).thread_id;
  const ttl = (await client.threads.get(lived, { include: ["ttl"] })).ttl;
  assert.equal(ttl.strategy, "delete");
  assert.equal(ttl.ttl_minutes, 60);
  assert.ok(new Date(ttl.expires_at) > new Date());
  await client.threads.update(lived, { metadata: { ttl: "changed" }, ttl: { ttl: 30, strategy: "keep_latest" } });
  const changed = (await client.threads.get(lived, { include: ["ttl"] })).ttl;
  assert.deepEqual([changed.strategy, changed.ttl_minutes], ["keep_latest", 30]);
});
await check("threads.prune", async () => {
  const [gone, kept] = [(await client.threads.create()).thread_id, (await client.threads.create()).thread_id];
  for (const id of [gone, kept]) {
    await client.runs.wait(id, "echo", { input: user("one") });
    await client.runs.wait(id, "echo", { input: user("two") });
  }
  assert.deepEqual(await client.threads.prune([gone]), { pruned_count: 1 });
  await assert.rejects(client.threads.get(gone), /404|not found/i);
  assert.deepEqual(await client.threads.prune([kept], { strategy: "keep_latest" }), { pruned_count: 1 });
  assert.equal((await client.threads.getHistory(kept, { limit: 10 })).length, 1);
  assert.equal(last((await client.threads.getState(kept)).values), "echo: two");
  assert.equal(last(await client.runs.wait(kept, "echo", { input: user("three") })), "echo: three");
});

// -- crons ------------------------------------------------------------------------------------------
let jsCron;
await check("crons.createForThread", async () => {
  const cronThread = (await client.threads.create()).thread_id;
  jsCron = await client.crons.createForThread(cronThread, "echo", {
    schedule: "* * * * * *", input: user("tick"), metadata: { js: "cron" } });
  assert.equal(jsCron.thread_id, cronThread);
  assert.equal(jsCron.schedule, "* * * * * *");
  for (let i = 0; i < 120 && (await client.runs.list(cronThread)).length === 0; i += 1) await sleep(25);
  const [run] = await client.runs.list(cronThread);
  assert.equal(run.metadata.cron_id, jsCron.cron_id);
});
await check("crons.create", async () => {
  const cron = await client.crons.create("echo", {
    schedule: "0 9 * * 1", timezone: "Europe/Paris", onRunCompleted: "keep", enabled: false, metadata: { js: "cron" } });
  assert.equal(cron.thread_id, null);
  assert.equal(cron.on_run_completed, "keep");
  assert.equal(cron.enabled, false);
});
await check("crons.search", async () => {
  const found = await client.crons.search({ metadata: { js: "cron" }, sortBy: "created_at", sortOrder: "asc" });
  assert.deepEqual(found.map((c) => c.cron_id)[0], jsCron.cron_id);
  assert.equal(found.length, 2);
});
await check("crons.count", async () => assert.equal(await client.crons.count({ metadata: { js: "cron" } }), 2));
await check("crons.update", async () => {
  const updated = await client.crons.update(jsCron.cron_id, { schedule: "0 10 * * *", enabled: false });
  assert.equal(updated.schedule, "0 10 * * *");
  assert.equal(updated.enabled, false);
});
await check("crons.delete", async () => {
  for (const cron of await client.crons.search({ metadata: { js: "cron" } })) await client.crons.delete(cron.cron_id);
  assert.equal(await client.crons.count({ metadata: { js: "cron" } }), 0);
});

// -- the v2 thread stream (threads.stream: commands and protocol events) ------------------------------
for (const transport of ["sse", "websocket"]) {
  await check(`threads.stream (${transport}): run.start, messages, toolCalls, values, output`, async () => {
    const thread = client.threads.stream({ assistantId: "calc", transport });
    try {
      const messages = [];
      const calls = [];
      const readMessages = (async () => { for await (const m of thread.messages) messages.push(m); })();
      const readCalls = (async () => { for await (const c of thread.toolCalls) calls.push(c); })();
      const run = await thread.run.start({ input: user("add") });
      assert.ok(run.run_id);
      const output = await thread.output;
      assert.equal(last(output), "the answer is 5");
      await Promise.race([Promise.all([readMessages, readCalls]), sleep(3000)]);
      // the SDK yields a call's handle when it starts and again when it finishes
      const distinct = [...new Map(calls.map((c) => [c.callId, c])).values()];
      assert.deepEqual(distinct.map((c) => [c.name, c.input]), [["add", { a: 2, b: 3 }]]);
      assert.equal(await distinct[0].output, "5");  // the tool's result, unwrapped from its message
      assert.ok((await Promise.all(messages.map((m) => m.text))).includes("the answer is 5"));
    } finally {
      await thread.close();
    }
  });
}
await check("threads.stream: an interrupt, answered with input.respond", async () => {
  const thread = client.threads.stream({ assistantId: "mailer" });
  try {
    await thread.run.start({ input: user("hello") });
    for (let i = 0; i < 200 && !thread.interrupted; i += 1) await sleep(25);
    assert.ok(thread.interrupted);
    const [asked] = thread.interrupts;
    assert.equal(asked.payload.action_requests[0].name, "send_email");
    await thread.input.respond({ interrupt_id: asked.interruptId, namespace: [], response: { decisions: [{ type: "approve" }] } });
    for (let i = 0; i < 200 && (await client.threads.get(thread.threadId)).status !== "idle"; i += 1) await sleep(25);
    const state = await client.threads.getState(thread.threadId);
    assert.equal(last(state.values), "done: sent to ada@example.com: hello");
  } finally {
    await thread.close();
  }
});
await check("threads.stream: agent.getTree of a run with a subagent", async () => {
  const thread = client.threads.stream({ assistantId: "delegator" });
  try {
    await thread.run.start({ input: user("a job") });
    assert.equal(last(await thread.output), "the helper said: helped with a job");
    const { tree } = await thread.agent.getTree();
    assert.equal(tree.status, "completed");
    assert.equal(tree.children[0].graph_name, "helper");
  } finally {
    await thread.close();
  }
});

// -- store ------------------------------------------------------------------------------------------
await check("store.putItem with ttl + getItem/searchItems with refreshTtl", async () => {
  await client.store.putItem(["js", "ttl"], "note", { text: "expiring" }, { ttl: 5 });
  assert.deepEqual((await client.store.getItem(["js", "ttl"], "note", { refreshTtl: false })).value,
    { text: "expiring" });
  const { items } = await client.store.searchItems(["js", "ttl"], { refreshTtl: true });
  assert.deepEqual(items.map((i) => i.key), ["note"]);
  await client.store.deleteItem(["js", "ttl"], "note");
});
await check("store.putItem + getItem", async () => {
  await client.store.putItem(["js", "prefs"], "theme", { color: "dark" });
  assert.deepEqual((await client.store.getItem(["js", "prefs"], "theme")).value, { color: "dark" });
});
await check("store.searchItems", async () => {
  const { items } = await client.store.searchItems(["js"], { filter: { color: "dark" } });
  assert.deepEqual(items.map((i) => i.key), ["theme"]);
});
await check("store.listNamespaces", async () => {
  const { namespaces } = await client.store.listNamespaces({ prefix: ["js"] });
  assert.deepEqual(namespaces, [["js", "prefs"]]);
});
await check("store.deleteItem", async () => {
  await client.store.deleteItem(["js", "prefs"], "theme");
  assert.equal(await client.store.getItem(["js", "prefs"], "theme"), null);
});

process.exit(failures);
