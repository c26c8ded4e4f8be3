// A chat page built with the LangGraph SDK's React hook, useStream, as LangGraph UIs are: bundled with esbuild at test
// time and served from another origin than the server (?api=<server url>&assistant=<assistant id>).
// Test hooks: window.__aiTexts (every text the last AI message showed, to see it stream) and the DOM below.
import React, { useEffect, useRef, useState } from "react";
import { createRoot } from "react-dom/client";
import { useStream } from "@langchain/langgraph-sdk/react";

const query = new URLSearchParams(window.location.search);
const apiUrl = query.get("api");
const assistantId = query.get("assistant");
window.__aiTexts = [];
window.__errors = [];

const textOf = (message) =>
  typeof message.content === "string" ? message.content : message.content.map((b) => b.text ?? "").join("");

function App() {
  const [threadId, setThreadId] = useState(null);
  const [prompt, setPrompt] = useState("");
  const ours = useRef(new Set()); // runs this page started: the others (wake-ups) are joined when they start
  const stream = useStream({
    apiUrl,
    assistantId,
    threadId,
    onThreadId: setThreadId,
    messagesKey: "messages",
    filterSubagentMessages: true,
    onCreated: (run) => ours.current.add(run.run_id),
    onError: (error) => window.__errors.push(String(error)),
  });
  const joinRef = useRef(stream.joinStream);
  joinRef.current = stream.joinStream;

  // Runs nobody here started (a background result waking the thread) are followed as they start.
  useEffect(() => {
    if (!threadId) return undefined;
    const abort = new AbortController();
    (async () => {
      try {
        for await (const part of stream.client.threads.joinStream(threadId, {
          streamMode: "lifecycle", signal: abort.signal })) {
          const runId = part.data?.run_id;
          if (part.event === "metadata" && part.data.attempt && !ours.current.has(runId)) {
            ours.current.add(runId);
            joinRef.current(runId);
          }
        }
      } catch (error) {
        if (error?.name !== "AbortError") window.__errors.push(String(error));
      }
    })();
    return () => abort.abort();
  }, [threadId, stream.client]);

  const messages = stream.messages;
  const lastAi = [...messages].reverse().find((m) => m.type === "ai");
  useEffect(() => {
    if (lastAi && textOf(lastAi)) window.__aiTexts.push(textOf(lastAi));
  });

  const send = () => {
    stream.submit({ messages: [{ type: "human", content: prompt }] },
      { streamSubgraphs: true, streamMode: ["values", "messages-tuple", "updates"] });
    setPrompt("");
  };
  const approve = () =>
    stream.submit({}, { command: { resume: { decisions: [{ type: "approve" }] } } });

  return (
    <main>
      <div id="thread" data-thread-id={threadId ?? ""} data-loading={String(stream.isLoading)} />
      <div id="messages">
        {messages.map((m, i) => (
          <div key={m.id ?? i} className={`msg ${m.type}`} data-id={m.id}>{textOf(m)}</div>
        ))}
      </div>
      <div id="subagents">
        {[...stream.subagents.values()].map((s) => (
          <div key={s.id} className="subagent" data-status={s.status} data-type={s.toolCall.args.subagent_type}>
            {s.messages.map((m) => textOf(m)).join(" | ")}
          </div>
        ))}
      </div>
      {stream.interrupt ? <button id="approve" onClick={approve}>Approve</button> : null}
      <input id="prompt" value={prompt} onChange={(e) => setPrompt(e.target.value)} />
      <button id="send" onClick={send}>Send</button>
    </main>
  );
}

createRoot(document.getElementById("root")).render(<App />);
